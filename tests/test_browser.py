"""End to end in a real browser: JupyterLab + headless Chromium run notebook 01 like a learner.

It starts JupyterLab (token auth, 127.0.0.1 only, a free port, throw-away Jupyter dirs), opens a
copy of `notebooks/01_data_loading.ipynb` in Debian's Chromium driven by Playwright, runs all
cells from the Run menu in the smoke profile, and checks what a learner would see: no cell
shows an error, a plot image renders, the ipywidgets controls of the explore section render,
and changing a control re-runs the experiment and replaces the plot. Screenshots go to
`build/browser/`.

Skipped, with the reason, when Chromium (`apt-get install chromium`) or Playwright is missing.
"""

from __future__ import annotations

import os
import re
import shutil
import time
from pathlib import Path

import pytest

from helpers import paths
from tests.lab_server import LabServer

ROOT = paths.ROOT
NOTEBOOK = ROOT / "notebooks" / "01_data_loading.ipynb"
CHROMIUM = Path(os.environ.get("FTG_CHROMIUM", "/usr/bin/chromium"))
# Read at import, before conftest points FTG_BUILD_DIR at a per-test temporary folder:
# the screenshots are for people, so they go to the real build folder.
SHOTS = paths.build_dir() / "browser"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
RUN_TIMEOUT_MS = 240_000  # the whole notebook in the smoke profile (about 35 s on 2 idle cores)

if not CHROMIUM.exists():
    pytest.skip(f"browser test skipped: Chromium not found at {CHROMIUM}. Install Debian's "
                "`chromium` package (`sudo apt-get install -y chromium`; .ci/run does this) "
                "or point FTG_CHROMIUM at a Chromium binary.", allow_module_level=True)
sync_api = pytest.importorskip(
    "playwright.sync_api",
    reason="browser test skipped: the `playwright` Python package is missing "
           "(`pip install -r requirements-dev.txt`)")

# JavaScript run in the page (JupyterLab exposes its app object as `window.jupyterapp` with
# --LabApp.expose_app_in_browser). The checks read the notebook *model*, not only the DOM.
JS_PANEL = "(() => { const w = window.jupyterapp && window.jupyterapp.shell.currentWidget; " \
           "return w && w.content && w.content.model ? w : null; })()"
JS_KERNEL_IDLE = f"""() => {{
  const w = {JS_PANEL};
  const k = w && w.sessionContext.session && w.sessionContext.session.kernel;
  return !!k && k.status === 'idle';
}}"""
JS_ALL_RAN = f"""() => {{
  const w = {JS_PANEL};
  if (!w) return false;
  const cells = Array.from(w.content.model.cells).filter(c => c.type === 'code');
  const k = w.sessionContext.session && w.sessionContext.session.kernel;
  return cells.length > 0 && cells.every(c => c.executionCount !== null)
         && !!k && k.status === 'idle';
}}"""
JS_ERRORS = f"""() => {{
  const w = {JS_PANEL};
  const out = [];
  Array.from(w.content.model.cells).forEach((c, i) => {{
    if (c.type !== 'code') return;
    for (let j = 0; j < c.outputs.length; j++) {{
      const o = c.outputs.get(j).toJSON();
      if (o.output_type === 'error') out.push(`cell ${{i}}: ${{o.ename}}: ${{o.evalue}}`);
    }}
  }});
  return out;
}}"""
JS_CODE_CELLS = f"() => Array.from({JS_PANEL}.content.model.cells).filter(c => c.type === 'code').length"
# A plot that really rendered: an <img> in an output area, loaded, with a size.
JS_RENDERED_IMAGES = """(sel) => Array.from(document.querySelectorAll(sel))
  .filter(img => img.complete && img.naturalWidth > 50).map(img => img.src)"""


@pytest.fixture
def lab(tmp_path):
    """JupyterLab on a copy of notebook 01 (the source is never written); stopped whatever happens."""
    work = tmp_path / "lab"
    work.mkdir()
    shutil.copy(NOTEBOOK, work / NOTEBOOK.name)
    SHOTS.mkdir(parents=True, exist_ok=True)
    env = {
        "FTG_PROFILE": "smoke",  # the kernel inherits the server's environment
        "FTG_OFFLINE": "1",
        "FTG_BUILD_DIR": str(tmp_path / "build"),
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        "MPLBACKEND": "module://matplotlib_inline.backend_inline",  # make test exports Agg
    }
    server = LabServer(work, env=env, log_path=tmp_path / "jupyterlab.log")
    try:
        server.start()
        yield server
    finally:
        log = server.log_tail(60)
        server.stop()
        (SHOTS / "jupyterlab.log").write_text(log)


@pytest.fixture
def page(lab):
    """A headless Chromium page; the browser is closed whatever happens."""
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS,
                                     headless=True)
        try:
            pg = browser.new_page(viewport={"width": 1280, "height": 900})
            pg.set_default_timeout(60_000)
            yield pg
        finally:
            browser.close()


def _shot(pg, name: str) -> Path:
    path = SHOTS / f"{NOTEBOOK.stem}_{name}.png"
    pg.screenshot(path=str(path))
    return path


@pytest.mark.timeout(420)
def test_notebook_01_runs_and_its_widgets_work_in_chromium(lab, page):
    t0 = time.perf_counter()
    page.goto(lab.url(f"lab/tree/{NOTEBOOK.name}"))
    page.wait_for_selector(".jp-NotebookPanel .jp-Cell")
    page.wait_for_function(JS_KERNEL_IDLE)
    # More room for the notebook in the screenshots: fold the file browser away.
    page.evaluate("window.jupyterapp.commands.execute('application:toggle-left-area')")
    n_code = page.evaluate(JS_CODE_CELLS)
    assert n_code > 5, f"the notebook opened with only {n_code} code cells"

    # Run it the way a learner does: Run menu -> Run All Cells.
    page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(r"^Run$")).click()
    page.locator(".lm-Menu-itemLabel", has_text=re.compile(r"^Run All Cells$")).click()
    try:
        page.wait_for_function(JS_ALL_RAN, timeout=RUN_TIMEOUT_MS, polling=500)
    except sync_api.TimeoutError:
        _shot(page, "timeout")
        pytest.fail(f"the notebook did not finish within {RUN_TIMEOUT_MS / 1000:.0f} s; "
                    f"errors so far: {page.evaluate(JS_ERRORS)}\nserver log:\n{lab.log_tail()}")
    ran_s = time.perf_counter() - t0

    errors = page.evaluate(JS_ERRORS)
    shown = page.locator(".jp-OutputArea-output", has_text="Traceback (most recent call last)")
    if errors or shown.count():
        _shot(page, "error")
    assert not errors, f"cells ended in an error: {errors}"
    assert shown.count() == 0, "a traceback is shown in an output"

    images = page.evaluate(JS_RENDERED_IMAGES, ".jp-OutputArea-output img")
    assert images, "no plot image rendered in any output"

    # The explore section: interact() renders a slider, a dropdown and an output with the plot.
    interact = page.locator(".widget-interact").last
    interact.scroll_into_view_if_needed()
    slider = interact.locator(".widget-slider").first
    dropdown = interact.locator(".widget-dropdown select").first
    sync_api.expect(slider, "the explore slider did not render").to_be_visible()
    sync_api.expect(dropdown, "the explore dropdown did not render").to_be_visible()
    plot_sel = ".widget-interact .widget-output img"
    page.wait_for_function(f"() => ({JS_RENDERED_IMAGES})('{plot_sel}').length > 0")
    before = page.evaluate(JS_RENDERED_IMAGES, plot_sel)
    _shot(page, "explore_before")

    # Move a control: a new resize target re-runs the experiment; its plot must replace the old.
    options = dropdown.locator("option").all_inner_texts()
    current = dropdown.input_value()
    new_value = next(o for o in options if o.strip() != current.strip())
    dropdown.select_option(label=new_value)
    page.wait_for_function(
        """([sel, old]) => { const now = Array.from(document.querySelectorAll(sel))
             .filter(i => i.complete && i.naturalWidth > 50).map(i => i.src);
           return now.length > 0 && now.some(s => !old.includes(s)); }""",
        arg=[plot_sel, before], timeout=120_000, polling=500)
    page.wait_for_function(JS_KERNEL_IDLE)
    after = page.evaluate(JS_RENDERED_IMAGES, plot_sel)
    assert after and after != before, "changing the dropdown did not update the plot"
    assert not page.evaluate(JS_ERRORS), "changing a control produced an error"
    assert interact.locator(".jp-OutputArea-output", has_text="Traceback").count() == 0
    shot = _shot(page, "explore_after")
    total_s = time.perf_counter() - t0
    print(f"\nbrowser test: notebook ran in {ran_s:.0f} s, whole check {total_s:.0f} s; "
          f"screenshot {shot}")

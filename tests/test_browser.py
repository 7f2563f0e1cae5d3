"""End to end in a real browser: every notebook, run like a learner in JupyterLab + headless
Chromium, and the skip-then-re-run pass in the same kernel.

One JupyterLab server, started as `make lab` starts it (`helpers.suite.lab`: same command line, the
test's own environment passed on unchanged, token auth, 127.0.0.1 only), serves copies of all
notebooks; one Chromium page runs them in sequence from the Run menu (smoke profile). For each
notebook it checks what a learner would see: no cell shows an error, at least as many plot
images render as the notebook records figures (its results file), every explore section
renders its controls, and moving one control re-runs the experiment and replaces its plot.
It also checks that no "news" notification greets the learner. Screenshots go to
`build/browser/`.

Before Run All, the notebook's kernel (JupyterLab's own, reached through its connection file)
runs every cell but the Explore sections: Run All is then the second pass of
`tests/learner_passes.py` (skip, then re-run everything), which checks the thread counts and the
setup's settings of both passes, so CI executes each notebook once less than with two tests.

Skipped, with the reason, when Chromium (`apt-get install chromium`) or Playwright is missing.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import nbformat
import pytest
from jupyter_client import BlockingKernelClient

from helpers import paths
from helpers.suite import runner
from tests import learner_passes
from tests.lab_server import LabServer

# A learner pass (every notebook in JupyterLab): `make test-learner`, which .ci/run calls after
# `make test`, keeping `make test` within its time budget.
pytestmark = pytest.mark.learner

ROOT = paths.ROOT
NOTEBOOKS = runner.notebook_paths()
CHROMIUM = learner_passes.CHROMIUM
# Read at import, before conftest points FTG_BUILD_DIR at a per-test temporary folder:
# the screenshots are for people, so they go to the real build folder.
SHOTS = paths.build_dir() / "browser"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
RUN_TIMEOUT_MS = (
    780_000  # one notebook, smoke profile: the slowest takes about 40 s on 2 idle cores
)
REDRAW_TIMEOUT_MS = 120_000

if not CHROMIUM.exists():
    pytest.skip(
        f"browser test skipped: Chromium not found at {CHROMIUM}. Install Debian's "
        "`chromium` package (`sudo apt-get install -y chromium`; .ci/run does this) "
        "or point FTG_CHROMIUM at a Chromium binary.",
        allow_module_level=True,
    )
sync_api = pytest.importorskip(
    "playwright.sync_api",
    reason="browser test skipped: the `playwright` Python package is missing "
    "(`pip install -r requirements-dev.txt`)",
)

# JavaScript run in the page (JupyterLab exposes its app object as `window.jupyterapp` with
# --LabApp.expose_app_in_browser). The checks read the notebook *model*, not only the DOM.
JS_PANEL = (
    "(() => { const w = window.jupyterapp && window.jupyterapp.shell.currentWidget; "
    "return w && w.sessionContext && w.content && w.content.model && w.content.model.cells "
    "? w : null; })()"
)
JS_OPENED = f"""(name) => {{
  const w = {JS_PANEL};
  const k = w && w.context && w.context.path.endsWith(name) && w.sessionContext.session
            && w.sessionContext.session.kernel;
  return !!k && k.status === 'idle' && w.node.querySelectorAll('.jp-Cell').length > 0;
}}"""
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
  // Run All stops at a cell's error: then the cells below never run, and waiting is pointless
  const failed = cells.some(c => Array.from({{length: c.outputs.length}},
                                            (_, j) => c.outputs.get(j).toJSON())
                                       .some(o => o.output_type === 'error'));
  return cells.length > 0 && (failed || cells.every(c => c.executionCount !== null))
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
JS_CODE_CELLS = (
    f"() => Array.from({JS_PANEL}.content.model.cells).filter(c => c.type === 'code').length"
)
# A plot that really rendered: an <img> in an output area of the open notebook, loaded, with a size.
JS_RENDERED_IMAGES = f"""(sel) => Array.from({JS_PANEL}.node.querySelectorAll(sel))
  .filter(img => img.complete && img.naturalWidth > 50).map(img => img.src)"""
# Close the notebook without a save prompt and shut its kernel down (its workers go with it).
JS_CLOSE = f"""async () => {{
  const w = {JS_PANEL};
  if (!w) return;
  await w.sessionContext.shutdown();
  w.dispose();
}}"""


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """JupyterLab on copies of the notebooks (the sources are never written); stopped whatever
    happens."""
    tmp = tmp_path_factory.mktemp("browser")
    work = tmp / "lab"
    work.mkdir()
    for nb in NOTEBOOKS:
        shutil.copy(nb, work / nb.name)
    SHOTS.mkdir(parents=True, exist_ok=True)
    # What a learner would type: `FTG_PROFILE=smoke make lab`. The environment is this process's
    # own (under `make test`, what the Makefile exports), plus the smoke profile, offline data and
    # a throw-away build folder; no matplotlib backend is set or removed.
    env = {
        "FTG_PROFILE": "smoke",
        "FTG_OFFLINE": "1",
        "FTG_BUILD_DIR": str(tmp / "build"),
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    server = LabServer(work, env=env, log_path=tmp / "jupyterlab.log")
    server.results = tmp / "build" / "results"
    try:
        server.start()
        yield server
    finally:
        log = server.log_tail(80)
        server.stop()
        (SHOTS / "jupyterlab.log").write_text(log)


@pytest.fixture(scope="module")
def page(lab):
    """One headless Chromium page for all notebooks; the browser is closed whatever happens."""
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(
            executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True
        )
        try:
            pg = browser.new_page(viewport={"width": 1280, "height": 900})
            pg.set_default_timeout(60_000)
            pg.goto(lab.url("lab"))
            pg.wait_for_function("() => !!(window.jupyterapp && window.jupyterapp.shell)")
            pg.wait_for_selector(".jp-LabShell")
            # More room for the notebook in the screenshots: fold the file browser away.
            pg.evaluate(
                "() => window.jupyterapp.restored.then(() => { "
                "window.jupyterapp.commands.execute('application:toggle-left-area'); })"
            )
            yield pg
        finally:
            browser.close()


def _shot(pg, stem: str, name: str) -> Path:
    path = SHOTS / f"{stem}_{name}.png"
    pg.screenshot(path=str(path))
    return path


def _explore_sections(nb: Path) -> int:
    """How many explore sections (interact() calls) the notebook's code makes."""
    return sum(
        "interact(" in "".join(c["source"])
        for c in json.loads(nb.read_text())["cells"]
        if c["cell_type"] == "code"
    )


def _move_a_control(interact) -> str:
    """Change the first dropdown with a choice (else nudge the first slider); return what was
    changed."""
    # a dropdown may offer one option on this device (notebook 11 offers only the switches it has)
    choices = [
        d
        for d in interact.locator(".widget-dropdown select").all()
        if d.locator("option").count() > 1
    ]
    if choices:
        dropdown = choices[0]
        options = dropdown.locator("option").all_inner_texts()
        current = dropdown.evaluate("s => s.options[s.selectedIndex].text")
        new = next(o for o in options if o.strip() != current.strip())
        dropdown.select_option(label=new)
        return f"dropdown {current!r} -> {new!r}"
    handle = interact.locator(".widget-slider .noUi-handle").first
    handle.focus()
    handle.press("ArrowRight")
    return "slider one step right"


def _run_all_cells(nb, lab, page) -> None:
    """Run it the way a learner does: Run menu -> Run All Cells; no cell may end in an error."""
    page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(r"^Run$")).click()
    page.locator(".lm-Menu-itemLabel", has_text=re.compile(r"^Run All Cells$")).click()
    try:
        page.wait_for_function(JS_ALL_RAN, timeout=RUN_TIMEOUT_MS, polling=500)
    except sync_api.TimeoutError:
        _shot(page, nb.stem, "timeout")
        pytest.fail(
            f"{nb.name} did not finish within {RUN_TIMEOUT_MS / 1000:.0f} s; "
            f"errors so far: {page.evaluate(JS_ERRORS)}\nserver log:\n{lab.log_tail()}"
        )
    # Error outputs in the notebook model (not text: notebook 18 prints a rank's traceback on
    # purpose).
    errors = page.evaluate(JS_ERRORS)
    if errors:
        _shot(page, nb.stem, "error")
    assert not errors, f"{nb.name}: cells ended in an error: {errors}"
    assert "official Jupyter news" not in page.inner_text("body"), (
        "JupyterLab greets the learner with the news notification"
    )


def _figures_on_screen(nb, lab, page) -> tuple[int, int]:
    """Every figure the notebook recorded is on screen: (images shown, figures recorded)."""
    recorded = json.loads((lab.results / f"{nb.stem}.json").read_text())["figures"]
    images = page.evaluate(JS_RENDERED_IMAGES, ".jp-OutputArea-output img")
    first = page.locator(".jp-NotebookPanel:visible .jp-OutputArea-output img").first
    if images:
        first.scroll_into_view_if_needed()
    _shot(page, nb.stem, "figure")
    assert len(images) >= len(recorded), (
        f"{nb.name}: {len(images)} images on screen, "
        f"but the notebook records {len(recorded)} figures"
    )
    return len(images), len(recorded)


def _redraw(nb, page, interact, i: int) -> str:
    """Move one control of explore section i and wait for its plot to change: what was moved."""
    out = interact.locator(".widget-output img")
    before = out.evaluate_all(
        "imgs => imgs.filter(i => i.complete && i.naturalWidth > 50).map(i => i.src)"
    )
    assert before, f"{nb.name}: explore section {i} has no rendered plot"
    moved = _move_a_control(interact)
    handle = interact.element_handle()
    try:
        page.wait_for_function(
            """([el, old]) => { const now = Array.from(el.querySelectorAll('.widget-output img'))
                 .filter(i => i.complete && i.naturalWidth > 50).map(i => i.src);
               return now.length > 0 && now.some(s => !old.includes(s)); }""",
            arg=[handle, before],
            timeout=REDRAW_TIMEOUT_MS,
            polling=500,
        )
    except sync_api.TimeoutError:
        _shot(page, nb.stem, f"explore{i}_timeout")
        pytest.fail(
            f"{nb.name}: explore section {i}: {moved} did not redraw the plot "
            f"within {REDRAW_TIMEOUT_MS / 1000:.0f} s"
        )
    page.wait_for_function(JS_KERNEL_IDLE, timeout=REDRAW_TIMEOUT_MS)
    # an error inside the widget's output shows IPython's traceback (not in the cell's model)
    assert not interact.locator(
        ".jp-OutputArea-output", has_text="Traceback (most recent call last)"
    ).count(), f"{nb.name}: explore section {i}: {moved} ended in an error"
    return moved


def _explore_sections_redraw(nb, page) -> list[str]:
    """Every explore section (interact) renders its controls and a plot; moving one redraws it."""
    interacts = page.locator(".jp-NotebookPanel:visible .widget-interact")
    sections = _explore_sections(nb)
    assert interacts.count() == sections, (
        f"{nb.name}: {interacts.count()} explore sections rendered controls, of {sections}"
    )
    redrawn = []
    for i in range(interacts.count()):
        interact = interacts.nth(i)
        interact.scroll_into_view_if_needed()
        controls = interact.locator(
            ".widget-dropdown select, .widget-slider, .widget-checkbox input"
        )
        assert controls.count() >= 1, f"{nb.name}: explore section {i} shows no controls"
        redrawn.append(_redraw(nb, page, interact, i))
    assert not page.evaluate(JS_ERRORS), f"{nb.name}: moving a control produced an error"
    _shot(page, nb.stem, "explore")
    return redrawn


@contextlib.contextmanager
def _kernel_of(lab, page) -> Iterator[learner_passes.Run]:
    """A second client of the open notebook's kernel (JupyterLab's own: its connection file is
    in the server's runtime folder): `run(source, what)` executes there and fails on an error."""
    kernel_id = page.evaluate(f"() => {JS_PANEL}.sessionContext.session.kernel.id")
    kc = BlockingKernelClient(
        connection_file=str(lab.home / "runtime" / f"kernel-{kernel_id}.json")
    )
    kc.load_connection_file()
    kc.start_channels()

    def run(source: str, what: str) -> str:
        errors: list[str] = []
        printed: list[str] = []

        def on_output(msg: dict) -> None:
            if msg["msg_type"] == "error":
                errors.append(f"{msg['content']['ename']}: {msg['content']['evalue']}")
            elif msg["msg_type"] == "stream" and msg["content"]["name"] == "stdout":
                printed.append(msg["content"]["text"])

        reply = kc.execute_interactive(
            source, timeout=900, output_hook=on_output, allow_stdin=False, stop_on_error=False
        )
        if reply["content"]["status"] != "ok" or errors:
            pytest.fail(f"{what} failed: {errors or reply['content']}\n{source[:400]}")
        return "".join(printed)

    try:
        kc.wait_for_ready(timeout=60)
        yield run
    finally:
        kc.stop_channels()


@pytest.mark.timeout(1500)
@pytest.mark.parametrize("nb", NOTEBOOKS, ids=[p.stem.split("_")[0] for p in NOTEBOOKS])
def test_notebook_runs_shows_its_plots_and_widgets_in_chromium(nb, lab, page):
    t0 = time.perf_counter()
    page.evaluate(
        "(path) => { window.jupyterapp.commands.execute('docmanager:open', {path}); }", nb.name
    )
    source = nbformat.read(nb, as_version=4)
    try:
        page.wait_for_function(JS_OPENED, arg=nb.name)
        n_code = page.evaluate(JS_CODE_CELLS)
        assert n_code > 3, f"{nb.name} opened with only {n_code} code cells"
        with _kernel_of(lab, page) as run:
            run(learner_passes.INSTALL_PROBE, "the probe of the thread counts and settings")
            learner_passes.first_pass(source, run, nb.name)
            first_s = time.perf_counter() - t0
            _run_all_cells(nb, lab, page)  # the second pass
            ran_s = time.perf_counter() - t0 - first_s
            images, recorded = _figures_on_screen(nb, lab, page)
            redrawn = _explore_sections_redraw(nb, page)
            learner_passes.explore_above_again(source, run, nb.name)
            records = run(learner_passes.READ_PROBE, "reading the probe")
        first, second, after_setup = learner_passes.passes(source, records)
        learner_passes.check_same_state(nb.name, first, second, after_setup)
        print(
            f"\n{nb.stem}: Explore skipped in {first_s:.0f} s, Run All in {ran_s:.0f} s, whole "
            f"check {time.perf_counter() - t0:.0f} s; {images} images for {recorded} recorded "
            f"figures; redrawn: {redrawn}"
        )
    finally:
        page.evaluate(JS_CLOSE)

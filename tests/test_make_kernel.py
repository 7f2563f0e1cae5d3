"""`make kernel` registers this environment as a named kernel that another Jupyter can start.

The kernel goes to a temporary Jupyter data folder (JUPYTER_DATA_DIR), so the user's own
kernels are never touched; then a kernel started by that name imports the suite, sees the
project's torch, and draws a figure inline.
"""

import json
import shutil
import subprocess

import nbformat
import pytest
from nbclient import NotebookClient

from helpers import paths

pytestmark = pytest.mark.slow  # registers and starts a kernel

VENV_PYTHON = paths.ROOT / ".venv" / "bin" / "python"


@pytest.mark.timeout(180)
@pytest.mark.skipif(
    shutil.which("make") is None or not VENV_PYTHON.exists(),
    reason="needs GNU make and the project's .venv (make install)",
)
def test_make_kernel_registers_a_named_kernel_that_runs_the_suite(tmp_path, monkeypatch):
    monkeypatch.setenv("JUPYTER_DATA_DIR", str(tmp_path / "jupyter"))
    # A learner's own JupyterLab does not set a matplotlib backend; ours must not need one either.
    monkeypatch.delenv("MPLBACKEND", raising=False)
    # -o install: the environment is already installed (make test installs it first).
    subprocess.run(
        ["make", "-s", "-o", "install", "kernel"], cwd=paths.ROOT, check=True, timeout=120
    )
    spec = json.loads(
        (tmp_path / "jupyter" / "kernels" / "feed-the-gpu" / "kernel.json").read_text()
    )
    # the torch of the venv the kernel runs in (this test may itself run in .venv-compat)
    venv_torch = subprocess.run(
        [str(VENV_PYTHON), "-c", "from importlib.metadata import version; print(version('torch'))"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout.strip()
    assert spec["display_name"] == f"Feed the GPU (torch {venv_torch})"
    assert spec["argv"][0] == str(VENV_PYTHON) or spec["argv"][0].startswith(
        str(VENV_PYTHON.parent)
    )

    nb = nbformat.v4.new_notebook(
        cells=[
            nbformat.v4.new_code_cell(
                "import sys, torch, helpers.timing\n"
                "import matplotlib.pyplot as plt\n"
                "print(sys.prefix, torch.__version__)\n"
                "plt.plot([1, 2, 3]); plt.show()"
            )
        ]
    )
    NotebookClient(nb, timeout=120, kernel_name="feed-the-gpu").execute()
    outputs = nb.cells[0].outputs
    text = "".join(o.get("text", "") for o in outputs if o.output_type == "stream")
    assert venv_torch in text
    assert any("image/png" in o.get("data", {}) for o in outputs), (
        f"the kernel drew no inline figure: {[o.output_type for o in outputs]}"
    )

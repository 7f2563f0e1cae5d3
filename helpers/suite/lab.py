"""JupyterLab on the notebooks as `make lab` (and the browser test) starts it: loopback, its own
token, no news or update pop-up (`jupyter_config/`), `--allow-root` only as root (containers), no
matplotlib backend set (kernels draw inline).

    python -m helpers.suite.lab notebooks          # what `make lab` runs
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from ..processes import QUIET_PROFILER

CONFIG_DIR = Path(__file__).resolve().parent / "jupyter_config"


def command(root: str | Path, extra: Sequence[str] = ()) -> list[str]:
    """The JupyterLab command line for `root` (a folder); `extra` flags go last and win."""
    if not Path(root).is_dir():
        raise FileNotFoundError(f"lab.command: root {root} is not a folder")
    cmd = [
        sys.executable,
        "-m",
        "jupyterlab",
        str(root),
        "--ServerApp.ip=127.0.0.1",
        "--LabApp.news_url=None",  # announcements off at the server too, not only in the UI
        "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
    ]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        cmd.append("--allow-root")
    return [*cmd, *extra]


def environment(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """`base` (default: this process's environment) with the suite's Jupyter settings on the
    config path, and the profiler's log lines off unless `base` sets their level."""
    env = dict(os.environ if base is None else base)
    path = [str(CONFIG_DIR), *filter(None, env.get("JUPYTER_CONFIG_PATH", "").split(os.pathsep))]
    env["JUPYTER_CONFIG_PATH"] = os.pathsep.join(dict.fromkeys(path))
    return {**QUIET_PROFILER, **env}  # kernels inherit it: no profiler log lines in the outputs


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    root, extra = (args[0], args[1:]) if args and not args[0].startswith("-") else (".", args)
    cmd = command(root, extra)
    os.execve(cmd[0], cmd, environment())  # JupyterLab replaces this process: Ctrl-C goes to it


if __name__ == "__main__":
    main()

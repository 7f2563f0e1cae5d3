"""A throw-away JupyterLab server for the browser test, started as `make lab` starts it.

The command line and environment come from `helpers.suite.lab` (what `make lab` runs): loopback,
token auth, no news pop-up, `--allow-root` only as root, the caller's environment passed on
unchanged. The test adds only a port, a token it knows, and its own Jupyter folders.

    with LabServer(root=tmp_dir, env={"FTG_PROFILE": "smoke"}) as lab:
        page.goto(lab.url("lab/tree/02_data_loading.ipynb"))

Everything it writes (runtime files, config, settings, workspaces, IPython profile) goes to a
temporary folder, so it never touches the user's Jupyter set-up, and on exit it stops the server
and kills every process the server started (kernels and their DataLoader workers included).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import psutil

from helpers.suite import lab

# JupyterLab user settings for a test run: no autosave (the notebook is a copy anyway), and every
# cell in the DOM (no windowing), so the test can count the images of the whole notebook.
# Nothing else: the news pop-up must be kept away by `make lab`'s own settings.
SETTINGS = {
    "@jupyterlab/docmanager-extension/plugin.jupyterlab-settings": {"autosave": False},
    "@jupyterlab/notebook-extension/tracker.jupyterlab-settings": {"windowingMode": "none"},
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LabServer:
    def __init__(
        self,
        root: str | Path,
        *,
        env: dict[str, str] | None = None,
        log_path: str | Path | None = None,
        start_timeout: float = 60.0,
    ) -> None:
        self.root = Path(root)
        self.extra_env = env or {}
        self.start_timeout = start_timeout
        self.token = secrets.token_hex(16)
        self.port = free_port()
        self.proc: subprocess.Popen | None = None
        self.home: Path | None = None
        self.log_path: Path | None = Path(log_path) if log_path is not None else None
        self._log = None

    def url(self, path: str = "lab") -> str:
        sep = "&" if "?" in path else "?"
        return f"http://127.0.0.1:{self.port}/{path.lstrip('/')}{sep}token={self.token}"

    def log_tail(self, n: int = 40) -> str:
        if self.log_path is None or not self.log_path.exists():
            return ""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])

    def start(self) -> LabServer:
        self.home = Path(tempfile.mkdtemp(prefix="ftg-lab-"))
        dirs = {
            name: self.home / name
            for name in ("runtime", "config", "data", "settings", "workspaces", "ipython")
        }
        for d in dirs.values():
            d.mkdir()
        for rel, values in SETTINGS.items():
            p = dirs["settings"] / rel
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(json.dumps(values))
        env = lab.environment(
            {
                **os.environ,
                "JUPYTER_RUNTIME_DIR": str(dirs["runtime"]),
                "JUPYTER_CONFIG_DIR": str(dirs["config"]),
                "JUPYTER_DATA_DIR": str(dirs["data"]),
                "IPYTHONDIR": str(dirs["ipython"]),
                "JUPYTER_PLATFORM_DIRS": "0",
                **self.extra_env,
            }
        )
        cmd = lab.command(
            self.root,
            [
                "--no-browser",
                f"--ServerApp.port={self.port}",
                "--ServerApp.port_retries=0",
                f"--IdentityProvider.token={self.token}",
                f"--LabApp.user_settings_dir={dirs['settings']}",
                f"--LabApp.workspaces_dir={dirs['workspaces']}",
                "--LabApp.expose_app_in_browser=True",
                "--LabApp.extension_manager=readonly",  # no PyPI queries from the test
                "--ServerApp.terminals_enabled=False",
            ],
        )
        if self.log_path is None:
            self.log_path = self.home / "server.log"
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "wb")  # closed in stop()
        # Its own session: a Ctrl-C in the test run does not hit it, and stop() can find it.
        self.proc = subprocess.Popen(
            cmd,
            cwd=self.root,
            env=env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self._wait_until_up()
        return self

    def _wait_until_up(self) -> None:
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"JupyterLab exited with code {self.proc.returncode}:\n{self.log_tail()}"
                )
            try:
                with urllib.request.urlopen(self.url("api/status"), timeout=2) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.25)
        raise RuntimeError(
            f"JupyterLab did not answer within {self.start_timeout:.0f} s:\n{self.log_tail()}"
        )

    def stop(self) -> list[int]:
        """Stop the server and everything under it; return the pids that had to be killed."""
        killed: list[int] = []
        if self.proc is not None:
            try:
                family = [
                    psutil.Process(self.proc.pid),
                    *psutil.Process(self.proc.pid).children(recursive=True),
                ]
            except psutil.NoSuchProcess:
                family = []
            if self.proc.poll() is None:
                self.proc.send_signal(signal.SIGTERM)  # the server shuts its kernels down
                try:
                    self.proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    pass
            _, alive = psutil.wait_procs(family, timeout=5)
            for p in alive:
                try:
                    p.kill()
                    killed.append(p.pid)
                except psutil.NoSuchProcess:
                    pass
            psutil.wait_procs(alive, timeout=5)
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait(timeout=5)
            self.proc = None
        if self._log is not None:
            self._log.close()
            self._log = None
        if self.home is not None:
            shutil.rmtree(self.home, ignore_errors=True)
            self.home = None
        return killed

    def __enter__(self) -> LabServer:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc: object) -> None:
        self.stop()

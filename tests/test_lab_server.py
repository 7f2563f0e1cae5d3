"""The browser test's JupyterLab server: loopback only, token required, nothing left running."""

import json
import time
import urllib.error
import urllib.request

import psutil
import pytest

from tests.lab_server import LabServer

pytestmark = pytest.mark.slow  # starts a JupyterLab server


@pytest.mark.timeout(120)
def test_lab_server_is_private_and_stops_everything(tmp_path):
    lab = LabServer(tmp_path, env={"FTG_PROFILE": "smoke"})
    try:
        lab.start()
        server = psutil.Process(lab.proc.pid)
        listening = [
            c.laddr for c in server.net_connections(kind="inet") if c.status == psutil.CONN_LISTEN
        ]
        assert listening and all(a.ip == "127.0.0.1" for a in listening), listening
        # Token auth is on: without the token the API refuses.
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(f"http://127.0.0.1:{lab.port}/api/kernels", timeout=5)
        assert err.value.code == 403
        # Start a kernel, as opening a notebook does, and wait for its process.
        req = urllib.request.Request(
            lab.url("api/kernels"),
            data=json.dumps({"name": "python3"}).encode(),
            method="POST",
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=30) as r:
            assert r.status == 201
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not server.children(recursive=True):
            time.sleep(0.2)
        family = [server, *server.children(recursive=True)]
        assert len(family) >= 2, "no kernel process appeared"
        home = lab.home
    finally:
        lab.stop()
    gone, alive = psutil.wait_procs(family, timeout=10)
    assert not [p for p in alive if p.status() != psutil.STATUS_ZOMBIE], alive
    assert not home.exists(), "the temporary Jupyter folders were not removed"

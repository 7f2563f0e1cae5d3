"""A rank for launcher tests: joins the process group, says it is ready (its pid in
`<out>/ready<rank>`), then holds until `<out>/release` appears. Its life does not depend on how
fast the machine is, so a test can look at it (listening sockets, parent death) while it runs.
`--vanish R`: rank R leaves at once after joining, by `os._exit(7)`: no exception, no error file."""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import torch.distributed as dist

from helpers import process_group


@process_group.record
def main() -> int:
    p = argparse.ArgumentParser()
    for name in ("--backend", "--threads", "--out", "--init-timeout"):
        p.add_argument(name)
    p.add_argument("--vanish", type=int, default=-1)
    a = p.parse_args()
    out = Path(a.out)
    with process_group.setup("gloo", init_timeout=float(a.init_timeout)):
        dist.barrier()  # every rank connected: the sockets a real run uses are open
        if int(os.environ["RANK"]) == a.vanish:
            os._exit(7)
        (out / f"ready{os.environ['RANK']}").write_text(str(os.getpid()))
        while not (out / "release").exists():
            time.sleep(0.1)
        dist.barrier()
    return 0


if __name__ == "__main__":
    process_group.run(main)

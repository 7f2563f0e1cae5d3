"""A rank for launcher tests, a plain script as a notebook writes one: joins the process group
(through the launcher's INIT_METHOD), says it is ready (its pid in `ready<rank>`, beside this
file), then holds until `release` appears there. Its life does not depend on how fast the
machine is, so a test can look at it (listening sockets, parent death) while it runs.
`--vanish R`: rank R leaves at once after joining, by `os._exit(7)`: no exception, no traceback.
`--fail R`: rank R raises after joining."""

from __future__ import annotations

import argparse
import os
import time
from datetime import timedelta
from pathlib import Path

import torch.distributed as dist

p = argparse.ArgumentParser()
p.add_argument("--vanish", type=int, default=-1)
p.add_argument("--fail", type=int, default=-1)
a = p.parse_args()
rank = int(os.environ["RANK"])
dist.init_process_group(
    "gloo",
    init_method=os.environ["INIT_METHOD"],
    rank=rank,
    world_size=int(os.environ["WORLD_SIZE"]),
    timeout=timedelta(seconds=120),
)
dist.barrier()  # every rank connected: the sockets a real run uses are open
if rank == a.vanish:
    os._exit(7)
if rank == a.fail:
    raise RuntimeError(f"rank {rank}: deliberate failure")
here = Path(__file__).resolve().parent
(here / f"ready{rank}").write_text(str(os.getpid()))
while not (here / "release").exists():
    time.sleep(0.1)
dist.barrier()
dist.destroy_process_group()

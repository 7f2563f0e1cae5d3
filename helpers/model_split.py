"""Model splitting (notebook 09): an encoder/decoder model cut in two, run on two devices.

* `SplitModel` puts the encoder on one device and the decoder on another in ONE process and
  makes the hand-off explicit (`h.to(dev1)`); on a CPU-only machine both halves live on the CPU
  and the hand-off is a real copy (`clone`), so its cost is visible but small.
* `python -m helpers.model_split` is the two-process version, with PyTorch's own pipelining
  (`torch.distributed.pipelining.PipelineStage` + `ScheduleGPipe`): stage 0 (encoder) on rank 0,
  stage 1 (decoder + loss) on rank 1, activations sent between processes (gloo over loopback on
  a CPU, nccl between GPUs). It times one training step with 1 micro-batch (pure sequential
  hand-off: one stage always idle) and with several micro-batches (GPipe: the stages overlap),
  and the raw cost of sending one activation tensor between the two processes.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from . import process_group
from .devices import synchronize
from .launch import exit_rank, run_rank


def encoder(in_features: int = 256, hidden: int = 1024, depth: int = 2) -> nn.Sequential:
    layers: list[nn.Module] = []
    w = in_features
    for _ in range(depth):
        layers += [nn.Linear(w, hidden), nn.ReLU()]
        w = hidden
    return nn.Sequential(*layers)


def decoder(hidden: int = 1024, depth: int = 2, classes: int = 10) -> nn.Sequential:
    layers: list[nn.Module] = []
    for _ in range(depth - 1):
        layers += [nn.Linear(hidden, hidden), nn.ReLU()]
    layers.append(nn.Linear(hidden, classes))
    return nn.Sequential(*layers)


class SplitModel(nn.Module):
    """Encoder on `dev0`, decoder on `dev1`; `forward` hands the activation over explicitly.

    With dev0 == dev1 == cpu the hand-off is a `clone()` - a real memory copy standing in for
    the device-to-device transfer, and named as such - so the code path is the same one a
    two-GPU machine runs.
    """

    def __init__(self, enc: nn.Module, dec: nn.Module, dev0: torch.device | str,
                 dev1: torch.device | str) -> None:
        super().__init__()
        self.dev0, self.dev1 = torch.device(dev0), torch.device(dev1)
        self.enc, self.dec = enc.to(self.dev0), dec.to(self.dev1)
        self.handoff_seconds = 0.0

    def handoff(self, h: torch.Tensor) -> torch.Tensor:
        if self.dev0 == self.dev1:
            return h.clone()
        return h.to(self.dev1, non_blocking=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.enc(x.to(self.dev0))
        return self.dec(self.handoff(h))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="2-stage pipeline timing")
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--microbatches", type=int, nargs="+", default=[1, 4])
    p.add_argument("--in-features", type=int, default=256)
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--depth", type=int, default=2)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--backend", choices=("auto", "gloo", "nccl"), default="auto")
    p.add_argument("--init-timeout", type=float, default=60.0, help="seconds to join the group")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds per collective")
    p.add_argument("--out", default=None)
    a = p.parse_args(argv)
    if any(m < 1 or a.batch % m for m in a.microbatches):
        p.error(f"--microbatches must be >= 1 and divide --batch={a.batch}")
    return a


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    rank = int(os.environ.get("RANK", 0))
    out = Path(a.out) if a.out else None
    return run_rank(lambda: _run(a, rank, out), rank, out)


def _run(a: argparse.Namespace, rank: int, out: Path | None) -> int:
    from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

    torch.set_num_threads(a.threads)
    world = int(os.environ.get("WORLD_SIZE", 1))
    if world != 2:
        raise ValueError(f"the pipeline demo has 2 stages: run it with 2 processes, not {world}")
    backend = a.backend
    if backend == "auto":
        backend = "nccl" if torch.cuda.device_count() >= 2 else "gloo"
    device = torch.device("cuda", rank) if backend == "nccl" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    process_group.init(backend, device=device, init_timeout=a.init_timeout, timeout=a.timeout)

    torch.manual_seed(0)
    enc = encoder(a.in_features, a.hidden, a.depth)
    dec = decoder(a.hidden, a.depth)
    part = (enc if rank == 0 else dec).to(device)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(a.batch, a.in_features, generator=g).to(device)
    y = torch.randint(0, 10, (a.batch,), generator=g).to(device)
    loss_fn = nn.CrossEntropyLoss()

    def sync() -> None:
        synchronize(device)
        process_group.barrier(device)

    result: dict = {"rank": rank, "backend": backend, "device": str(device),
                    "batch": a.batch, "threads": a.threads, "schedule": {}}
    # 1) one step of this stage's forward + backward alone, no communication
    h = torch.randn(a.batch, a.hidden, device=device)

    def local_step() -> None:
        inp = x if rank == 0 else h.requires_grad_(True)
        o = part(inp)
        (o.float().pow(2).mean() if rank == 0 else loss_fn(o, y)).backward()

    # measured one rank at a time, so each has the machine to itself (on a CPU they share cores)
    for r in range(2):
        sync()
        if rank == r:
            # this rank's GPU only (no barrier: the other rank is idle, waiting its turn)
            result["stage_compute_s"] = _median_time(local_step, a.repeats,
                                                     sync=lambda: synchronize(device))
        sync()
    # 2) the hand-off: send the activation (forward) and its gradient (backward) once each
    buf = torch.empty(a.batch, a.hidden, device=device)

    def handoff() -> None:
        if rank == 0:
            dist.send(h, dst=1)
            dist.recv(buf, src=1)
        else:
            dist.recv(buf, src=0)
            dist.send(h, dst=0)

    sync()
    result["handoff_s"] = _median_time(handoff, a.repeats, sync=sync)
    result["handoff_bytes"] = h.numel() * h.element_size()
    # 3) PyTorch pipelining: GPipe with m micro-batches (m=1 is the naive sequential split)
    for m in a.microbatches:
        stage = PipelineStage(part, stage_index=rank, num_stages=2, device=device)
        sched = ScheduleGPipe(stage, n_microbatches=m, loss_fn=loss_fn)

        def step(sched: ScheduleGPipe = sched) -> None:
            part.zero_grad(set_to_none=True)
            if rank == 0:
                sched.step(x)
            else:
                sched.step(target=y, losses=[])

        sync()
        result["schedule"][str(m)] = _median_time(step, a.repeats, sync=sync)
        if rank == 0:
            print(f"GPipe with {m} micro-batch(es): "
                  f"{result['schedule'][str(m)] * 1e3:.1f} ms per step", flush=True)
    if out:
        out.mkdir(parents=True, exist_ok=True)
        (out / f"rank{rank}.json").write_text(json.dumps(result))
    process_group.barrier(device)
    return 0


def _median_time(fn, repeats: int, *, sync) -> float:
    fn()  # warm-up
    sync()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    times.sort()
    return times[len(times) // 2]


if __name__ == "__main__":
    exit_rank(main())

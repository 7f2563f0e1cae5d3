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
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from . import process_group, timing
from .devices import synchronize


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
    p.add_argument("--backend", choices=process_group.BACKENDS, default="auto")
    p.add_argument("--init-timeout", type=float, default=60.0, help="seconds to join the group")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds per collective")
    p.add_argument("--out", default=None)
    a = p.parse_args(argv)
    if any(m < 1 or a.batch % m for m in a.microbatches):
        p.error(f"--microbatches must be >= 1 and divide --batch={a.batch}")
    return a


def gpipe_step(part: nn.Module, rank: int, device: torch.device, microbatches: int,
               loss_fn: nn.Module, x: torch.Tensor, y: torch.Tensor) -> Callable[[], None]:
    """One training step of this rank's stage under GPipe: `part` is stage `rank` of 2 (rank 0
    feeds the batch `x`, rank 1 owns the loss against `y`). The batch is cut into `microbatches`
    pieces; all their forwards flow 0 -> 1, then all their backwards 1 -> 0, so stage 0 starts
    micro-batch 2 while stage 1 works on micro-batch 1 (with 1 micro-batch: the plain split)."""
    from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

    stage = PipelineStage(part, stage_index=rank, num_stages=2, device=device)
    schedule = ScheduleGPipe(stage, n_microbatches=microbatches, loss_fn=loss_fn)

    def step() -> None:
        part.zero_grad(set_to_none=True)
        if rank == 0:
            schedule.step(x)  # sends each micro-batch's activation on to stage 1
        else:
            schedule.step(target=y, losses=[])  # receives them, computes the loss, sends gradients back
    return step


@process_group.record  # a failure's traceback reaches the launcher through torchrun's error file
def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    if world != 2:
        raise ValueError(f"the pipeline demo has 2 stages: run it with 2 processes, not {world}")
    with process_group.setup(a.backend, threads=a.threads, init_timeout=a.init_timeout,
                             timeout=a.timeout) as (backend, device):
        result = _run(a, rank, backend, device)
        if a.out:
            Path(a.out).mkdir(parents=True, exist_ok=True)
            (Path(a.out) / f"rank{rank}.json").write_text(json.dumps(result))
        process_group.barrier(device)
    return 0


def _run(a: argparse.Namespace, rank: int, backend: str, device: torch.device) -> dict:
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

    def median(fn: Callable[[], None], sync: Callable[[], None]) -> float:
        # each timed call ends synchronised (its GPU, and with `sync` both ranks), so the two
        # ranks time the same steps; timing.benchmark syncs every GPU of this process besides
        return timing.benchmark(lambda: (fn(), sync()), repeats=a.repeats, warmup=1).median

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
        if rank == r:  # this rank's GPU only (no barrier: the other rank waits its turn)
            result["stage_compute_s"] = median(local_step, lambda: synchronize(device))
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
    result["handoff_s"] = median(handoff, sync)
    result["handoff_bytes"] = h.numel() * h.element_size()
    # 3) PyTorch pipelining: GPipe with m micro-batches (m=1 is the naive sequential split)
    for m in a.microbatches:
        sync()
        result["schedule"][str(m)] = median(gpipe_step(part, rank, device, m, loss_fn, x, y), sync)
        if rank == 0:
            print(f"GPipe with {m} micro-batch(es): "
                  f"{result['schedule'][str(m)] * 1e3:.1f} ms per step", flush=True)
    return result


if __name__ == "__main__":
    process_group.run(main)

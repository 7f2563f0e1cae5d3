"""A plain DistributedDataParallel training script: the lesson of notebook 10, kept as a file.

Run it any of these ways, unchanged:

    python -m helpers.ddp_train --steps 20                    # one process (world size 1)
    torchrun --standalone --nproc-per-node=2 -m helpers.ddp_train --steps 20
    helpers.launch.launch("helpers.ddp_train", ["--steps", "20"], nprocs=2)   # from a notebook

What it shows: joining the process group (`process_group.setup`: gloo on CPU, nccl with one GPU
per process, a rendezvous timeout and a collective timeout), the same seed on every rank,
`DistributedSampler` + `set_epoch`, a small explicit training step, rank-0-only logging and
checkpointing, and one JSON result per rank (`--out DIR`) with its throughput, losses and a
checksum of its weights. `main` is wrapped in torchrun's `@record`: a failing rank's traceback
goes to torchrun's error file, so the launcher can tell the root cause from its victims.

The model is an MLP on synthetic data: compute-bound (matrix multiplies), no data loading to
hide behind, and no batch norm unless `--model mlp_bn` (whose statistics are per process).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from . import process_group
from .checks import check_choice, check_int
from .devices import synchronize
from .threads import cpu_threads

if TYPE_CHECKING:
    from .timing import Measurement

MODELS = ("mlp", "mlp_bn")


def build_model(name: str = "mlp", *, in_features: int = 256, hidden: int = 512, depth: int = 3,
                classes: int = 10) -> nn.Sequential:
    """An MLP; `mlp_bn` puts a BatchNorm1d after each hidden Linear (per-process statistics)."""
    check_choice("model", name, MODELS, where="build_model")
    layers: list[nn.Module] = []
    width = in_features
    for _ in range(depth):
        layers.append(nn.Linear(width, hidden))
        if name == "mlp_bn":
            layers.append(nn.BatchNorm1d(hidden))
        layers.append(nn.ReLU())
        width = hidden
    layers.append(nn.Linear(width, classes))
    return nn.Sequential(*layers)


def make_dataset(samples: int, *, in_features: int = 256, classes: int = 10,
                 seed: int = 0) -> TensorDataset:
    """Synthetic classification data from a fixed random 'teacher', identical in every process."""
    g = torch.Generator().manual_seed(seed + 12345)
    x = torch.randn(samples, in_features, generator=g)
    teacher = torch.randn(in_features, classes, generator=g)
    y = (x @ teacher).argmax(dim=1)
    return TensorDataset(x, y)


def make_loader(ds: TensorDataset, *, batch: int, world: int, rank: int,
                seed: int) -> tuple[DataLoader, DistributedSampler]:
    """Each rank reads its own 1/world of every epoch (shuffled with the same seed everywhere)."""
    sampler = DistributedSampler(ds, num_replicas=world, rank=rank, shuffle=True, seed=seed,
                                 drop_last=True)
    return DataLoader(ds, batch_size=batch, sampler=sampler, drop_last=True), sampler


def train_step(model: nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor,
               y: torch.Tensor) -> torch.Tensor:
    """Forward, loss, backward (DDP all-reduces the gradients here), update."""
    opt.zero_grad(set_to_none=True)
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    return loss.detach()


def checksum(model: nn.Module) -> float:
    """A number that changes when any weight changes (to compare replicas across ranks)."""
    with torch.no_grad():
        return float(sum((p.double() * (i + 1)).sum() for i, p in enumerate(model.parameters())))


def reference_train(*, world: int, model: str = "mlp", batch: int = 32, steps_per_epoch: int = 5,
                    epochs: int = 1, lr: float = 0.05, seed: int = 0, in_features: int = 256,
                    hidden: int = 512, depth: int = 3) -> nn.Sequential:
    """ONE process trained on the same global batches that `world` DDP ranks would see together:
    at each step, the concatenation of every rank's batch. Its weights are what DDP must reach."""
    torch.manual_seed(seed)
    net = build_model(model, in_features=in_features, hidden=hidden, depth=depth)
    opt = torch.optim.SGD(net.parameters(), lr=lr)
    ds = make_dataset(steps_per_epoch * batch * world, in_features=in_features, seed=seed)
    loaders = [make_loader(ds, batch=batch, world=world, rank=r, seed=seed) for r in range(world)]
    for epoch in range(epochs):
        for _, sampler in loaders:
            sampler.set_epoch(epoch)
        for parts in zip(*(loader for loader, _ in loaders), strict=True):
            x = torch.cat([p[0] for p in parts])
            y = torch.cat([p[1] for p in parts])
            train_step(net, opt, x, y)
    return net


def single_process_step_times(*, threads: int, model: str = "mlp", batch: int = 32,
                              steps: int = 5, warmup: int = 1, lr: float = 0.05,
                              in_features: int = 256, hidden: int = 512, depth: int = 3,
                              device: str | torch.device = "cpu", seed: int = 0) -> Measurement:
    """Seconds per training step of the same model and step in THIS process, without DDP, with
    `threads` intra-op threads: the baseline a DDP run must beat. Restores the thread count."""
    # imported here, not at the top: the ranks need not load torch.utils.benchmark
    from .timing import benchmark

    check_int("threads", threads, 1, where="single_process_step_times")
    device = torch.device(device)
    torch.manual_seed(seed)
    net = build_model(model, in_features=in_features, hidden=hidden, depth=depth).to(device)
    opt = torch.optim.SGD(net.parameters(), lr=lr)
    x, y = make_dataset(batch, in_features=in_features, seed=seed).tensors
    x, y = x.to(device), y.to(device)
    with cpu_threads(threads):
        return benchmark(lambda: train_step(net, opt, x, y), repeats=steps, warmup=warmup,
                                label=f"one process, {threads} thread(s)")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", choices=MODELS, default="mlp")
    p.add_argument("--batch", type=int, default=32, help="samples per process per step")
    p.add_argument("--steps-per-epoch", type=int, default=5)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--warmup", type=int, default=1, help="untimed steps at the start")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--in-features", type=int, default=256)
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--depth", type=int, default=3)
    p.add_argument("--threads", type=int, default=1, help="intra-op threads per process")
    p.add_argument("--backend", choices=process_group.BACKENDS, default="auto")
    p.add_argument("--init-timeout", type=float, default=60.0,
                   help="seconds for every rank to join the process group")
    p.add_argument("--timeout", type=float, default=300.0,
                   help="seconds any one collective may take (NCCL's watchdog aborts it after)")
    p.add_argument("--out", default=None, help="folder for rank<r>.json results")
    p.add_argument("--checkpoint", action="store_true", help="rank 0 saves checkpoint.pt")
    p.add_argument("--sync-bn", action="store_true",
                   help="convert BatchNorm to SyncBatchNorm (statistics over the global batch; "
                        "PyTorch supports it on GPUs only)")
    p.add_argument("--fail-rank", type=int, default=-1, help="this rank raises (failure demo)")
    p.add_argument("--fail-step", type=int, default=1)
    a = p.parse_args(argv)
    for name in ("batch", "steps_per_epoch", "epochs", "threads", "depth", "hidden", "in_features"):
        if getattr(a, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    return a


@process_group.record  # a failure's traceback reaches the launcher through torchrun's error file
def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    out = Path(a.out) if a.out else None
    if out:
        out.mkdir(parents=True, exist_ok=True)
    # the process group: the rendezvous must finish within --init-timeout (a missing rank fails
    # fast), each collective within --timeout; with NCCL this rank's GPU is bound to it
    with process_group.setup(a.backend, threads=a.threads, init_timeout=a.init_timeout,
                             timeout=a.timeout) as (backend, device):
        return _train(a, rank, world, local_rank, out, backend, device)


def _train(a: argparse.Namespace, rank: int, world: int, local_rank: int, out: Path | None,
           backend: str, device: torch.device) -> int:
    log = print if rank == 0 else (lambda *args, **kw: None)  # rank-0-only logging
    log(f"world={world} backend={backend} device={device} threads={a.threads} "
        f"batch/process={a.batch} global batch={a.batch * world}", flush=True)

    torch.manual_seed(a.seed)  # same initial weights everywhere (DDP also broadcasts rank 0's)
    model = build_model(a.model, in_features=a.in_features, hidden=a.hidden,
                        depth=a.depth).to(device)
    if a.sync_bn:
        model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
    net = DDP(model, device_ids=[local_rank] if device.type == "cuda" else None)
    opt = torch.optim.SGD(net.parameters(), lr=a.lr)
    ds = make_dataset(a.steps_per_epoch * a.batch * world, in_features=a.in_features,
                      seed=a.seed)
    loader, sampler = make_loader(ds, batch=a.batch, world=world, rank=rank, seed=a.seed)

    losses: list[torch.Tensor] = []
    step_times: list[float] = []
    step = 0
    t_start = None
    for epoch in range(a.epochs):
        sampler.set_epoch(epoch)  # a new shuffle each epoch, the same on every rank
        for x, y in loader:
            if step == a.warmup:
                synchronize(device)
                t_start = time.perf_counter()
            if rank == a.fail_rank and step == a.fail_step:
                raise RuntimeError(f"rank {rank}: deliberate failure at step {step} (--fail-rank)")
            t0 = time.perf_counter()
            loss = train_step(net, opt, x.to(device, non_blocking=True),
                              y.to(device, non_blocking=True))
            losses.append(loss)  # a tensor: float() here would add a host sync per step (notebook 05)
            synchronize(device)  # the one sync per step, for its timing (the DataParallel run does the same)
            step_times.append(time.perf_counter() - t0)
            step += 1
        log(f"epoch {epoch}: loss {float(losses[-1]):.4f} ({step} steps)", flush=True)
    synchronize(device)
    timed = step - a.warmup
    elapsed = time.perf_counter() - t_start if t_start is not None and timed > 0 else float("nan")
    loss_values = [float(v) for v in losses]  # read after the timed loop

    if a.checkpoint and rank == 0 and out:  # one writer: rank 0, the unwrapped module
        torch.save({"model": net.module.state_dict(), "step": step}, out / "checkpoint.pt")
        log(f"rank 0 saved {out / 'checkpoint.pt'}", flush=True)
    bn = [m for m in net.module.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    result = {
        "rank": rank, "world": world, "backend": backend, "device": str(device),
        "threads": a.threads, "batch": a.batch, "steps": step, "timed_steps": timed,
        "seconds": elapsed, "samples_per_s": a.batch * timed / elapsed if timed > 0 else None,
        "losses": loss_values, "step_times": step_times, "checksum": checksum(net.module),
        "bn_running_mean": bn[0].running_mean[:8].tolist() if bn else None,
        "pid": os.getpid(),
    }
    if out:
        (out / f"rank{rank}.json").write_text(json.dumps(result))
    process_group.barrier(device)
    log(f"done: {timed} timed steps, {result['samples_per_s'] or 0:.0f} samples/s on rank 0",
        flush=True)
    return 0


if __name__ == "__main__":
    process_group.run(main)

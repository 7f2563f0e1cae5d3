"""Devices: d2l's names (`try_gpu`, `try_all_gpus`), synchronisation and a hardware summary."""

from __future__ import annotations

import os
import platform
from typing import Any

import psutil
import torch


def cpu() -> torch.device:
    return torch.device("cpu")


def num_gpus() -> int:
    return torch.cuda.device_count()


def try_gpu(i: int = 0) -> torch.device:
    """GPU `i` if it exists, else the CPU (same as d2l)."""
    if not isinstance(i, int) or isinstance(i, bool) or i < 0:
        raise ValueError(f"try_gpu(i): i must be an int >= 0, got {i!r}")
    return torch.device(f"cuda:{i}") if num_gpus() > i else cpu()


def try_all_gpus() -> list[torch.device]:
    """All GPUs, or `[cpu]` when there are none.

    d2l 1.0.3's `try_all_gpus()` returns `[]` on a CPU-only machine although its docstring
    promises `[cpu()]`; code that then does `devices[0]` fails. Ours keeps the promise.
    """
    gpus = [torch.device(f"cuda:{i}") for i in range(num_gpus())]
    return gpus or [cpu()]


DEVICE_CHOICES = "'cpu', 'cuda' or 'cuda:N'"


def _parse(device: str | torch.device, param: str = "device") -> torch.device:
    """`device` as a torch.device of a kind this suite uses, or a clear error (no existence check)."""
    if isinstance(device, torch.device):
        dev = device
    elif isinstance(device, str):
        try:
            dev = torch.device(device)
        except (RuntimeError, TypeError, ValueError) as e:
            raise ValueError(f"{param} must be {DEVICE_CHOICES}; got {device!r}") from e
    else:
        raise TypeError(f"{param} must be a string ({DEVICE_CHOICES}) or a torch.device; "
                        f"got {type(device).__name__} {device!r}")
    if dev.type not in ("cpu", "cuda", "meta"):
        raise ValueError(f"{param} must be {DEVICE_CHOICES}; got {device!r}")
    return dev


def as_device(device: str | torch.device | None, param: str = "device") -> torch.device:
    """Parse a device argument with a clear error (None means `try_gpu()`)."""
    if device is None:
        return try_gpu()
    dev = _parse(device, param)
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"{param} {device!r} asked for, but this machine has no CUDA GPU "
                             "(use 'cpu', or devices.try_gpu())")
        if dev.index is not None and dev.index >= num_gpus():
            raise ValueError(f"{param} {device!r} does not exist: this machine has {num_gpus()} GPU(s), "
                             f"cuda:0 ... cuda:{num_gpus() - 1}")
    return dev


def synchronize(device: str | torch.device | None = None) -> None:
    """Wait until queued work on `device` is done (a no-op on the CPU, which runs eagerly).

    `None` waits for every GPU, not only the current one (`torch.cuda.synchronize()` alone
    waits for the current device): `Timer()` and `timing.benchmark` promise that, and work
    spread over several GPUs (DataParallel, model splitting) must all be counted."""
    if isinstance(device, torch.device) and device.type == "cpu":
        return  # the hot path in training loops: nothing to wait for
    dev = as_device(device) if device is not None else None
    if dev is None:
        if torch.cuda.is_available():
            for i in range(torch.cuda.device_count()):
                torch.cuda.synchronize(i)
    elif dev.type == "cuda":
        torch.cuda.synchronize(dev)


def bf16_supported(device: str | torch.device = "cpu") -> bool:
    """True when `device` advertises bf16 arithmetic (GPU: native support; CPU: the avx512_bf16
    or amx_bf16 instruction flags). Whether PyTorch's kernels actually run faster in bf16 on a
    given CPU is another matter: notebook 07 measures it instead of trusting the flag."""
    dev = _parse(device)
    if dev.type == "cuda":
        return torch.cuda.is_available() and torch.cuda.is_bf16_supported(including_emulation=False)
    flags = _cpu_flags()
    return bool({"avx512_bf16", "amx_bf16"} & flags)


def _cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def hardware_summary() -> dict[str, Any]:
    """What this machine has: CPU, RAM, GPUs, CUDA, bf16 support, library versions."""
    gpus = []
    for i in range(num_gpus()):
        p = torch.cuda.get_device_properties(i)
        gpus.append(
            {
                "index": i,
                "name": p.name,
                "memory_gib": round(p.total_memory / 2**30, 1),
                "capability": f"{p.major}.{p.minor}",
                "multiprocessors": p.multi_processor_count,
                "bf16": bf16_supported(f"cuda:{i}"),
            }
        )
    return {
        "cpu": _cpu_name(),
        "cpu_cores_logical": os.cpu_count(),
        "cpu_cores_physical": psutil.cpu_count(logical=False),
        "cpu_cores_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "ram_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "cpu_bf16_instructions": bf16_supported("cpu"),
        "torch_threads": torch.get_num_threads(),
        "gpus": gpus,
        "cuda_available": torch.cuda.is_available(),
        "cuda_version": torch.version.cuda,
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "platform": platform.platform(),
    }


def describe_hardware(summary: dict[str, Any] | None = None) -> str:
    """A short human-readable version of `hardware_summary()`; printed and returned."""
    if summary is not None and not isinstance(summary, dict):
        raise TypeError(f"describe_hardware: summary must be the dict from hardware_summary() or None; "
                        f"got {type(summary).__name__}")
    s = summary or hardware_summary()
    missing = {"cpu", "cpu_cores_usable", "cpu_cores_logical", "ram_gib", "cpu_bf16_instructions",
               "torch", "cuda_version", "torch_threads", "gpus"} - set(s)
    if missing:
        raise ValueError(f"describe_hardware: summary lacks {sorted(missing)}; pass hardware_summary()'s dict")
    lines = [
        f"CPU   : {s['cpu']} ({s['cpu_cores_usable']} usable cores, {s['cpu_cores_logical']} logical)",
        f"RAM   : {s['ram_gib']} GiB",
        f"bf16  : CPU advertises bf16 instructions = {s['cpu_bf16_instructions']} "
        "(whether that makes training faster is measured, not assumed: notebook 07)",
        f"torch : {s['torch']} (CUDA build {s['cuda_version']}), {s['torch_threads']} intra-op threads",
    ]
    if s["gpus"]:
        for g in s["gpus"]:
            lines.append(
                f"GPU {g['index']} : {g['name']}, {g['memory_gib']} GiB, "
                f"compute capability {g['capability']}, bf16={g['bf16']}"
            )
    else:
        lines.append("GPU   : none found - every experiment runs on the CPU and says so")
    text = "\n".join(lines)
    print(text)
    return text


def device_name(device: str | torch.device | None = None) -> str:
    """'NVIDIA H100 80GB HBM3' for a GPU, the CPU's model name otherwise."""
    dev = as_device(device)
    if dev.type == "cuda":
        return torch.cuda.get_device_name(dev)
    return _cpu_name()

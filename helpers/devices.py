"""Devices: d2l's names (`try_gpu`, `try_all_gpus`), synchronisation, memory counters, what a
device can do (bf16 in hardware, `torch.compile`, kernels in this torch build) and a hardware
summary, for whichever accelerator this machine has: an NVIDIA GPU (`cuda`), an Apple GPU (`mps`)
or an Intel GPU (`xpu`), else the CPU.

Built on `torch.accelerator` (every supported torch has it). What does not exist on a backend (a
peak-memory counter on MPS, NCCL and CUDA graphs anywhere but CUDA) is reported as missing,
never faked.
"""

from __future__ import annotations

import os
import platform
import re
import subprocess
from typing import Any

import psutil
import torch

from .checks import check_int

GPU_TYPES = ("cuda", "mps", "xpu")
DEVICE_CHOICES = "'cpu', 'cuda', 'cuda:N', 'mps' or 'xpu'"


def cpu() -> torch.device:
    return torch.device("cpu")


def accelerator() -> str | None:
    """The accelerator type torch can use here, `'cuda'`, `'mps'` or `'xpu'`, or None (CPU only)."""
    if not torch.accelerator.is_available():
        return None
    dev = torch.accelerator.current_accelerator()
    return dev.type if dev is not None and dev.type in GPU_TYPES else None


def _backend(kind: str) -> Any:
    """torch.cuda, torch.mps or torch.xpu."""
    return {"cuda": torch.cuda, "mps": torch.mps, "xpu": torch.xpu}[kind]


def num_gpus() -> int:
    """How many accelerator devices there are (an Apple GPU counts as one)."""
    return int(torch.accelerator.device_count()) if accelerator() else 0


def _gpu(kind: str, i: int) -> torch.device:
    return torch.device("mps") if kind == "mps" else torch.device(kind, i)


def try_gpu(i: int = 0) -> torch.device:
    """GPU `i` if it exists (`cuda:i`, `mps` or `xpu:i`), else the CPU (same as d2l)."""
    check_int("i", i, 0, where="try_gpu")
    kind = accelerator()
    return _gpu(kind, i) if kind is not None and num_gpus() > i else cpu()


def try_all_gpus() -> list[torch.device]:
    """All GPUs, or `[cpu]` when there are none.

    d2l 1.0.3's `try_all_gpus()` returns `[]` on a CPU-only machine although its docstring
    promises `[cpu()]`; code that then does `devices[0]` fails. Ours keeps the promise.
    """
    kind = accelerator()
    gpus = [_gpu(kind, i) for i in range(num_gpus())] if kind is not None else []
    return gpus or [cpu()]


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
    if dev.type not in ("cpu", "meta", *GPU_TYPES):
        raise ValueError(f"{param} must be {DEVICE_CHOICES}; got {device!r}")
    return dev


_NAMES = {"cuda": "CUDA GPU", "mps": "Apple GPU (MPS)", "xpu": "Intel GPU (XPU)"}


def as_device(device: str | torch.device | None, param: str = "device") -> torch.device:
    """Parse a device argument with a clear error (None means `try_gpu()`)."""
    if device is None:
        return try_gpu()
    dev = _parse(device, param)
    if dev.type in GPU_TYPES:
        if accelerator() != dev.type:
            raise ValueError(f"{param} {device!r} asked for, but this machine has no {_NAMES[dev.type]} "
                             "(use 'cpu', or devices.try_gpu())")
        n = num_gpus()
        if dev.index is not None and dev.index >= n:
            raise ValueError(f"{param} {device!r} does not exist: this machine has {n} {dev.type} "
                             f"device(s), {dev.type}:0 ... {dev.type}:{n - 1}")
    return dev


def synchronize(device: str | torch.device | None = None) -> None:
    """Wait until queued work on `device` is done (a no-op on the CPU, which runs eagerly).

    `None` waits for every device of the current accelerator, not only the current one
    (`torch.cuda.synchronize()` alone waits for the current device): `Timer()` and
    `timing.benchmark` promise that, and work spread over several GPUs (DataParallel, model
    splitting) must all be counted."""
    if isinstance(device, torch.device) and device.type == "cpu":
        return  # the hot path in training loops: nothing to wait for
    dev = as_device(device) if device is not None else None
    kind = accelerator() if dev is None else dev.type
    if kind not in GPU_TYPES:
        return
    if dev is None and kind in ("cuda", "xpu"):
        backend = _backend(kind)
        for i in range(backend.device_count()):
            backend.synchronize(i)
        return
    torch.accelerator.synchronize(dev)


# --------------------------------------------------------------------------- memory counters


def has_peak_memory_counter(device: str | torch.device) -> bool:
    """True where torch keeps a peak-allocation counter (CUDA, XPU). MPS and the CPU have none:
    there the suite samples or counts instead, and says so."""
    return _parse(device).type in ("cuda", "xpu")


def memory_allocated(device: str | torch.device) -> int:
    """Bytes held by tensors on `device` now (the caching allocator's count; MPS: Metal's)."""
    dev = as_device(device)
    if dev.type == "mps":
        return int(torch.mps.current_allocated_memory())
    if dev.type in ("cuda", "xpu"):
        return int(_backend(dev.type).memory_allocated(dev))
    raise ValueError(f"memory_allocated: {device!r} has no allocator counter (the CPU: use process RSS)")


def reset_peak_memory(device: str | torch.device) -> None:
    """Start a new peak-memory measurement on a CUDA/XPU device (see `has_peak_memory_counter`)."""
    dev = as_device(device)
    if not has_peak_memory_counter(dev):
        raise ValueError(f"reset_peak_memory: {dev.type} has no peak-memory counter")
    _backend(dev.type).reset_peak_memory_stats(dev)


def max_memory_allocated(device: str | torch.device) -> int:
    """Peak bytes held by tensors on a CUDA/XPU device since `reset_peak_memory`."""
    dev = as_device(device)
    if not has_peak_memory_counter(dev):
        raise ValueError(f"max_memory_allocated: {dev.type} has no peak-memory counter")
    return int(_backend(dev.type).max_memory_allocated(dev))


def empty_cache(device: str | torch.device | None = None) -> None:
    """Give cached, unused accelerator memory back to the driver (nothing to do on the CPU)."""
    kind = accelerator() if device is None else _parse(device).type
    if kind in GPU_TYPES:
        _backend(kind).empty_cache()


def pin_memory_useful(device: str | torch.device | None = None) -> bool:
    """Page-locked host memory speeds host-to-device copies on CUDA (and XPU). On an Apple GPU
    host and device share one memory, so there is nothing to pin."""
    kind = accelerator() if device is None else _parse(device).type
    return kind in ("cuda", "xpu")


def bf16_supported(device: str | torch.device = "cpu") -> bool:
    """True when `device` advertises bf16 arithmetic (CUDA: native support; MPS: macOS 14 or newer;
    CPU: the avx512_bf16 or amx_bf16 instruction flags). Whether PyTorch's kernels actually run
    faster in bf16 on a given device is another matter: notebook 07 measures it instead of
    trusting the flag."""
    dev = _parse(device)
    if dev.type == "cuda":
        return torch.cuda.is_available() and torch.cuda.is_bf16_supported(including_emulation=False)
    if dev.type == "mps":
        return bool(torch.backends.mps.is_available() and torch.backends.mps.is_macos_or_newer(14, 0))
    if dev.type == "xpu":
        return bool(torch.xpu.is_available() and torch.xpu.is_bf16_supported())
    flags = _cpu_flags()
    return bool({"avx512_bf16", "amx_bf16"} & flags)


# ------------------------------------------------------------------- what a device can do
# `capability` (major, minor) asks about a CUDA GPU that is not here: tests, or planning a run.

_Capability = tuple[int, int]


def _capability(dev: torch.device, capability: _Capability | None) -> _Capability | None:
    """The CUDA compute capability: the one given, else the device's; None without a CUDA GPU."""
    if capability is not None:
        if not (isinstance(capability, tuple) and len(capability) == 2
                and all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in capability)):
            raise ValueError(f"capability must be a (major, minor) pair of ints such as (8, 0), got {capability!r}")
        return capability
    if dev.type != "cuda" or not torch.cuda.is_available():
        return None
    return tuple(torch.cuda.get_device_capability(dev))


def bf16_native(device: str | torch.device = "cpu", capability: _Capability | None = None) -> bool:
    """True when `device` does bf16 arithmetic in hardware: a CUDA GPU of compute capability 8.0
    or newer (Ampere on; a T4 or V100 emulates bf16, slower than fp16); MPS and the CPU as
    `bf16_supported` finds (macOS 14; the CPU's avx512_bf16 / amx_bf16 flags)."""
    dev = _parse(device)
    if dev.type != "cuda":
        return bf16_supported(dev)
    cap = _capability(dev, capability)
    return cap is not None and cap >= (8, 0)


def compile_supported(device: str | torch.device = "cpu", capability: _Capability | None = None) -> bool:
    """True where `torch.compile`'s default backend (Inductor) makes code for `device`: the CPU
    (C++), Intel GPUs and CUDA GPUs of compute capability 7.0 or newer (Triton's minimum: a P100
    is older). MPS: False, as this suite has not run Inductor's Metal code; notebooks run eager
    there and say so."""
    dev = _parse(device)
    if dev.type == "cuda":
        cap = _capability(dev, capability)
        return cap is not None and cap >= (7, 0)
    return dev.type in ("cpu", "xpu")


def torch_built_for(device: str | torch.device = "cuda", capability: _Capability | None = None,
                    arch_list: list[str] | None = None) -> tuple[bool, str]:
    """Whether this torch ships kernels `device` can run, and why. A CUDA build carries machine
    code for a list of architectures (`torch.cuda.get_arch_list()`, or `arch_list`): it runs on a
    GPU of the same major version and an equal or higher minor (sm_80 code on an sm_86 A10G); PTX
    (`compute_XY`) runs on any GPU at least that new. A P100 (sm_60) or V100 (sm_70) with a build
    that starts at sm_75 gets "no kernel image is available": False, with the reason."""
    dev = _parse(device)
    if dev.type != "cuda":
        return True, f"{dev.type}: no CUDA architecture to match"
    cap = _capability(dev, capability)
    if cap is None:
        return False, "no CUDA GPU here (pass capability=(major, minor) to ask about one)"
    archs = torch.cuda.get_arch_list() if arch_list is None else list(arch_list)
    if not archs:
        return False, "this torch has no CUDA kernels (a CPU-only build)"
    for arch in archs:
        m = re.fullmatch(r"(sm|compute)_(\d+)(\d)(a?)f?", arch)
        if m is None:
            continue
        major, minor, exact = int(m[2]), int(m[3]), m[4] == "a"  # sm_90a: for 9.0 exactly
        runs = (major, minor) <= cap if m[1] == "compute" else (
            major == cap[0] and (minor == cap[1] if exact else minor <= cap[1]))
        if runs:
            return True, f"this torch's {arch} code runs on sm_{cap[0]}{cap[1]}"
    return False, (f"this torch ships kernels for {', '.join(archs)}, none of which runs on this "
                   f"sm_{cap[0]}{cap[1]} GPU: install a torch built for it (an older CUDA build)")


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
    if platform.system() == "Darwin":  # 'Apple M2 Pro': the chip, CPU and GPU in one
        try:
            out = subprocess.run(["sysctl", "-n", "machdep.cpu.brand_string"], capture_output=True,
                                 text=True, timeout=5, check=False).stdout.strip()
            if out:
                return out
        except (OSError, subprocess.SubprocessError):
            pass
    return platform.processor() or platform.machine()


def _gpu_info(kind: str, i: int) -> dict[str, Any]:
    """One accelerator's entry in `hardware_summary()["gpus"]`."""
    if kind == "mps":
        return {"index": 0, "type": "mps", "name": f"{_cpu_name()} GPU (Metal)",
                "memory_gib": round(torch.mps.recommended_max_memory() / 2**30, 1), "unified_memory": True,
                "capability": None, "multiprocessors": None, "bf16": bf16_supported("mps")}
    p = _backend(kind).get_device_properties(i)
    return {"index": i, "type": kind, "name": p.name,
            "memory_gib": round(p.total_memory / 2**30, 1), "unified_memory": False,
            "capability": f"{p.major}.{p.minor}" if kind == "cuda" else None,
            "multiprocessors": getattr(p, "multi_processor_count", None),
            "bf16": bf16_supported(torch.device(kind, i))}


def hardware_summary() -> dict[str, Any]:
    """What this machine has: CPU, RAM, GPUs (CUDA, Apple MPS, Intel XPU), bf16, library versions."""
    kind = accelerator()
    gpus = [_gpu_info(kind, i) for i in range(num_gpus())] if kind else []
    return {
        "cpu": _cpu_name(),
        "cpu_cores_logical": os.cpu_count(),
        "cpu_cores_physical": psutil.cpu_count(logical=False),
        "cpu_cores_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "ram_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "cpu_bf16_instructions": bf16_supported("cpu"),
        "torch_threads": torch.get_num_threads(),
        "accelerator": kind,
        "gpus": gpus,
        "cuda_available": kind == "cuda",
        "mps_available": kind == "mps",
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
    build = f"CUDA build {s['cuda_version']}" if s["cuda_version"] else "no CUDA in this build"
    lines = [
        f"CPU   : {s['cpu']} ({s['cpu_cores_usable']} usable cores, {s['cpu_cores_logical']} logical)",
        f"RAM   : {s['ram_gib']} GiB",
        f"bf16  : CPU advertises bf16 instructions = {s['cpu_bf16_instructions']} "
        "(whether that makes training faster is measured, not assumed: notebook 07)",
        f"torch : {s['torch']} ({build}), {s['torch_threads']} intra-op threads",
    ]
    if s["gpus"]:
        for g in s["gpus"]:
            if g.get("unified_memory"):
                lines.append(f"GPU {g['index']} : {g['name']}, unified memory shared with the CPU "
                             f"({g['memory_gib']} GiB usable by the GPU), bf16={g['bf16']}")
            else:
                cap = f", compute capability {g['capability']}" if g.get("capability") else ""
                lines.append(f"GPU {g['index']} : {g['name']}, {g['memory_gib']} GiB{cap}, bf16={g['bf16']}")
    else:
        lines.append("GPU   : none found - every experiment runs on the CPU and says so")
    text = "\n".join(lines)
    print(text)
    return text


def device_name(device: str | torch.device | None = None) -> str:
    """'NVIDIA H100 80GB HBM3' for a GPU, 'Apple M2 Pro GPU (Metal)' on a Mac, the CPU's model
    name otherwise."""
    dev = as_device(device)
    if dev.type == "cuda":
        return torch.cuda.get_device_name(dev)
    if dev.type == "mps":
        return f"{_cpu_name()} GPU (Metal)"
    if dev.type == "xpu":
        return torch.xpu.get_device_name(dev)
    return _cpu_name()

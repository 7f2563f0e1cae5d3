"""Devices: d2l's names (`try_gpu`, `try_all_gpus`), sync, memory counters, what a device can do,
the hardware and the CPU's threads, for CUDA, Apple MPS, Intel XPU, else the CPU. Built on
`torch.accelerator`; what a backend lacks (MPS: a peak-memory counter) is missing, never faked."""

from __future__ import annotations

import contextlib
import functools
import os
import platform
import re
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import psutil
import torch

from . import processes
from .checks import check_choice, check_int, check_number

GPU_TYPES = ("cuda", "mps", "xpu")
DEVICE_CHOICES = "'cpu', 'cuda', 'cuda:N', 'mps' or 'xpu'"
_NAMES = {"cuda": "CUDA GPU", "mps": "Apple GPU (MPS)", "xpu": "Intel GPU (XPU)"}


def cpu() -> torch.device:
    return torch.device("cpu")


def accelerator() -> str | None:
    """`'cuda'`, `'mps'` or `'xpu'`: the accelerator torch can use here; None: the CPU only, also
    beside a CUDA GPU this torch has no kernels for (printed once, and by `describe_hardware`)."""
    dev = torch.accelerator.current_accelerator(check_available=True)
    kind = dev.type if dev is not None and dev.type in GPU_TYPES else None
    return None if kind == "cuda" and _cuda_refused() else kind


def num_gpus() -> int:
    """How many accelerator devices there are (an Apple GPU counts as one)."""
    return torch.accelerator.device_count() if accelerator() else 0


def _gpu(kind: str, i: int) -> torch.device:
    return torch.device("mps") if kind == "mps" else torch.device(kind, i)


def try_gpu(i: int = 0) -> torch.device:
    """GPU `i` if it exists (`cuda:i`, `mps` or `xpu:i`), else the CPU (as d2l's)."""
    check_int("i", i, 0, where="try_gpu")
    return _gpu(accelerator(), i) if num_gpus() > i else cpu()


def try_all_gpus() -> list[torch.device]:
    """All GPUs, else `[cpu]` (d2l 1.0.3 returns `[]`, which `devices[0]` fails on)."""
    return [_gpu(accelerator(), i) for i in range(num_gpus())] or [cpu()]


def _parse(device: str | torch.device, param: str = "device") -> torch.device:
    """`device` as a torch.device of a kind this suite uses (not checked to exist here)."""
    if not isinstance(device, str | torch.device):
        raise TypeError(
            f"{param} must be a string ({DEVICE_CHOICES}) or a torch.device; "
            f"got {type(device).__name__} {device!r}"
        )
    with contextlib.suppress(RuntimeError):
        if (dev := torch.device(device)).type in ("cpu", "meta", *GPU_TYPES):
            return dev
    raise ValueError(f"{param} must be {DEVICE_CHOICES}; got {device!r}")


def as_device(device: str | torch.device | None, param: str = "device") -> torch.device:
    """Parse a device argument with a clear error (None means `try_gpu()`)."""
    if device is None:
        return try_gpu()
    dev = _parse(device, param)
    if dev.type in GPU_TYPES:
        if accelerator() != dev.type:
            raise ValueError(
                f"{param} {device!r} asked for, but this machine has no {_NAMES[dev.type]} "
                "(use 'cpu', or devices.try_gpu())"
            )
        n = num_gpus()
        if dev.index is not None and dev.index >= n:
            raise ValueError(
                f"{param} {device!r} does not exist: this machine has {n} {dev.type} "
                f"device(s), {dev.type}:0 ... {dev.type}:{n - 1}"
            )
    return dev


def float64_device(device: str | torch.device) -> torch.device:
    """Where a float64 reference can be computed: `device` itself, else the CPU on an Apple GPU,
    which has no float64 (`.double()` of an MPS tensor raises)."""
    dev = _parse(device, "device")
    return torch.device("cpu") if dev.type == "mps" else dev


def synchronize(device: str | torch.device | None = None) -> None:
    """Wait for `device`'s queued work; None: *every* GPU's (a split model spans several)."""
    if isinstance(device, torch.device) and device.type == "cpu":
        return  # a CPU loop's hot path: the CPU runs eagerly
    dev = None if device is None else as_device(device)
    kind = accelerator() if dev is None else dev.type
    if kind in GPU_TYPES:
        for d in [dev] if dev is not None or kind == "mps" else range(num_gpus()):
            torch.accelerator.synchronize(d)


# --------------------------------------------------------------------------- memory counters
def has_peak_memory_counter(device: str | torch.device) -> bool:
    """CUDA and XPU count peak allocation; MPS and the CPU do not (callers count, and say so)."""
    return _parse(device).type in ("cuda", "xpu")


def memory_allocated(device: str | torch.device) -> int:
    """Bytes held by tensors on `device` now (the caching allocator's count; MPS: Metal's)."""
    dev = as_device(device)
    if dev.type == "mps":
        return int(torch.mps.current_allocated_memory())
    if dev.type not in ("cuda", "xpu"):
        raise ValueError(
            f"memory_allocated: {device!r} has no allocator counter (the CPU: use process RSS)"
        )
    return torch.accelerator.memory_allocated(dev)


def reset_peak_memory(device: str | torch.device) -> None:
    """Start a new peak-memory measurement on a CUDA/XPU device."""
    dev = _peak_counter(device, "reset_peak_memory")
    torch.accelerator.reset_peak_memory_stats(dev)


def max_memory_allocated(device: str | torch.device) -> int:
    """Peak bytes held by tensors on a CUDA/XPU device since `reset_peak_memory`."""
    dev = _peak_counter(device, "max_memory_allocated")
    return torch.accelerator.max_memory_allocated(dev)


def _peak_counter(device: str | torch.device, where: str) -> torch.device:
    if not has_peak_memory_counter(dev := as_device(device)):
        raise ValueError(f"{where}: {dev.type} has no peak-memory counter")
    return dev


def empty_cache(device: str | torch.device | None = None) -> None:
    """Give cached, unused accelerator memory back to the driver (the CPU caches none)."""
    if (accelerator() if device is None else _parse(device).type) in GPU_TYPES:
        torch.accelerator.empty_cache()


# ------------------------------------------------------------------- what a device can do
TECHNIQUES = ("gpu", "bf16", "fp16", "compile", "cuda graphs", "cudnn", "tf32", "fused SGD")


@dataclass(frozen=True)
class Capabilities:
    """What the suite does on a device. `skip` maps each technique it does not run there (one of
    `TECHNIQUES`; "gpu": the device itself) to why, in words for the learner."""

    kind: str  # "cuda", "mps", "xpu" or "cpu"
    name: str
    bf16: str  # "native", "emulated" (a CPU without bf16 instructions; CUDA below 8.0), "none"
    memory_gib: (
        float  # a GPU's memory (an Apple GPU: Metal's share of unified memory); the CPU: RAM
    )
    pin_memory: (
        bool  # pinned host memory speeds copies to it (CUDA, XPU; an Apple GPU shares the host's)
    )
    batch_budget_bytes: (
        int | None
    )  # a batch finder's limit; None: CUDA's own OOM error (elsewhere: swap first)
    skip: dict[str, str]

    def ok(self, what: str) -> bool:
        return check_choice("what", what, TECHNIQUES, where="Capabilities.ok") not in self.skip


def describe(device: str | torch.device | None = None) -> dict[str, Any]:
    """What `capabilities` decides from, read from torch (None: `try_gpu()`): kind, name,
    capability (CUDA), memory_gib, arch_list (this torch's CUDA code), bf16_hw (not CUDA),
    fused_sgd (a kernel)."""
    dev = try_gpu() if device is None else _parse(device)
    kind, mod = dev.type, getattr(torch, dev.type, None)
    d = {
        "kind": kind,
        "name": _NAMES.get(kind) or _cpu_name(),
        "memory_gib": psutil.virtual_memory().total / 2**30,
        "bf16_hw": bool({"avx512_bf16", "amx_bf16"} & set(_cpuinfo("flags").split()))
        if kind == "cpu"
        else False,
        "fused_sgd": kind in ("cuda", "cpu", "mps", "xpu"),
    }  # fused SGD kernels in every torch >= 2.11
    if kind in ("cuda", "xpu") and mod.is_available():
        p = mod.get_device_properties(dev.index or 0)
        d |= {
            "name": p.name,
            "memory_gib": p.total_memory / 2**30,
            "arch_list": mod.get_arch_list(),
        }
        d |= (
            {"capability": (p.major, p.minor)}
            if kind == "cuda"
            else {"bf16_hw": torch.xpu.is_bf16_supported()}
        )
    elif kind == "mps" and torch.backends.mps.is_available():
        d |= {
            "name": f"{_cpu_name()} GPU (Metal)",
            "memory_gib": torch.mps.recommended_max_memory() / 2**30,
            "bf16_hw": torch.backends.mps.is_macos_or_newer(14, 0),
        }
    return d


def capabilities(
    device: str | torch.device | None = None, described: dict[str, Any] | None = None
) -> Capabilities:
    """What the suite does on `device`, decided from `described` (default: `describe(device)`), so
    tests can pass a T4, a P100 or an Apple GPU on a machine that has none of them."""
    d = describe(device) if described is None else described
    kind, name, cap = _checked_description(d)
    cuda, cc = kind == "cuda", cap or (0, 0)
    who = f"{name} (compute capability {cc[0]}.{cc[1]})" if cap else name
    skip = (
        {"gpu": f"{who}: {why}"}
        if cuda and (why := _no_kernels(cap, d.get("arch_list") or []))
        else {}
    )
    bf16 = (
        "native"
        if (cc >= (8, 0) if cuda else d.get("bf16_hw"))
        else "emulated"
        if kind in ("cuda", "cpu")
        else "none"
    )
    skip |= _skipped_techniques(d, kind, who, cc, bf16)
    # half the memory, at most 8 GiB
    budget = None if cuda else int(min(8.0, d["memory_gib"] / 2) * 2**30)
    return Capabilities(
        kind, name, bf16, round(d["memory_gib"], 1), kind in ("cuda", "xpu"), budget, skip
    )


def _checked_description(d: Any) -> tuple[str, Any, Any]:
    """`capabilities`' check of a `describe()`-like dict: its (kind, name, capability), or a
    ValueError saying what is wrong."""
    if missing := {"kind", "name", "memory_gib"} - set(d if isinstance(d, dict) else {}):
        raise ValueError(
            f"capabilities: described must be a dict like describe()'s; it lacks {sorted(missing)}"
        )
    kind, name, cap = (
        check_choice("kind", d["kind"], ("cpu", *GPU_TYPES), where="capabilities"),
        d["name"],
        d.get("capability"),
    )
    if cap is not None and not (
        isinstance(cap, tuple) and len(cap) == 2 and all(type(x) is int for x in cap)
    ):
        raise ValueError(
            "capabilities: capability must be a (major, minor) pair of ints such as (8, 0), "
            f"got {cap!r}"
        )
    return kind, name, cap


def _skipped_techniques(
    d: dict[str, Any], kind: str, who: str, cc: tuple[int, int], bf16: str
) -> dict[str, str]:
    """The techniques `capabilities` skips on a `kind` device described by `d` (`who` names it,
    `cc` is its compute capability, (0, 0) when none), each with the reason."""
    cuda, skip = kind == "cuda", {}
    if bf16 == "none":
        skip["bf16"] = f"{who} has no bf16 (an Apple GPU: from macOS 14)"
    elif cuda and bf16 == "emulated":
        skip["bf16"] = (
            f"{who} has no native bf16 (that needs 8.0+); emulated bf16 would measure the emulation"
        )
    if not cuda:
        # fp16 + GradScaler is timed on CUDA GPUs only. The scaler itself is not CUDA-only:
        # torch.amp.GradScaler("cpu") is public and it has an MPS path
        # (https://docs.pytorch.org/docs/stable/amp.html#gradient-scaling,
        # https://github.com/pytorch/pytorch/blob/v2.14.0/torch/amp/grad_scaler.py). CPUs with
        # AVX512-FP16 (Intel Xeons from Sapphire Rapids on) or AMX-FP16 (Granite Rapids) run fp16
        # matmuls and convolutions fast through oneDNN
        # (https://docs.pytorch.org/docs/stable/amp.html#cpu-op-specific-behavior). The suite
        # does not detect them: it treats fp16 on every CPU as slow, as it is on the others.
        skip |= {
            "fp16": "fp16 + GradScaler is timed on CUDA GPUs only: the suite does not detect the "
            "CPUs with fast fp16 kernels (AVX512-FP16, AMX-FP16) and treats fp16 on a CPU as slow"
            if kind == "cpu"
            else f"fp16 + GradScaler is timed on CUDA GPUs only; the suite has not timed it on an "
            f"{_NAMES[kind]}",
            "cuda graphs": "needs a CUDA GPU",
            "cudnn": "cuDNN is NVIDIA's GPU library: no effect on this device",
            "tf32": "TF32 is an NVIDIA tensor-core format: no effect on this device",
        }
    elif cc < (8, 0):
        skip["tf32"] = f"{who} has no TF32 tensor cores (that needs 8.0+): no effect"
        skip |= {"fp16": f"{who} has no fast fp16 (that needs 5.3+)"} if cc < (5, 3) else {}
    if kind == "mps" or cc < (7, 0) and cuda:
        skip["compile"] = f"torch.compile makes no kernels for {who}: " + (
            "Triton needs compute capability 7.0+"
            if cuda
            else "the suite has not run Inductor's Metal code"
        )
    if not d.get("fused_sgd", True):
        skip["fused SGD"] = f"this torch has no fused SGD kernel for {kind}"
    return skip


def _no_kernels(cap: tuple[int, int] | None, archs: list[str]) -> str:
    """Why this torch has no kernels for a GPU of compute capability `cap`, or '' when it has
    (else the first launch fails: "no kernel image is available"). `sm_XY` code runs on major X,
    minor >= Y; `sm_XYa` on X.Y exactly; PTX (`compute_XY`) on any GPU at least that new."""
    if cap is None:
        return "no CUDA GPU here"
    if not archs:
        return "this torch has no CUDA kernels (a CPU-only build)"
    for arch in archs:
        if m := re.fullmatch(r"(sm|compute)_(\d+)(\d)(a?)f?", arch):
            major, minor, exact = int(m[2]), int(m[3]), m[4] == "a"
            if (
                (major, minor) <= cap
                if m[1] == "compute"
                else (major == cap[0] and (minor == cap[1] if exact else minor <= cap[1]))
            ):
                return ""
    return (
        f"this torch ships kernels for {', '.join(archs)}, "
        f"none of which runs on sm_{cap[0]}{cap[1]}: the notebooks run on the CPU "
        "(install a torch built for this GPU, e.g. an older CUDA build)"
    )


@functools.cache
def _cuda_refused() -> str:
    """Why CUDA GPU 0 is not used ('' when it is), decided once and said once."""
    why = capabilities("cuda").skip.get("gpu", "") if torch.cuda.is_available() else ""
    if why:
        print(f"GPU not used - {why}")
    return why


def _cpuinfo(field: str) -> str:
    """A field of /proc/cpuinfo ('' without one: macOS, Windows)."""
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith(field):
                return line.split(":", 1)[1].strip()
    return ""


def _cpu_name() -> str:
    """The CPU's model; on a Mac, the chip ('Apple M2 Pro': its CPU and GPU in one)."""
    if platform.system() == "Darwin":
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            return (
                subprocess.run(
                    ["sysctl", "-n", "machdep.cpu.brand_string"],
                    capture_output=True,
                    text=True,
                    timeout=5,
                ).stdout.strip()
                or platform.machine()
            )
    return _cpuinfo("model name") or platform.processor() or platform.machine()


def device_name(device: str | torch.device | None = None) -> str:
    """'NVIDIA H100 80GB HBM3' for a GPU, 'Apple M2 Pro GPU (Metal)', else the CPU's model."""
    dev = as_device(device)
    if dev.type in ("cuda", "xpu"):
        return getattr(torch, dev.type).get_device_name(dev)
    return f"{_cpu_name()} GPU (Metal)" if dev.type == "mps" else _cpu_name()


def _gpu_info(kind: str, i: int) -> dict[str, Any]:
    dev = _gpu(kind, i)
    p = None if kind == "mps" else getattr(torch, kind).get_device_properties(i)
    memory = (
        torch.mps.recommended_max_memory() if p is None else p.total_memory
    )  # MPS: Metal's share
    return {
        "index": i,
        "type": kind,
        "name": device_name(dev),
        "memory_gib": round(memory / 2**30, 1),
        "unified_memory": kind == "mps",
        "bf16": capabilities(dev).bf16,
        "capability": f"{p.major}.{p.minor}" if kind == "cuda" else None,
    }


def hardware_summary() -> dict[str, Any]:
    """What this machine has: CPU, RAM, GPUs, bf16, versions (saved with every result)."""
    kind = accelerator()
    return {
        "cpu": _cpu_name(),
        "cpu_cores_usable": usable_cores(),
        "cpu_cores_logical": os.cpu_count(),
        "ram_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "cpu_bf16_instructions": capabilities("cpu").bf16 == "native",
        "torch_threads": torch.get_num_threads(),
        "accelerator": kind,
        "gpus": [_gpu_info(kind, i) for i in range(num_gpus())],
        "gpu_not_used": _cuda_refused(),
        "cuda_version": torch.version.cuda,
        "torch": torch.__version__,
        "platform": platform.platform(),
    }


_DESCRIBED = {
    "cpu",
    "cpu_cores_usable",
    "cpu_cores_logical",
    "ram_gib",
    "cpu_bf16_instructions",
    "torch",
    "cuda_version",
    "torch_threads",
    "gpus",
}


def describe_hardware(summary: dict[str, Any] | None = None) -> str:
    """`hardware_summary()` (or its dict, `summary`) in a few lines; printed and returned."""
    s = hardware_summary() if summary is None else summary
    if (
        missing := sorted(_DESCRIBED - set(s))
        if isinstance(s, dict)
        else f"all: a {type(s).__name__}"
    ):
        raise ValueError(
            f"describe_hardware: summary must be hardware_summary()'s dict; it lacks {missing}"
        )
    build = f"CUDA build {s['cuda_version']}" if s["cuda_version"] else "no CUDA in this build"
    lines = [
        f"CPU   : {s['cpu']} ({s['cpu_cores_usable']} usable cores, "
        f"{s['cpu_cores_logical']} logical)",
        f"RAM   : {s['ram_gib']} GiB",
        f"bf16  : CPU advertises bf16 instructions = {s['cpu_bf16_instructions']} "
        "(faster? notebook 12 measures)",
        f"torch : {s['torch']} ({build}), {s['torch_threads']} intra-op threads",
    ]
    for g in s["gpus"]:
        shared = " of unified memory, shared with the CPU" if g.get("unified_memory") else ""
        cap = f", compute capability {g['capability']}" if g.get("capability") else ""
        lines.append(
            f"GPU {g['index']} : {g['name']}, {g['memory_gib']} GiB{shared}{cap}, bf16={g['bf16']}"
        )
    if not s["gpus"]:
        lines.append(
            f"GPU   : {s.get('gpu_not_used') or 'none found'} "
            "- every experiment runs on the CPU and says so"
        )
    text = "\n".join(lines)
    print(text)
    return text


# ------------------------------------------------------------------ fp32 matmuls and convolutions
FP32_PRECISIONS = ("ieee", "tf32")


@contextlib.contextmanager
def fp32_precision(precision: str) -> Iterator[str]:
    """fp32 matrix multiplies (cuBLAS) and convolutions (cuDNN) in `precision` inside the block,
    the previous settings after it (also after an error): "ieee" is true fp32, "tf32" lets NVIDIA
    tensor cores (compute capability 8.0+) round the inputs to TF32. Elsewhere the settings have
    no effect. PyTorch's defaults differ: matmuls "ieee", convolutions "tf32". Only the
    `fp32_precision` API is used: mixing it with the legacy `allow_tf32` flags or
    `set_float32_matmul_precision` raises in PyTorch (see
    https://pytorch.org/docs/stable/notes/cuda.html#tensorfloat-32-tf32-on-ampere-and-later-devices)."""
    check_choice("precision", precision, FP32_PRECISIONS, where="fp32_precision")
    matmul, conv = torch.backends.cuda.matmul, torch.backends.cudnn.conv
    before = matmul.fp32_precision, conv.fp32_precision  # process-wide, on any machine
    try:
        matmul.fp32_precision = precision
        conv.fp32_precision = precision
        yield precision
    finally:
        matmul.fp32_precision, conv.fp32_precision = before


# --------------------------------------------------------------------------- the CPU's threads
DEFAULT_THREADS = torch.get_num_threads()  # at import, before a notebook (re-run) changes it


@contextlib.contextmanager
def cpu_threads(n: int) -> Iterator[int]:
    """`torch.set_num_threads(n)` inside the block, the previous count after it. Untimed lessons
    use 1: tiny ops split over threads cost more in hand-offs (and waits at barriers) than they
    save."""
    check_int("n", n, 1, where="cpu_threads")
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield n
    finally:
        torch.set_num_threads(before)


usable_cores = processes.usable_cores  # the notebooks' name for it


def free_cores(window: float = 0.25) -> int:
    """Usable cores that other programs left idle over `window` seconds (at least 1): a core
    another program keeps busy is not ours to count on."""

    def busy() -> float:  # seconds of CPU time used on the whole machine, and by this process
        t = psutil.cpu_times()
        return sum(t) - t.idle - getattr(t, "iowait", 0.0) - sum(psutil.Process().cpu_times()[:2])

    t0, before = time.perf_counter(), busy()
    time.sleep(check_number("window", window, where="free_cores"))
    others = (busy() - before) / (time.perf_counter() - t0)
    return max(1, usable_cores() - round(others))


def share(processes: int = 1) -> int:
    """Intra-op threads each of `processes` busy processes (workers, ranks) may use: threads x
    processes <= the free cores. Past them, threads wait at every barrier for a partner that is
    not running: notebook 07 ran 10x slower beside one busy program on 2 cores."""
    check_int("processes", processes, 1, where="share")
    return max(1, free_cores() // processes)


def not_as_expected(
    device: str | torch.device | None = None, *, sizes: str = "", found: str = ""
) -> str:
    """The line a printed expectation ends with when it fails: what about this machine could
    explain it (its cores, its GPU's generation, the sizes run) before a busy machine, so a
    reader learns something from a "no" instead of only rerunning. `found`: what came out."""
    for name, value in (("sizes", sizes), ("found", found)):
        if not isinstance(value, str):
            raise TypeError(
                f"not_as_expected: {name} must be text (str), got {type(value).__name__} {value!r}"
            )
    d = describe(device)
    facts = [f"{usable_cores()} usable cores, {free_cores(0.1)} free now"]
    if d.get("capability"):
        facts.append(f"{d['name']}, compute capability {d['capability'][0]}.{d['capability'][1]}")
    elif d["kind"] != "cpu":
        facts.append(d["name"])
    else:
        facts.append("no GPU: the CPU runs the model too")
    if sizes:
        facts.append(f"sizes {sizes}")
    head = f"no, {found}" if found else "no"
    return (
        f"{head} - this machine may explain it ({'; '.join(facts)}: fewer cores, an older GPU "
        "or smaller sizes shrink the effect); else a busy machine: run it again"
    )

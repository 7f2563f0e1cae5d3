"""Sentences checked against PyTorch's documentation and source: each wrong sentence is gone, and
its correction carries a link a learner can follow (an http(s) URL in the same markdown cell, or
in the same block of code, comment or docstring)."""

import re
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
URL = re.compile(r"https?://\S+")

# (file, wrong phrase, a phrase of its correction); whitespace is normalised before matching
ITEMS = {
    "06-two-activations-per-block": (
        "notebooks/07_batch_size_and_accumulation.ipynb",
        "keeps three activations per block",
        "keeps two activations per block",
    ),
    "10-fp16-reason-notebook": (
        "notebooks/12_mixed_precision.ipynb",
        "is a CUDA-GPU technique",
        'torch.amp.GradScaler("cpu")',
    ),
    "devices-fp16-reason": (
        "helpers/devices.py",
        "is a CUDA-GPU technique",
        "fp16 + GradScaler is timed on CUDA GPUs only",
    ),
    "devices-cpu-fp16": (
        "helpers/devices.py",
        "a CPU has no fast fp16 kernels",
        "CPUs with fast fp16 kernels (AVX512-FP16, AMX-FP16) and treats fp16 on a CPU as slow",
    ),
    "claims-l17-average-busy": (
        "helpers/suite/claims.py",
        "2 sequential stages are busy at most 50 %",
        "busy at most 50 % on average, the slower one more",
    ),
    "diagnose-busy-is-device-bound": (
        "helpers/diagnose.py",
        "bound by its arithmetic",
        "device-bound, the device (not the host) is the",
    ),
    "04-grain-size-chunks": (
        "notebooks/05_cpu_threads.ipynb",
        "is cut into one chunk per thread",
        "min(threads, ⌈elements / 32,768⌉)",
    ),
    "00-tf32-in-notebook-11": (
        "notebooks/00_your_machine_and_timing.ipynb",
        "notebook 10 measures both",
        "notebook 11 TF32",
    ),
    "01-tf32-in-notebook-11": (
        "notebooks/01_why_is_it_slow.ipynb",
        "on the same hardware: TF32, bf16, fp16 | 10 |",
        "(11) | 11, 12 |",
    ),
    "11-compute-capability": (
        "notebooks/13_compiler_and_cuda_graphs.ipynb",
        "CUDA 7.0+",
        "compute capability 7.0+",
    ),
    "10-fp16-subnormals": (
        "notebooks/12_mixed_precision.ipynb",
        "smallest normal number is about 6e-5, so small gradients round to zero",
        "half the smallest subnormal",
    ),
    "11-recompile-limit": (
        "notebooks/13_compiler_and_cuda_graphs.ipynb",
        "recompiles for every new shape, `dynamic=True`",
        "torch._dynamo.config.recompile_limit",
    ),
    "17-xpu-profiler-notebook": (
        "notebooks/04_profiling.ipynb",
        "on Apple's MPS and Intel's XPU, `torch.profiler` here records the CPU side only",
        "no MPS member",
    ),
    "diagnose-xpu-activity": (
        "helpers/diagnose.py",
        "torch.profiler times no kernels (MPS, XPU)",
        "ProfilerActivity.XPU",
    ),
    "08-mps-still-copies": (
        "notebooks/09_device_placement.ipynb",
        "nothing to pin and no copy to",
        "still copies into a Metal buffer",
    ),
    "models-b200-fp32": (
        "helpers/models.py",
        "None = the card has no such hardware path.",
        "sourced from NVIDIA's B200 datasheet",
    ),
    "models-v100-pcie": ("helpers/models.py", '(r"V100", {', 'r"V100-PCIE"'),
    "07-non-blocking-syncs": (
        "notebooks/08_item_hygiene.ipynb",
        "already syncs (a `DataLoader` without pinned memory",
        "`non_blocking=False`",
    ),
}


def _flat(text: str) -> str:
    return " ".join(text.split())


def _blocks(path: Path) -> list[str]:
    """A notebook's cells, or a module's runs of non-blank lines."""
    if path.suffix == ".ipynb":
        return [c.source for c in nbformat.read(path, as_version=4).cells]
    return re.split(r"\n\s*\n", path.read_text())


@pytest.mark.parametrize("file, wrong, right", list(ITEMS.values()), ids=list(ITEMS))
def test_the_wrong_sentence_is_gone_and_its_correction_links_a_source(file, wrong, right):
    blocks = _blocks(ROOT / file)
    assert not any(_flat(wrong) in _flat(b) for b in blocks), f"{file} still says {wrong!r}"
    fixed = [b for b in blocks if _flat(right) in _flat(b)]
    assert fixed, f"{file} lacks the correction {right!r}"
    assert all(URL.search(b) for b in fixed), f"{file}: {right!r} has no link beside it"

"""Facts the notebooks once got wrong stay corrected.

Each wrong sentence (a distinctive part of it) must be absent from every notebook, and each place
that was corrected must still say the right thing next to the source a learner can follow: the
phrase and its link in the same cell. Whitespace and line breaks are ignored when matching.
"""

import json
import re
from pathlib import Path

import pytest

NOTEBOOKS = sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("*.ipynb"))
PT = "https://docs.pytorch.org/docs/stable"
D2L = "https://d2l.ai/chapter_computational-performance/multiple-gpus-concise.html"
DALI = "https://docs.nvidia.com/deeplearning/dali/user-guide/docs/operations/nvidia.dali.fn.decoders.image.html"

# (wrong text, what is true instead): none of these may come back in any notebook.
WRONG = [
    (
        "fp32 and the low precisions do exactly the same work",
        (
            "the fused optimizer differed between precisions; "
            "every precision now uses the same plain SGD"
        ),
    ),
    (
        "use `non_blocking=True` to overlap them with compute",
        "overlap needs the copy on a second stream, with the compute queued on the default one",
    ),
    ("decode (nvJPEG) and augmentation", "the files are PNG: DALI decodes PNG on the CPU"),
    ("also run on the GPU straight from the files", "DALI decodes PNG on the CPU"),
    ("30 minutes by default", "init_process_group: 10 minutes for NCCL, 30 for the other backends"),
    ("it never gives your own process more", "empty_cache may reduce fragmentation in some cases"),
    ("Never call `empty_cache()` in the training loop", "keep it out of the per-step loop"),
    (
        "`torch.cuda.set_sync_debug_mode` finds them for you",
        "experimental: not every synchronising call warns",
    ),
    ("points at the lines that sync.", "it points at many of them, not all"),
    (
        "reads `CUDA_VISIBLE_DEVICES` **when the process starts**",
        "it is read when CUDA initialises, lazily",
    ),
    (
        "about the best this device does for dense arithmetic",
        "TF32/bf16 tensor cores run several times faster than an fp32 matmul",
    ),
    ("a roofline number", "a roofline needs a bandwidth term: it is a matmul rate"),
    ("and no new allocations", "capture allocates from a private pool; it forbids synchronisation"),
    ("60,000-image epoch in about a second", "never measured here"),
    ("on one V100", "the source article does not name its GPU"),
    ("over every GPU it finds", "d2l uses its first num_gpus devices"),
    ("On Linux, workers are started by `fork`", "fork up to Python 3.13, forkserver from 3.14"),
    ("cuts the batch's memory and the bytes copied 4×", "only the host batch and the copy shrink"),
    ("4x, not ~5x", "the article's 5x includes int64 masks stored as uint8"),
    ("is exactly the same augmentation", "the check asserts each output is a valid crop/flip"),
    (
        "**exactly** when each loss is divided by `k` and",
        "not for token losses over unequal counts (padding, ignore_index)",
    ),
    (
        "an unsynchronised stopwatch reads less than the real time",
        "a chart title follows its data (it is built from the measured readings)",
    ),
    (
        "the shards plus the largest layer",
        "prefetching holds two unsharded units; the root stays unsharded after forward",
    ),
    (
        "need `torchvision.transforms.v2` on batches",
        "a random v2 transform on a batch tensor applies one transformation to all its images",
    ),
    (
        "first moves plain_net to the first",
        "DataParallel moves the module only when given one device; with two or more it must "
        "already be on device_ids[0]",
    ),
    ("DataParallel moved plain_net to a GPU", "with two or more GPUs DataParallel moves nothing"),
    (
        "set in `os.environ` of a running Python it changes nothing there",
        "set in os.environ before `import torch` it works; once torch is imported it does not",
    ),
    ("`OMP_NUM_THREADS` is read once, at a process's start", "it is read when torch loads OpenMP"),
    (
        "a CPU has no fast fp16 kernels",
        "CPUs with AVX512-FP16 or AMX-FP16 have fast fp16 kernels; the suite does not detect them",
    ),
    (
        "vanish once they fall below fp16's smallest subnormal",
        "they round to zero below about 3e-8, half the smallest subnormal 2^-24",
    ),
    (
        "each device idles at least half the time",
        "on average K stages are busy 1/K of the time; the slower stage more, the faster less",
    ),
    ("each busy at most half the step", "busy at most half the step on average"),
    ("so each stage is busy for only about half", "on average; the slower stage is busy more"),
    (
        "bound by its arithmetic",
        "a busy device is the limit; arithmetic or memory takes the kernel view",
    ),
    (
        "**compute-bound** (the device's arithmetic)",
        "device-bound: busy time counts memory-bound kernels too",
    ),
    ("-> compute-bound (GPU kernels", "device busy >= 50 % means device-bound, not compute-bound"),
    ("| the device's arithmetic | device busy", "the device (its kernels: arithmetic or memory)"),
    (
        "It needs hardware support (NVIDIA Ampere+",
        "bf16 also runs without the hardware, emulated and slow; it is fast only with it",
    ),
    (
        "path is the same, the cost is a lower bound",
        "a copy between GPUs (PCIe, NVLink) can be slower or far faster than a host memory copy",
    ),
    (
        "add up to exactly those of the whole batch",
        "equal micro-batches, up to rounding, and no batch norm (it sees each micro-batch alone)",
    ),
    # skeptic reread: 08, 10, 11, 13, 14
    (
        "`t.cpu()`, `t.numpy()` - copy a tensor",
        "Tensor.numpy() raises on a GPU tensor; numpy(force=True) copies it to the host first",
    ),
    (
        "only switches dropout and batch norm to their evaluation",
        "eval() reaches every module; it changes those with an evaluation behaviour, such as these",
    ),
    (
        "and re-tunes every time they change",
        "each new shape is tuned once; a seen shape keeps its pick",
    ),
    (
        "ATen does not use its NHWC convolution kernels for float64",
        "cuDNN and oneDNN skip NHWC for float64; a CPU's slow_conv2d runs float64 in NHWC",
    ),
    ("*symbolic* size that then serves every size", "sizes 0 and 1 stay specialised"),
    ("which then serves every later size", "every later size but 0 and 1, always specialised"),
    (
        "launch cost (several microseconds each)",
        "no source for the number: a per-kernel cost that can dominate short kernels",
    ),
    # skeptic reread: 00-03, 07
    (
        "smaller products are mostly launch overhead",
        "a 1024x1024 product is not mostly launch overhead on a large GPU; it may not fill it",
    ),
    (
        "(on a GPU with tensor cores: TF32, bf16, fp16)",
        "TF32 and bf16 tensor cores start with Ampere; Volta and Turing (a T4) have fp16 ones only",
    ),
    ("in main memory (a GPU's HBM)", "many GPUs (a T4, GeForce cards) use GDDR, not HBM"),
    (
        "with tensor cores, the bf16 roof above it",
        "bf16 tensor cores start with Ampere; Volta and Turing have fp16 ones",
    ),
    (
        "with tensor cores, TF32, bf16 and fp16 roofs are",
        "TF32 and bf16 need an Ampere or newer GPU; a T4's tensor cores run fp16 only",
    ),
    (
        "Workers end when their loader's iterator is garbage-collected",
        "without persistent_workers they also end when the iterator finishes its pass",
    ),
    (
        "cuDNN's workspace: 66 MiB on an H100",
        "66 MiB was a whole batch-8 step's peak on an H100, the workspace included",
    ),
    (
        "On a CPU there is no out-of-memory error to catch",
        "an allocation the OS refuses outright raises a RuntimeError; no torch.OutOfMemoryError",
    ),
    (
        "`k` times the big batch's - as if the learning rate",
        "only with plain SGD; Adam's step is nearly invariant to a constant gradient scale",
    ),
    (
        "it is usually harmless with micro-batches of 16 or more",
        "one measurement (ResNet-50 on ImageNet, Wu & He 2018): little loss down to 16 per batch",
    ),
    # skeptic reread: 15, 16, 18, 19, 20
    (
        "`SyncBatchNorm` all-reduces the batch statistics",
        "it all-gathers each rank's mean, inverse std and count (counts may differ), then combines",
    ),
    (
        "implements it for GPUs only",
        "SyncBatchNorm runs on CUDA, XPU, HPU and custom accelerators; not on a CPU or MPS",
    ),
    ("`SyncBatchNorm` (GPU only)", "not on a CPU; CUDA and a few other accelerators"),
    (
        "so it must end with the same weights",
        "the same weights up to float rounding (the check allows 1e-4)",
    ),
    (
        "It is exact: N processes",
        "exact up to float rounding, and only for a loss averaged over the batch",
    ),
    (
        "it is the cheapest it will ever be",
        "gloo over loopback shares the cores with the compute; NVLink or InfiniBand can be cheaper",
    ),
    (
        "the gain here is a lower bound of the gain between machines",
        "the saving depends on the all-reduce and the compute of the machines it runs on",
    ),
    (
        "if one process dies, the others would wait until their",
        "gloo's ranks fail as soon as the dead rank's connections close; a hung rank holds them",
    ),
    (
        "NCCL ranks wait in the same way",
        "gloo's ranks do not wait for the timeout when a rank dies",
    ),
    (
        "Left alone, the survivors would wait out the",
        "gloo's survivors fail once the dead rank's sockets close",
    ),
    (
        "the others would wait in their next collective until its timeout",
        "an error (closed connections) or the timeout ends them",
    ),
    ("DDP's single all-reduce", "DDP all-reduces gradient buckets (25 MiB, the first 1 MiB)"),
    (
        "a model 4-8 times too big for one device",
        "under 8x: the activations and the gathered layers need room too",
    ),
    ("a CPU has no datasheet peak", "the suite's peak table lists NVIDIA GPUs only"),
    ("is the big step (about 2x here)", "no committed CPU run gives that factor"),
    (
        "`print(t)` (no op runs there)",
        "print runs its formatting ops with Python dispatch modes switched off",
    ),
]

# (notebook prefix, corrected phrase, its source or None for a phrase built from the measurement).
CORRECTED = [
    ("00", "when CUDA initialises** in the process - lazily", f"{PT}/cuda.html"),
    (
        "00",
        "what it lists from 0 ([CUDA environment variables]",
        "https://docs.nvidia.com/cuda/cuda-programming-guide/05-appendices/environment-variables.html",
    ),
    ("00", "a matmul rate to keep in mind", "https://doi.org/10.1145/1498765.1498785"),
    (
        "00",
        "multiply in TF32 and bf16 on tensor cores several times faster",
        f"{PT}/notes/cuda.html#tensorfloat-32-tf32-on-ampere-and-later-devices",
    ),
    ("00", "synchronised reading = {synced / unsynced:.2f}x the unsynchronised one", None),
    (
        "01",
        "fp32 is not that best on a GPU with tensor cores",
        f"{PT}/notes/cuda.html#tensorfloat-32-tf32-on-ampere-and-later-devices",
    ),
    (
        "01",
        "it runs at most at `min(peak FLOP/s, bandwidth x intensity)`",
        "https://doi.org/10.1145/1498765.1498785",
    ),
    (
        "02",
        "because its batch also carries segmentation masks, stored as int64",
        "https://towardsdatascience.com/efficient-pytorch-part-1-fe40ed5db76c",
    ),
    ("02", "the article's ~5x adds int64 masks cut to uint8", None),
    (
        "03",
        "From Python 3.14 Linux defaults to `forkserver`",
        "https://docs.python.org/3/library/multiprocessing.html#contexts-and-start-methods",
    ),
    (
        "03",
        "The article's arithmetic",
        "https://towardsdatascience.com/efficient-pytorch-part-1-fe40ed5db76c",
    ),
    ("06", "CPU (its GPU decoder, nvJPEG, is for JPEG) and augmented on the GPU", DALI),
    ("06", "decodes these PNGs on the CPU: its GPU decoder is for JPEG", DALI),
    ("06", "asserts that every output is *a* valid pad-and-crop", None),
    ("06", "L6 and L7 come from", "https://github.com/tanglang96/DataLoaders_DALI"),
    (
        "07",
        "A token-level loss with padding or `ignore_index` averages over a different number",
        f"{PT}/generated/torch.nn.CrossEntropyLoss.html",
    ),
    ("07", "The article's loop (William Falcon's", None),
    (
        "08",
        "flags many of them (an experimental switch: not every synchronising call warns",
        f"{PT}/generated/torch.cuda.set_sync_debug_mode.html",
    ),
    (
        "08",
        "points at many of the lines that sync, not all",
        f"{PT}/generated/torch.cuda.set_sync_debug_mode.html",
    ),
    (
        "09",
        "it may reduce fragmentation in some cases",
        f"{PT}/generated/torch.cuda.empty_cache.html",
    ),
    (
        "09",
        "releases only cached blocks that hold no tensor",
        f"{PT}/notes/cuda.html#memory-management",
    ),
    (
        "09",
        "the copy overlaps compute only on a second stream",
        f"{PT}/notes/cuda.html#cuda-streams",
    ),
    ("09", "so a per-step loop has no use for it", f"{PT}/generated/torch.cuda.empty_cache.html"),
    ("12", "Every variant below uses the *same* optimizer (plain SGD, nothing fused)", None),
    ("13", "no CPU-GPU synchronisation inside", f"{PT}/notes/cuda.html#constraints"),
    (
        "13",
        "private memory pool kept for the graph's replays",
        f"{PT}/notes/cuda.html#graph-memory-management",
    ),
    (
        "18",
        "by default 10 minutes with NCCL and 30 with gloo",
        f"{PT}/distributed.html#torch.distributed.init_process_group",
    ),
    ("18", "two while prefetching overlaps the next all-gather", f"{PT}/notes/fsdp.html"),
    (
        "18",
        "and the root's, kept after forward by default",
        f"{PT}/distributed.fsdp.fully_shard.html",
    ),
    ("19", "reports 12.2 s per epoch on an unnamed GPU", D2L),
    ("19", "over its first `num_gpus` GPUs", D2L),
    (
        "06",
        "applies the same transformation to every image of the batch",
        "https://docs.pytorch.org/vision/stable/transforms.html",
    ),
    (
        "09",
        "with two or more, the model must already be on `device_ids[0]`",
        f"{PT}/generated/torch.nn.DataParallel.html",
    ),
    (
        "09",
        "moves the module to device_ids[0] only when it has one device",
        f"{PT}/generated/torch.nn.DataParallel.html",
    ),
    (
        "05",
        "Once torch is imported, setting it changes nothing in that process",
        f"{PT}/notes/cpu_threading_torchscript_inference.html",
    ),
    (
        "05",
        "is read once, when `import torch` loads OpenMP",
        f"{PT}/notes/cpu_threading_torchscript_inference.html",
    ),
    ("12", "but the suite does not detect them", f"{PT}/amp.html#cpu-op-specific-behavior"),
    (
        "12",
        "fp16 gradients round to zero below about 3e-8: half fp16's smallest subnormal",
        f"{PT}/amp.html#gradient-scaling",
    ),
    (
        "17",
        "the slower stage is busy more, the faster one less",
        f"{PT}/distributed.pipelining.html",
    ),
    (
        "17",
        "2 sequential stages: one works at a time, so on average they are busy at most",
        f"{PT}/distributed.pipelining.html",
    ),
    (
        "17",
        "the slower stage is busy more of it, the faster one less",
        "https://arxiv.org/abs/1811.06965",
    ),
    ("04", "busy time counts memory-bound kernels too", f"{PT}/profiler.html"),
    (
        "04",
        "device-bound, the device (not the host) is the limit",
        f"{PT}/profiler.html",
    ),
    (
        "12",
        "It is fast only with hardware support",
        "https://docs.nvidia.com/cuda/ampere-tuning-guide/index.html",
    ),
    (
        "17",
        "batch norm normalises each micro-batch alone",
        "https://arxiv.org/abs/1811.06965",
    ),
    (
        "17",
        "can be slower or many times faster than one memory copy on this machine",
        "https://www.nvidia.com/en-us/data-center/nvlink/",
    ),
    # skeptic reread: 08, 10, 11, 13, 14
    (
        "08",
        "`t.numpy(force=True)` - copy a tensor to the host",
        f"{PT}/generated/torch.Tensor.numpy.html",
    ),
    (
        "10",
        "only switches modules with an evaluation behaviour, such as dropout and batch norm",
        f"{PT}/generated/torch.nn.Module.html#torch.nn.Module.eval",
    ),
    (
        "11",
        "tunes again for each shape it has not seen",
        f"{PT}/notes/randomness.html#cuda-convolution-benchmarking",
    ),
    (
        "11",
        "cuDNN and oneDNN do not run float64 in NHWC",
        "https://github.com/pytorch/pytorch/blob/v2.14.0/aten/src/ATen/native/ConvUtils.h",
    ),
    (
        "13",
        "which serves every later size but 0 and 1",
        f"{PT}/user_guide/torch_compiler/compile/dynamic_shapes_zero_one_specialization.html",
    ),
    (
        "13",
        "which can dominate small models and small batches",
        "https://docs.nvidia.com/cuda/cuda-programming-guide/04-special-topics/cuda-graphs.html",
    ),
    # skeptic reread: 00-03, 07
    (
        "00",
        "smaller products may not fill the GPU",
        "https://docs.nvidia.com/deeplearning/performance/dl-performance-matrix-multiplication/index.html",
    ),
    (
        "01",
        "on an Ampere or newer GPU: TF32, bf16, fp16",
        "https://docs.nvidia.com/cuda/ampere-tuning-guide/index.html",
    ),
    (
        "01",
        "HBM, or GDDR on cards such as the",
        "https://www.nvidia.com/en-us/data-center/tesla-t4/",
    ),
    (
        "01",
        "the fp16 roof (and, from Ampere, bf16's)",
        "https://docs.nvidia.com/cuda/ampere-tuning-guide/index.html",
    ),
    (
        "01",
        "or newer GPUs, TF32, bf16 and fp16 roofs are several times higher",
        f"{PT}/notes/cuda.html#tensorfloat-32-tf32-on-ampere-and-later-devices",
    ),
    (
        "03",
        "when their iterator finishes its pass or is garbage-collected",
        "https://github.com/pytorch/pytorch/blob/v2.14.0/torch/utils/data/dataloader.py",
    ),
    ("07", "batch 8 peaked at 66 MiB on an H100", None),
    (
        "07",
        "only an allocation the OS refuses outright raises",
        "https://docs.kernel.org/mm/overcommit-accounting.html",
    ),
    ("07", "divides most of that scale away", f"{PT}/generated/torch.optim.Adam.html"),
    (
        "07",
        "batch norm lost little down to 16 images per batch",
        "https://arxiv.org/abs/1803.08494",
    ),
    # skeptic reread: 15, 16, 18, 19, 20
    (
        "16",
        "all-gathers every rank's batch statistics",
        "https://github.com/pytorch/pytorch/blob/main/torch/nn/modules/_functions.py",
    ),
    (
        "16",
        "not for the CPU or an Apple GPU",
        "https://github.com/pytorch/pytorch/blob/main/torch/nn/modules/batchnorm.py",
    ),
    (
        "16",
        "for a loss averaged over the batch",
        f"{PT}/generated/torch.nn.parallel.DistributedDataParallel.html",
    ),
    (
        "16",
        "so it holds for this machine only",
        f"{PT}/generated/torch.nn.parallel.DistributedDataParallel.html",
    ),
    (
        "18",
        "gloo's ranks fail as soon as its connections close",
        "https://github.com/pytorch/gloo/blob/main/gloo/transport/tcp/pair.cc",
    ),
    (
        "18",
        "Left alone, gloo's survivors fail once the dead",
        "https://github.com/pytorch/gloo/blob/main/gloo/transport/tcp/pair.cc",
    ),
    (
        "18",
        "DDP's all-reduce of its gradient buckets",
        f"{PT}/generated/torch.nn.parallel.DistributedDataParallel.html",
    ),
    (
        "18",
        "less than 8 times: the activations and the gathered layers",
        f"{PT}/distributed.fsdp.fully_shard.html",
    ),
    (
        "20",
        "`print` runs its ops with dispatch modes switched off",
        "https://github.com/pytorch/pytorch/blob/main/torch/_tensor_str.py",
    ),
]


def _flat(text: str) -> str:
    """`text` with runs of white space as one space, and a string literal split across lines by
    implicit concatenation ('... " "f"...') joined again: formatting must not hide a phrase."""
    return re.sub(r"\s+", " ", re.sub(r"([\"'])\s*\n\s*[fr]?\1", "", text))


def _cells(path: Path) -> list[str]:
    return [
        _flat("".join(c["source"])) for c in json.loads(path.read_text(encoding="utf-8"))["cells"]
    ]


CELLS = {p.name: _cells(p) for p in NOTEBOOKS}


def test_every_notebook_is_read():
    assert len(CELLS) >= 13 and all(CELLS.values())


@pytest.mark.parametrize("wrong, truth", WRONG, ids=[w[:40] for w, _ in WRONG])
def test_wrong_sentence_is_gone(wrong, truth):
    found = [name for name, cells in CELLS.items() if any(_flat(wrong) in c for c in cells)]
    assert found == [], f"{found} say {wrong!r} again; true instead: {truth}"


@pytest.mark.parametrize(
    "prefix, phrase, url", CORRECTED, ids=[f"{p}:{s[:40]}" for p, s, _ in CORRECTED]
)
def test_corrected_phrase_carries_its_source(prefix, phrase, url):
    names = [n for n in CELLS if n.startswith(prefix + "_")]
    assert len(names) == 1, f"one notebook numbered {prefix}, found {names}"
    cells = [c for c in CELLS[names[0]] if _flat(phrase) in c]
    assert cells, f"{names[0]} no longer says {phrase!r}"
    if url is not None:
        assert any(url in c for c in cells), f"{names[0]}: {phrase!r} lost its source {url}"

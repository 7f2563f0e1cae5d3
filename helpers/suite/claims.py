"""The claims ledger, and the one rule per claim that turns measurements into its verdict: the
quantities it compares, its thresholds and their source (the article's number, a physical fact or
a stated tolerance), every verdict it can return (tests/test_claims.py reaches each). Notebooks
call `judge` through `Recorder.judge`; the report shows the rule beside the verdict.

    verdict = judge("L3", mem_ratio=4.0, copy_gain=None)   # -> "needs a GPU"
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

# The claims by id; which notebooks test each is written once, in notebooks/catalog.toml.
CLAIMS: dict[str, str] = {
    "L1": "More DataLoader workers make loading faster ('use 10 workers').",
    "L2": "Each worker holds whole batches, so N workers need about N x the batch RAM.",
    "L3": "Keeping images uint8 and normalising on the device cuts batch memory ~5x and speeds host-to-device copies.",
    "L4": "Holding the data set in RAM removes the slowest retrieval step; a RAM disk alone may not help when the CPU is the bottleneck.",
    "L5": "Preprocess offline (resize, grayscale, ...) once instead of every epoch.",
    "L6": "Moving decoding and augmentation to the GPU (DALI-style) can cut epoch time by an order of magnitude.",
    "L7": "Decoding CIFAR from lossy JPEG copies instead of the original binary costs accuracy.",
    "L8": "Gradient accumulation over k steps gives the same update as a k x larger batch.",
    "L9": "Appending the loss tensor (not loss.item()) to a list keeps every step's graph alive and grows memory.",
    "L10": "Moving tensors back and forth between CPU and GPU is expensive.",
    "L11": "torch.cuda.empty_cache() in a training loop is a bad idea (it stalls).",
    "L12": "16-bit mixed precision trains faster and uses less memory; a loss scaler keeps small gradients alive.",
    "L13": "On a 506-row data set a GPU is no faster than a CPU and may be slower.",
    "L14": "nn.DataParallel gathers outputs on GPU 0 (more memory there); loss inside forward reduces the imbalance.",
    "L15": "DistributedDataParallel is much faster than DataParallel on one machine.",
    "L16": "DataParallel checkpoints carry a 'module.' prefix; loading elsewhere needs map_location.",
    "L17": "Splitting a model across devices works, but sequential stages idle and the hand-off costs.",
    "L18": "Data parallelism needs the batch (and often the learning rate) scaled; batch-norm statistics become per device.",
    "L19": "Use an even number of GPUs; an odd number may crash training.",
    "L20": "A Python loop over elements in a custom loss is slow; the vectorised version can be ~100x faster.",
    "L21": "Profile first: find whether training is CPU-, I/O- or GPU-bound before optimising.",
    "L22": "Faster hardware can be worth more than further code optimisation (time vs money).",
    "L23": "d2l ResNet-18 on Fashion-MNIST: 1 GPU 0.93 acc at 12.2 s/epoch; 2 GPUs batch 512 lr 0.2 faster but accuracy dropped.",
}

# Verdicts start with one of these; "holds only when" is followed by the condition.
VERDICT_KINDS = ("holds", "holds only when", "does not hold here", "advice", "needs a GPU", "needs >=2 GPUs",
                 "needs the real data set", "needs a run on other hardware")

HOLDS, NOT_HERE = "holds", "does not hold here"
GPU, GPUS2, REAL_DATA = "needs a GPU", "needs >=2 GPUs", "needs the real data set"


def kind_of(verdict: str) -> str:
    """The verdict's kind: the longest of `VERDICT_KINDS` it starts with."""
    return max((k for k in VERDICT_KINDS if verdict.startswith(k)), key=len, default="")


@dataclass(frozen=True)
class Rule:
    claim: str
    compares: str                 # the measured quantities, in words
    threshold: str                # each number, and where it comes from
    verdicts: tuple[str, ...]     # every verdict `decide` can return
    decide: Callable[..., str]
    advice: bool = False          # advice, not a measurable statement: verdicts say "advice"


RULES: dict[str, Rule] = {}


def rule(claim: str, compares: str, threshold: str, verdicts: tuple[str, ...],
         advice: bool = False) -> Callable:
    """Register the decorated function as `claim`'s `Rule.decide`."""
    return lambda decide: RULES.setdefault(claim, Rule(claim, compares, threshold, verdicts, decide, advice))


def judge(claim: str, **measured: Any) -> str:
    """The verdict on `claim` from the measured quantities its rule names."""
    if (r := RULES.get(claim)) is None:
        raise ValueError(f"judge: unknown claim {claim!r}; valid ids are L1 ... L{len(CLAIMS)}")
    try:
        verdict = r.decide(**measured)
    except TypeError as e:
        raise TypeError(f"judge({claim!r}): the rule compares {r.compares}; {e}") from None
    assert verdict in r.verdicts, f"rule {claim} returned {verdict!r}, not one of its verdicts"
    return verdict


# Run-to-run noise on a shared machine is several percent; ratios within 10 % of 1 are "no change".
NOISE = "10 % tolerance for run-to-run noise"


@rule("L1", "samples/s of the best worker count vs 0 workers; best past the cores vs best up to them",
      f"gain >= 1.1 ({NOISE}); past-the-cores >= 1.1x the best within them for 'holds'",
      (NOT_HERE, HOLDS, "holds only when workers <= usable cores"))
def _l1(gain: float, past_vs_within: float | None) -> str:
    if gain < 1.1:
        return NOT_HERE
    if past_vs_within is not None and past_vs_within > 1.1:
        return HOLDS
    return "holds only when workers <= usable cores"


@rule("L2", "physical memory loading added vs workers x prefetch x batch (the article's arithmetic)",
      "within a factor 2 of the arithmetic (stated tolerance); above it while growing with the batch: lower bound",
      (HOLDS, "holds only when read as a lower bound", NOT_HERE))
def _l2(added_vs_arithmetic: float, added_growth_mb: float) -> str:
    if 0.5 <= added_vs_arithmetic <= 2:
        return HOLDS
    if added_vs_arithmetic > 2 and added_growth_mb > 0:
        return "holds only when read as a lower bound"
    return NOT_HERE


@rule("L3", "batch bytes float32 / uint8, and host-to-device copy time float32 / uint8 (pinned)",
      "memory >= 3.5x (physical: 4 bytes vs 1; the article says ~5x); copy >= 2x (half the 4x bytes, "
      f"stated tolerance) for 'holds', >= 1.1x ({NOISE}) for 'holds only when'",
      (GPU, HOLDS, "holds only when the copy is large enough to be bandwidth-bound", NOT_HERE))
def _l3(mem_ratio: float, copy_gain: float | None) -> str:
    if mem_ratio < 3.5:
        return NOT_HERE
    if copy_gain is None:
        return GPU
    if copy_gain >= 2:
        return HOLDS
    return "holds only when the copy is large enough to be bandwidth-bound" if copy_gain >= 1.1 else NOT_HERE


@rule("L4", "samples/s with the data held in RAM vs read from files; share of a sample's time spent "
      "reading; RAM disk vs files (when measured)",
      "in RAM >= 1.2x files (20 %: beyond run-to-run noise); the caveat is contradicted when the CPU is the "
      "bottleneck (reading < 25 % of a sample's time) yet a RAM disk alone gains >= 1.2x",
      (HOLDS, "holds only when the files are read from a slow disk", NOT_HERE))
def _l4(in_ram_gain: float, read_share: float, ramdisk_gain: float | None = None) -> str:
    if in_ram_gain < 1.2:
        return NOT_HERE
    if ramdisk_gain is not None and ramdisk_gain >= 1.2 and read_share < 0.25:
        return "holds only when the files are read from a slow disk"
    return HOLDS


@rule("L5", "epoch time with the resize in the per-epoch transform vs on data resized once offline",
      f">= 1.5x for 'holds' (stated tolerance), >= 1.1x ({NOISE}) for 'holds only when'",
      (HOLDS, "holds only when the preprocessing is a large part of the epoch", NOT_HERE))
def _l5(gain: float) -> str:
    if gain >= 1.5:
        return HOLDS
    return "holds only when the preprocessing is a large part of the epoch" if gain >= 1.1 else NOT_HERE


@rule("L6", "epoch time (a) CPU pipeline / (c) device pipeline for a small CNN, and the feeding rates",
      "10x (the article's 'order of magnitude'; its one day -> one hour is 24x), on a GPU",
      (GPU, HOLDS, "holds only when the training step is fast next to the CPU pipeline", NOT_HERE))
def _l6(on_gpu: bool, epoch_ratio: float, feed_ratio: float) -> str:
    if not on_gpu:
        return GPU
    if epoch_ratio >= 10:
        return HOLDS
    return "holds only when the training step is fast next to the CPU pipeline" if feed_ratio >= 10 else NOT_HERE


@rule("L7", "test accuracy of models trained and tested through the original-binary pipeline vs the JPEG "
      "pipeline, over several seeds and JPEG qualities",
      "a drop of at least 1 point and more than twice the seed-to-seed spread (stated tolerance); "
      "only on the real data set",
      (REAL_DATA, HOLDS, NOT_HERE))
def _l7(synthetic: bool, worst_mean_drop: float, seed_spread: float) -> str:
    if synthetic:
        return REAL_DATA
    return HOLDS if worst_mean_drop >= max(0.01, 2 * seed_spread) else NOT_HERE


@rule("L8", "largest relative gradient difference, k accumulated micro-batches vs one k x batch "
      "(MLP, GroupNorm, BatchNorm)",
      "< 1e-4 is equal (float32 rounding over k sums); BatchNorm > 1e-3 differs (stated tolerances)",
      ("holds only when the loss is divided by k and the model has no batch norm", HOLDS, NOT_HERE))
def _l8(diff_mlp: float, diff_gn: float, diff_bn: float) -> str:
    if not (diff_mlp < 1e-4 and diff_gn < 1e-4):
        return NOT_HERE
    return "holds only when the loss is divided by k and the model has no batch norm" if diff_bn > 1e-3 else HOLDS


@rule("L9", "bytes kept per step: list of losses without backward, after backward, with .item(); "
      "vs one step's activations",
      "graph kept >= 90 % of one step's activations; after backward >= 1/10 of that for 'holds' (stated tolerances)",
      (HOLDS, "holds only when the loss's graph has not been freed by backward()", NOT_HERE))
def _l9(graph_bytes: float, after_backward_bytes: float, activation_bytes: float) -> str:
    if graph_bytes < 0.9 * activation_bytes:
        return NOT_HERE
    if after_backward_bytes >= graph_bytes / 10:
        return HOLDS
    return "holds only when the loss's graph has not been freed by backward()"


@rule("L10", "time of x.cpu().to(device) vs x.clone() on the device: the same bytes, a new device copy either way",
      ">= 2x (stated tolerance; physically a PCIe/C2C link is 10-100x slower than device memory)",
      (GPU, HOLDS, NOT_HERE))
def _l10(on_gpu: bool, round_trip_vs_on_device: float | None) -> str:
    if not on_gpu or round_trip_vs_on_device is None:
        return GPU
    return HOLDS if round_trip_vs_on_device >= 2 else NOT_HERE


@rule("L11", "time of the same training loop with and without empty_cache() every step",
      f">= 1.1x slower ({NOISE})", (GPU, HOLDS, NOT_HERE))
def _l11(on_gpu: bool, slowdown: float) -> str:
    if not on_gpu:
        return GPU
    return HOLDS if slowdown >= 1.1 else NOT_HERE


@rule("L12", "fp16 + GradScaler vs fp32: samples/s and activation memory",
      "faster >= 1.2x and smaller >= 1.3x (stated tolerances)",
      (GPU, HOLDS, "holds only when the model is large enough to be compute-bound", NOT_HERE))
def _l12(on_gpu: bool, speedup: float, memory_ratio: float) -> str:
    if not on_gpu:
        return GPU
    if speedup >= 1.2 and memory_ratio >= 1.3:
        return HOLDS
    return "holds only when the model is large enough to be compute-bound" if memory_ratio >= 1.3 else NOT_HERE


@rule("L13", "GPU / CPU time per full-batch step at 506 rows (the CPU at its best thread count)",
      f">= 0.9 (the article: 'no faster, maybe slower'; {NOISE})", (GPU, HOLDS, NOT_HERE))
def _l13(on_gpu: bool, gpu_vs_cpu_time: float | None) -> str:
    if not on_gpu or gpu_vs_cpu_time is None:
        return GPU
    return HOLDS if gpu_vs_cpu_time >= 0.9 else NOT_HERE


@rule("L14", "GPU 0 peak memory / the other GPUs' mean, loss outside vs inside forward",
      f"outside > 1.1 ({NOISE}) and inside lower than outside", (GPUS2, HOLDS, NOT_HERE))
def _l14(gpus: int, imbalance_outside: float | None, imbalance_inside: float | None) -> str:
    if gpus < 2 or imbalance_outside is None or imbalance_inside is None:
        return GPUS2
    return HOLDS if imbalance_outside > 1.1 and imbalance_inside < imbalance_outside else NOT_HERE


@rule("L15", "time per sample, DDP vs DataParallel, same model, global batch, host data and syncs",
      ">= 10 % less time (half the article's ~20 % on 4 GPUs)", (GPUS2, HOLDS, NOT_HERE))
def _l15(gpus: int, less_time: float | None) -> str:
    if gpus < 2 or less_time is None:
        return GPUS2
    return HOLDS if less_time >= 0.1 else NOT_HERE


@rule("L16", "loading a DataParallel state_dict into a plain model: does it fail?",
      "a fact, not a threshold: the load fails or it does not", (HOLDS, NOT_HERE))
def _l16(prefix_load_failed: bool) -> str:
    return HOLDS if prefix_load_failed else NOT_HERE


@rule("L17", "stage utilisation of a plain 2-stage split; hand-off time as a share of the step",
      "utilisation < 75 % (a plain 2-stage split can reach at most 50 %; the rest is tolerance); "
      "hand-off >= 2 % of the step (stated tolerance) for 'holds'",
      (HOLDS, "holds only when the activations handed over are large", NOT_HERE))
def _l17(utilisation: float, handoff_share: float) -> str:
    if utilisation >= 0.75:
        return NOT_HERE
    return HOLDS if handoff_share >= 0.02 else "holds only when the activations handed over are large"


@rule("L18", "final loss of a k x batch with the same vs the scaled lr (notebook 06); DDP vs one process "
      "on the global batch, and the spread of batch-norm running means between ranks (notebook 14)",
      "scaled lr ends lower and closer to the small batch; DDP equal to the global batch (< 1e-4) and "
      "BN means differ by > 1e-6 (float32 noise; stated tolerances)",
      ("holds (learning-rate part)", "holds (batch-norm part)", NOT_HERE))
def _l18(lr_losses: tuple[float, float, float] | None = None,
         ddp_vs_global: float | None = None, bn_spread: float | None = None) -> str:
    if lr_losses is not None:
        small, same_lr, scaled_lr = lr_losses
        ok = scaled_lr < same_lr and abs(scaled_lr - small) < abs(same_lr - small)
        return "holds (learning-rate part)" if ok else NOT_HERE
    if ddp_vs_global is None or bn_spread is None:
        raise TypeError("L18 needs lr_losses=(small, same lr, scaled lr) or ddp_vs_global and bn_spread")
    return "holds (batch-norm part)" if ddp_vs_global < 1e-4 and bn_spread > 1e-6 else NOT_HERE


@rule("L19", "an odd-sized data-parallel job (3 processes over 2 nodes): did it finish with identical replicas?",
      "a fact: it crashed or it did not", (HOLDS, NOT_HERE))
def _l19(odd_world_finished: bool) -> str:
    return NOT_HERE if odd_world_finished else HOLDS


@rule("L20", "loss + gradient time, Python loop vs vectorised (same values asserted)",
      ">= 50x for 'holds' (half the article's ~100x); >= 5x for 'holds only when' (stated tolerance)",
      (HOLDS, "holds only when the loop runs over many elements", NOT_HERE))
def _l20(ratio: float) -> str:
    if ratio >= 50:
        return HOLDS
    return "holds only when the loop runs over many elements" if ratio >= 5 else NOT_HERE


@rule("L21", "the profiler's diagnosis of a loop built input-bound and of one built compute-bound",
      "advice: supported when the profile names the right kind for both (so it points to different fixes)",
      ("advice: supported here", "advice: not supported here"), advice=True)
def _l21(data_loop_kind: str, compute_loop_kind: str, compute_kinds_expected: tuple[str, ...]) -> str:
    ok = data_loop_kind == "input-bound" and compute_loop_kind in compute_kinds_expected
    return "advice: supported here" if ok else "advice: not supported here"


@rule("L22", "speed-up bought by code (fast recipe / reference, this machine) vs by hardware (another "
      "device's fast recipe / this machine's, same model width); the cost of a 10-epoch run at stated prices",
      "hardware gain > code gain; 'holds' when the faster device's run also costs no more "
      "(hourly prices are stated assumptions in notebook 18)",
      ("needs a run on other hardware", HOLDS,
       "holds only when the time saved is worth the higher price", NOT_HERE))
def _l22(code_gain: float, hardware_gain: float | None, cost_here: float | None = None,
         cost_other: float | None = None) -> str:
    if hardware_gain is None:
        return "needs a run on other hardware"
    if hardware_gain <= code_gain:
        return NOT_HERE
    if cost_here is not None and cost_other is not None and cost_other > cost_here:
        return "holds only when the time saved is worth the higher price"
    return HOLDS


@rule("L23", "test accuracy after the same epochs: 2 devices at batch 512, lr 0.2 vs 1 device at batch 256, lr 0.1 "
      "(without 2 GPUs: the larger batch with the scaled lr on one device)",
      "a drop of more than 2 points (the book's own 1-GPU runs vary by about that much) counts as lost",
      (GPUS2, HOLDS, NOT_HERE))
def _l23(gpus: int, acc_one: float, acc_two: float | None) -> str:
    if gpus < 2 or acc_two is None:
        return GPUS2
    return HOLDS if acc_one - acc_two > 0.02 else NOT_HERE


assert set(RULES) == set(CLAIMS), f"claims without a rule: {set(CLAIMS) - set(RULES)}"

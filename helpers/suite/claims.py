"""The claims ledger, and the one rule per claim that turns measurements into its outcome. A rule
declares its kind: a *verdict* compares measurements with thresholds and could have gone either way;
a *mechanism* is fixed by PyTorch's design: demonstrated, not tested ("mechanism not shown here"
means the demonstration broke). Thresholds are data (`Rule.limits`): `decide` reads them,
`Rule.threshold` writes them into the rule's plain words (printed with every outcome), and
tests/test_claims.py pins each one and probes just either side of it.

A rule judged on timed windows names its timed quantities (`Rule.timed`); given their timing
(`judge(..., timing=r)`, a `helpers.timing.Ratio`), `judge` alone, for every such rule, turns a
decided outcome into "inconclusive" when a window is shorter than its device's floor
(`WINDOW_FLOORS`) or when the ratio's range over the repeats gives two outcomes.

    verdict = judge("L3", copy_gain=None)   # -> "needs a GPU"
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

# The claims by id; which notebooks test each is written once, in notebooks/catalog.toml.
CLAIMS: dict[str, str] = {
    "L1": "More DataLoader workers make loading faster ('use 10 workers').",
    "L2": "Each worker holds whole batches, so N workers need about N x the batch RAM.",
    "L3": (
        "Keeping images uint8 and normalising on the device cuts batch memory ~5x"
        " and speeds host-to-device copies."
    ),
    "L4": (
        "Holding the data set in RAM removes the slowest retrieval step;"
        " a RAM disk alone may not help when the CPU is the bottleneck."
    ),
    "L5": "Preprocess offline (resize, grayscale, ...) once instead of every epoch.",
    "L6": (
        "Moving decoding and augmentation to the GPU (DALI-style)"
        " can cut epoch time by an order of magnitude."
    ),
    "L7": "Decoding CIFAR from lossy JPEG copies instead of the original binary costs accuracy.",
    "L8": "Gradient accumulation over k steps gives the same update as a k x larger batch.",
    "L9": (
        "Appending the loss tensor (not loss.item()) to a list"
        " keeps every step's graph alive and grows memory."
    ),
    "L10": "Moving tensors back and forth between CPU and GPU is expensive.",
    "L11": "torch.cuda.empty_cache() in a training loop is a bad idea (it stalls).",
    "L12": (
        "16-bit mixed precision trains faster and uses less memory;"
        " a loss scaler keeps small gradients alive."
    ),
    "L13": "On a 506-row data set a GPU is no faster than a CPU and may be slower.",
    "L14": (
        "nn.DataParallel gathers outputs on GPU 0 (more memory there);"
        " loss inside forward reduces the imbalance."
    ),
    "L15": "DistributedDataParallel is much faster than DataParallel on one machine.",
    "L16": (
        "DataParallel checkpoints carry a 'module.' prefix; loading elsewhere needs map_location."
    ),
    "L17": (
        "Splitting a model across devices works, but sequential stages idle and the hand-off costs."
    ),
    "L18": (
        "Data parallelism needs the batch (and often the learning rate) scaled;"
        " batch-norm statistics become per device."
    ),
    "L19": "Use an even number of GPUs; an odd number may crash training.",
    "L20": (
        "A Python loop over elements in a custom loss is slow;"
        " the vectorised version can be ~100x faster."
    ),
    "L21": "Profile first: find whether training is CPU-, I/O- or GPU-bound before optimising.",
    "L22": "Faster hardware can be worth more than further code optimisation (time vs money).",
    "L23": (
        "d2l ResNet-18 on Fashion-MNIST: 1 GPU 0.93 acc at 12.2 s/epoch;"
        " 2 GPUs batch 512 lr 0.2 faster but accuracy dropped."
    ),
}

HOLDS, NOT_HERE, SHOWN, NOT_SHOWN = (
    "holds",
    "does not hold here",
    "mechanism shown",
    "mechanism not shown here",
)
GPU, GPUS2, REAL_DATA = "needs a GPU", "needs >=2 GPUs", "needs the real data set"
DECODER = "needs a GPU decoder (DALI or nvJPEG)"
REFERENCE = "needs a reference run"
# An outcome starts with one of these; "holds only when" is followed by the condition.
VERDICT_KINDS = (
    HOLDS,
    "holds only when",
    NOT_HERE,
    "inconclusive",
    SHOWN,
    NOT_SHOWN,
    GPU,
    GPUS2,
    REAL_DATA,
    DECODER,
    REFERENCE,
)
# Outcomes that decide a claim: a report counts these as verdicts (and notebooks that differ
# on them disagree); the others show a mechanism or say what this machine lacks.
DECIDED = (HOLDS, "holds only when", NOT_HERE)


def kind_of(verdict: str) -> str:
    """The outcome's kind: the longest of `VERDICT_KINDS` it starts with."""
    return max((k for k in VERDICT_KINDS if verdict.startswith(k)), key=len, default="")


@dataclass(frozen=True)
class Rule:
    claim: str
    kind: str  # "verdict", "mechanism", or "both" (one half of each)
    compares: str  # the measured quantities, in words
    text: str  # the rule in plain words; {name} stands for limits[name]
    limits: dict[str, float]  # the thresholds: `decide` reads them, the text prints them
    verdicts: tuple[str, ...]  # every outcome `decide` can return
    decide: Callable[..., str]  # decide(limits, **measured)
    timed: tuple[str, ...] = ()  # the measured quantities that are ratios of timed windows
    flips: str = ""  # what would make it come out the other way on real hardware, in one line

    @property
    def threshold(self) -> str:
        """The rule in plain words with its thresholds filled in."""
        return self.text.format(**self.limits)

    @property
    def other_way(self) -> str:
        """What would turn the outcome the other way, with the thresholds filled in."""
        return self.flips.format(**self.limits)


RULES: dict[str, Rule] = {}


def rule(
    claim: str,
    kind: str,
    compares: str,
    text: str,
    limits: dict[str, float],
    verdicts: tuple[str, ...],
    timed: tuple[str, ...] = (),
    flips: str = "",
) -> Callable:
    """Register the decorated function as `claim`'s `Rule.decide`; a second rule for one claim
    raises (keeping the first in silence would judge with a rule nobody reads). `flips`: what
    would turn the outcome the other way, printed under every verdict so none looks fixed."""
    if claim in RULES:
        raise ValueError(f"rule: claim {claim!r} already has a rule ({RULES[claim].text!r})")

    def register(decide: Callable) -> Rule:
        RULES[claim] = Rule(claim, kind, compares, text, limits, verdicts, decide, timed, flips)
        return RULES[claim]

    return register


# The shortest timed window a decided outcome may rest on, by the device whose work it timed, and
# why: below it the clock, launches and the scheduler, not the work, can decide the ratio. A
# device not named (a GPU was there, the work may have run on either) gets the largest.
WINDOW_FLOORS: dict[str, tuple[float, str]] = {
    "cuda": (
        1e-3,
        "a launch and a synchronise cost ~5-20 us each and the host clock read around them "
        "jitters by tens of us: at 1 ms they stay within a few percent of the window",
    ),
    "cpu": (
        5e-3,
        "a shared CPU's scheduler hands out time slices of a few ms (Linux CFS: 3-6 ms): one "
        "preemption inside a shorter window can double it",
    ),
    "mps": (
        5e-3,
        "a laptop GPU shares the machine with the desktop, its command buffers are committed "
        "and waited for by the CPU and its clocks ramp: the CPU's floor",
    ),
}


class Timed(Protocol):
    """What `judge` reads of a timed ratio (`helpers.timing.Ratio`): no torch import here."""

    low: float
    high: float
    windows: tuple[tuple[float, str | None], ...]


def judge(claim: str, timing: Timed | tuple | None = None, **measured: Any) -> str:
    """The outcome for `claim` from the measured quantities its rule names. `timing`: the timing
    of the rule's timed quantities (`Rule.timed`; a tuple when it has several, None where one was
    not measured): a decided outcome it cannot support becomes "inconclusive" (`undecided`)."""
    if (r := RULES.get(claim)) is None:
        raise ValueError(f"judge: unknown claim {claim!r}; valid ids are L1 ... L{len(CLAIMS)}")
    verdict = _decide(r, measured)
    if timing is None or kind_of(verdict) not in DECIDED:
        return verdict  # nothing timed given, or nothing decided (a missing GPU, a mechanism)
    why = undecided(r, timing, measured)
    return f"inconclusive: {why}" if why else verdict


def _decide(r: Rule, measured: dict[str, Any]) -> str:
    try:
        verdict = r.decide(r.limits, **measured)
    except TypeError as e:
        raise TypeError(f"judge({r.claim!r}): the rule compares {r.compares}; {e}") from None
    assert verdict in r.verdicts, f"rule {r.claim} returned {verdict!r}, not one of its verdicts"
    return verdict


def floor(device: str | None) -> tuple[float, str]:
    """The window floor for `device` (`WINDOW_FLOORS`), the largest for one not named."""
    return WINDOW_FLOORS.get(device or "", max(WINDOW_FLOORS.values()))


def undecided(r: Rule, timing: Timed | tuple, measured: dict[str, Any]) -> str:
    """Why the timed quantities cannot decide `r` (a window below its device's floor; a range
    over the repeats that gives two outcomes), or "" when they can."""
    given = timing if isinstance(timing, tuple) else (timing,)
    if not r.timed or len(given) > len(r.timed):
        raise TypeError(
            f"judge({r.claim!r}): timing= is for the rule's timed quantities "
            f"({', '.join(r.timed) or 'none: it is not judged on timed windows'}), "
            f"got {len(given)} timing(s)"
        )
    timed = {n: t for n, t in zip(r.timed, given, strict=False) if t is not None}
    for name, t in timed.items():
        x = measured.get(name)
        if x is None or not t.low - 1e-9 * abs(t.low) <= x <= t.high + 1e-9 * abs(t.high):
            raise ValueError(
                f"judge({r.claim!r}): {name} = {x} is not in its timing's range "
                f"{t.low:.4g} to {t.high:.4g}: pass the timing {name} was computed from"
            )
    for seconds, device in (w for t in timed.values() for w in t.windows):
        least, _ = floor(device)
        if seconds < least:
            return (
                f"too small to measure here: {window_text(seconds)} per window, below the "
                f"{window_text(least)} floor ({device or 'device not named'}): "
                "time more work per window"
            )
    ends = [(t.low, t.high) for t in timed.values()]
    corners = [dict(zip(timed, c, strict=True)) for c in itertools.product(*ends)]
    if len({_decide(r, {**measured, **c}) for c in corners}) < 2:
        return ""
    spans = [f"from {t.low:.3g} to {t.high:.3g} ({n})" for n, t in timed.items()]
    return (
        f"the repeats range {' and '.join(spans)}, across the rule's "
        f"{' and '.join(_crossed(r, timed, measured))}: run it again with more steps"
    )


def _crossed(r: Rule, timed: dict[str, Timed], measured: dict[str, Any]) -> list[str]:
    """The thresholds inside a timed range where the outcome changes; else where it does."""
    out: list[str] = []
    for name, t in timed.items():
        at = lambda x, name=name: _decide(r, {**measured, name: x})  # noqa: E731
        for k, v in r.limits.items():
            eps = abs(v) * 1e-6 or 1e-9
            if t.low <= v <= t.high and at(v - eps) != at(v + eps) and f"{v:g} ({k})" not in out:
                out.append(f"{v:g} ({k})")
        if not out and at(t.low) != at(t.high):  # a threshold computed from the measurements
            lo, hi = t.low, t.high
            for _ in range(60):
                mid = (lo + hi) / 2
                lo, hi = (mid, hi) if at(mid) == at(t.low) else (lo, mid)
            out.append(f"threshold ({hi:.3g} here, from the other measurements)")
    return out or ["thresholds"]


def window_text(seconds: float) -> str:
    """0.8 ms, 5 ms, 120 ms, 1.2 s: a window as a person reads it."""
    return f"{seconds * 1e3:.2g} ms" if seconds < 0.1 else f"{seconds:.3g} s"


def _tiers(x: float, hi: float, lo: float, only: str) -> str:
    """Holds at `hi` or more, the condition `only` at `lo` or more, else does not hold here."""
    return HOLDS if x >= hi else only if x >= lo else NOT_HERE


# Run-to-run noise on a shared machine is several percent; ratios within 10 % of 1 are "no change".
NOISE = "10 %: run-to-run noise"
VERDICT, MECHANISM = "verdict", "mechanism"  # a rule's kind: judged, or shown
# The kinds a loop built device-bound can read as (helpers.diagnose.bottleneck's vocabulary: a
# busy device, or on a GPU whose kernels are smaller than their launch, overhead-bound), named in
# L21's outcome.
DEVICE_KINDS = (
    "device-bound",
    "device-bound, near its ceiling",
    "device-bound, below its ceiling",
    "overhead-bound",
)


@rule(
    "L1",
    VERDICT,
    "samples/s of the best worker count vs 0 workers; best "
    "past the usable cores vs best up to them",
    "holds when the best worker count gives >= {gain}x the samples/s of 0 workers and going "
    "past the usable cores gives >= {past}x the best within them; a gain only up to the cores: "
    f"holds only when workers <= usable cores; under {{gain}}x: does not hold here ({NOISE})",
    {"gain": 1.1, "past": 1.1},
    (NOT_HERE, HOLDS, "holds only when workers <= usable cores"),
    timed=("gain", "past_vs_within"),
    flips="with a model whose step is far longer than a batch's loading, more workers cannot speed "
    "the epoch: does not hold; with heavy per-sample decoding on many free cores: holds",
)
def _l1_workers_speed_loading(t: dict, gain: float, past_vs_within: float | None) -> str:
    if gain < t["gain"]:
        return NOT_HERE
    return (
        HOLDS
        if past_vs_within is not None and past_vs_within >= t["past"]
        else "holds only when workers <= usable cores"
    )


@rule(
    "L2",
    VERDICT,
    "physical memory loading added / workers x prefetch x batch bytes (the article's arithmetic); "
    "its growth with the batch next to the added memory's spread over the run",
    "holds when the added memory is {low}x to {high}x the arithmetic (stated "
    "tolerance); above {high}x and growing with the batch by more than {spread}x the added "
    "memory's spread (growth inside the spread is noise): holds only when read as a lower "
    "bound; else does not hold here",
    {"low": 0.5, "high": 2, "spread": 1},
    (HOLDS, "holds only when read as a lower bound", NOT_HERE),
    flips="a larger batch (or larger images) makes the batches the bulk of the added memory: "
    "holds; tiny batches leave only the workers' fixed cost: does not hold",
)
def _l2_workers_hold_whole_batches(
    t: dict, added_vs_arithmetic: float, added_growth_mb: float, added_spread_mb: float = 0.0
) -> str:
    if t["low"] <= added_vs_arithmetic <= t["high"]:
        return HOLDS
    grew = added_growth_mb > max(t["spread"] * added_spread_mb, 0.0)
    if added_vs_arithmetic > t["high"] and grew:
        return "holds only when read as a lower bound"
    return NOT_HERE


@rule(
    "L3",
    VERDICT,
    "host-to-device copy time, float32 batch / uint8 batch normalised on the device (pinned); "
    "the 4x less memory is the dtype sizes (4 bytes vs 1), a fact shown, not judged",
    "holds when the float32 copy takes >= {copy}x the uint8 one (half the 4x "
    "fewer bytes: stated tolerance); >= {some}x: holds only when the copy is "
    f"large enough to be bandwidth-bound ({NOISE}); else does not hold here",
    {"copy": 2, "some": 1.1},
    (GPU, HOLDS, "holds only when the copy is large enough to be bandwidth-bound", NOT_HERE),
    timed=("copy_gain",),
    flips="a batch too small to be bandwidth-bound (or a slow link that the launch does not hide) "
    "shrinks the gain under {some}x: does not hold",
)
def _l3_uint8_copies_are_cheaper(t: dict, copy_gain: float | None) -> str:
    return (
        GPU
        if copy_gain is None
        else _tiers(
            copy_gain,
            t["copy"],
            t["some"],
            "holds only when the copy is large enough to be bandwidth-bound",
        )
    )


@rule(
    "L4",
    VERDICT,
    "samples/s with the encoded files held in RAM vs read from the files, the same decode and "
    "transforms on both (one change); the share of a sample's time spent reading",
    "holds when holding the files in RAM gives >= {gain}x the samples/s (20 %: beyond "
    "run-to-run noise); a smaller gain while reading is < {read} of a sample's time: "
    "holds only when reading is the slow step (the article's caveat: the CPU is the "
    "bottleneck); a smaller gain while reading is >= {read}: does not hold here",
    {"gain": 1.2, "read": 0.25},
    (HOLDS, "holds only when reading, not the CPU, is the slow step", NOT_HERE),
    timed=("in_ram_gain",),
    flips="files on a slow disk or network store (not the page cache) make reading the slow step: "
    "holds; with decoding far costlier than reading the gain stays small",
)
def _l4_data_in_ram(t: dict, in_ram_gain: float, read_share: float) -> str:
    if in_ram_gain >= t["gain"]:
        return HOLDS
    return (
        "holds only when reading, not the CPU, is the slow step"
        if read_share < t["read"]
        else NOT_HERE
    )


@rule(
    "L5",
    VERDICT,
    "epoch time, resize in the per-epoch transform / data resized once offline, each epoch "
    "with the training step the preprocessing feeds",
    "holds when >= {gain}x (stated tolerance); >= {some}x: holds only when the "
    f"preprocessing is a large part of the epoch ({NOISE}); else does not hold here",
    {"gain": 1.5, "some": 1.1},
    (HOLDS, "holds only when the preprocessing is a large part of the epoch", NOT_HERE),
    timed=("gain",),
    flips="with a model whose step is 10x this one, the resize is a few % of the epoch: "
    "does not hold; with a cheap step and a costly resize: holds",
)
def _l5_preprocess_offline(t: dict, gain: float) -> str:
    return _tiers(
        gain, t["gain"], t["some"], "holds only when the preprocessing is a large part of the epoch"
    )


@rule(
    "L6",
    VERDICT,
    "epoch time of a small CNN fed by (a) the CPU pipeline / by a "
    "device pipeline, and the feeding rates; the device pipeline counts "
    "for the decoding half only if it decodes on the device itself",
    "on a GPU with a device decoder (DALI or nvJPEG), holds when the epoch is >= {epoch}x shorter "
    "(the article's 'order of magnitude'; its one day -> one hour is 24x); a shorter epoch but a "
    "feed >= {feed}x faster: holds only when the training step is fast next to the CPU pipeline; "
    "else does not hold here; a device pipeline fed decoded tensors: needs a GPU decoder",
    {"epoch": 10, "feed": 10},
    (
        GPU,
        DECODER,
        HOLDS,
        "holds only when the training step is fast next to the CPU pipeline",
        NOT_HERE,
    ),
    timed=("epoch_ratio", "feed_ratio"),
    flips="a heavy model whose step is the epoch's bulk caps the gain far below {epoch}x: does not "
    "hold; a tiny model fed by few CPU cores: holds",
)
def _l6_augment_on_the_device(
    t: dict, on_gpu: bool, decodes_on_device: bool, epoch_ratio: float, feed_ratio: float
) -> str:
    if not on_gpu or not decodes_on_device:
        return DECODER if on_gpu else GPU
    return (
        HOLDS
        if epoch_ratio >= t["epoch"]
        else "holds only when the training step is fast next to the CPU pipeline"
        if feed_ratio >= t["feed"]
        else NOT_HERE
    )


@rule(
    "L7",
    VERDICT,
    "test accuracy, original-binary pipeline minus JPEG "
    "pipeline, over several seeds and JPEG qualities",
    "on the real data set only, holds when the worst mean drop is >= {drop} (1 point) and "
    ">= {spread}x the seed-to-seed spread (stated tolerances); else does not hold here",
    {"drop": 0.01, "spread": 2},
    (REAL_DATA, HOLDS, NOT_HERE),
    flips="a lower JPEG quality (more artefacts) or more seeds (a smaller spread) can show the "
    "drop: holds; a quality near 95 hides it",
)
def _l7_jpeg_copies_cost_accuracy(
    t: dict, synthetic: bool, worst_mean_drop: float, seed_spread: float
) -> str:
    return (
        REAL_DATA
        if synthetic
        else HOLDS
        if worst_mean_drop >= max(t["drop"], t["spread"] * seed_spread)
        else NOT_HERE
    )


@rule(
    "L8",
    MECHANISM,
    "largest relative gradient difference, k accumulated micro-batches "
    "(loss / k) vs one k x batch (MLP, GroupNorm, BatchNorm): fixed by "
    "autograd (gradients add up) and by batch norm's per-batch statistics",
    "shown when the MLP and GroupNorm differences are < {equal} (float32 "
    "rounding over k sums) and BatchNorm's is > {differs} (stated tolerances)",
    {"equal": 1e-4, "differs": 1e-3},
    (SHOWN, NOT_SHOWN),
    flips="none on real hardware: autograd sums gradients whatever the device; a broken "
    "demonstration (float16, a non-linear loss scale) would not show it",
)
def _l8_accumulation_equals_a_larger_batch(
    t: dict, diff_mlp: float, diff_gn: float, diff_bn: float
) -> str:
    return SHOWN if max(diff_mlp, diff_gn) < t["equal"] and diff_bn > t["differs"] else NOT_SHOWN


@rule(
    "L9",
    MECHANISM,
    "bytes kept per step by a list of losses: without backward, after backward: fixed by autograd "
    "(a tensor keeps its graph until backward frees the saved tensors)",
    "shown when the graph kept without backward is >= "
    "{kept}x what is kept after backward (stated tolerance)",
    {"kept": 10},
    (SHOWN, NOT_SHOWN),
    flips="none on real hardware: autograd keeps the graph until backward by design",
)
def _l9_appended_losses_keep_graphs(
    t: dict, graph_bytes: float, after_backward_bytes: float
) -> str:
    return SHOWN if graph_bytes >= t["kept"] * max(after_backward_bytes, 1.0) else NOT_SHOWN


@rule(
    "L10",
    VERDICT,
    "time of x.cpu().to(device) for the step's activations / one training step of the model "
    "that made them (does the round trip matter next to the work?); the link-vs-memory ratio "
    "(round trip / a copy in device memory, 10-100x by the hardware) is shown, not judged",
    "holds when one round trip takes >= {share} of a training step (stated tolerance: a "
    "tenth of the step lost per round trip is expensive); else does not hold here",
    {"share": 0.1},
    (GPU, HOLDS, NOT_HERE),
    timed=("round_trip_share",),
    flips="with a step 10x shorter than this one (a tiny model) or 10x more bytes moved, the "
    "round trip is a large share of the step: holds; with a heavy step: does not hold",
)
def _l10_device_round_trips_cost(t: dict, on_gpu: bool, round_trip_share: float | None) -> str:
    r = round_trip_share
    return GPU if not on_gpu or r is None else HOLDS if r >= t["share"] else NOT_HERE


@rule(
    "L11",
    VERDICT,
    "time of the same training loop with / without empty_cache() every step",
    f"holds when the loop is >= {{slower}}x slower ({NOISE}); else does not hold here",
    {"slower": 1.1},
    (GPU, HOLDS, NOT_HERE),
    timed=("slowdown",),
    flips="a loop whose step allocates little (or a caching allocator already holding nothing) "
    "makes empty_cache nearly free: does not hold; many large short-lived tensors: holds",
)
def _l11_empty_cache_stalls(t: dict, on_gpu: bool, slowdown: float) -> str:
    return GPU if not on_gpu else HOLDS if slowdown >= t["slower"] else NOT_HERE


@rule(
    "L12",
    VERDICT,
    "fp16 + GradScaler vs fp32, same weights and batches: samples/s, activation memory, and the "
    "mean training loss's relative distance from fp32's",
    "holds when fp16 is >= {speed}x faster, needs >= {memory}x less activation "
    "memory and its mean loss is within {loss} of fp32's (stated tolerances); "
    "less memory and the same loss but not faster: holds only when the model "
    "is large enough to be compute-bound; else does not hold here",
    {"speed": 1.2, "memory": 1.3, "loss": 0.05},
    (GPU, HOLDS, "holds only when the model is large enough to be compute-bound", NOT_HERE),
    timed=("speedup",),
    flips="a small model that is launch-bound (or a GPU without fast fp16 units) is not faster: "
    "holds only when compute-bound; a larger model on tensor cores: holds",
)
def _l12_mixed_precision(
    t: dict, on_gpu: bool, speedup: float, memory_ratio: float, loss_gap: float
) -> str:
    if not on_gpu:
        return GPU
    if memory_ratio < t["memory"] or loss_gap > t["loss"]:
        return NOT_HERE
    return (
        HOLDS
        if speedup >= t["speed"]
        else "holds only when the model is large enough to be compute-bound"
    )


@rule(
    "L13",
    VERDICT,
    "GPU / CPU time per full-batch step at 506 rows (the CPU at its best thread count)",
    "holds when the GPU takes >= {ratio}x the CPU's time (the article: "
    f"'no faster, maybe slower'; {NOISE}); else does not hold here",
    {"ratio": 0.9},
    (GPU, HOLDS, NOT_HERE),
    timed=("gpu_vs_cpu_time",),
    flips="a model 100x larger (or many more rows) makes the GPU faster: does not hold",
)
def _l13_small_data_on_a_gpu(t: dict, on_gpu: bool, gpu_vs_cpu_time: float | None) -> str:
    r = gpu_vs_cpu_time
    return GPU if not on_gpu or r is None else HOLDS if r >= t["ratio"] else NOT_HERE


@rule(
    "L14",
    MECHANISM,
    "GPU 0 peak memory / the other GPUs' mean, loss outside vs inside forward; DataParallel "
    "gathers on device 0 by design, so this shows the mechanism's size, it tests no claim",
    "mechanism shown when the imbalance with the loss outside forward is > {imbalance} "
    f"({NOISE}) and lower with it inside; else mechanism not shown here (outputs too small "
    "next to the weights for the gather to show)",
    {"imbalance": 1.1},
    (GPUS2, SHOWN, NOT_SHOWN),
    flips="none on real hardware: DataParallel gathers on device 0 by design; outputs tiny next to "
    "the weights hide the gather",
)
def _l14_dataparallel_gathers_on_gpu0(
    t: dict, gpus: int, imbalance_outside: float | None, imbalance_inside: float | None
) -> str:
    if gpus < 2 or imbalance_outside is None or imbalance_inside is None:
        return GPUS2
    return (
        SHOWN
        if t["imbalance"] < imbalance_outside and imbalance_inside < imbalance_outside
        else NOT_SHOWN
    )


@rule(
    "L15",
    VERDICT,
    "time per sample, DDP vs DataParallel, same model, global batch, host data and syncs",
    "holds when DDP takes >= {less} less time per sample (half "
    "the article's ~20 % on 4 GPUs); else does not hold here",
    {"less": 0.1},
    (GPUS2, HOLDS, NOT_HERE),
    timed=("less_time",),
    flips="a model whose step dwarfs the per-step thread and copy overhead shrinks the gap under "
    "{less}: does not hold; a small, fast step widens it",
)
def _l15_ddp_beats_dataparallel(t: dict, gpus: int, less_time: float | None) -> str:
    return GPUS2 if gpus < 2 or less_time is None else HOLDS if less_time >= t["less"] else NOT_HERE


@rule(
    "L16",
    MECHANISM,
    "a DataParallel state_dict loaded strictly into a plain model: fixed by load_state_dict's key "
    "match (the map_location half needs a second device and is demonstrated, not judged)",
    "shown when the strict load fails (no threshold: a fact of the design)",
    {},
    (SHOWN, NOT_SHOWN),
    flips="none on real hardware: load_state_dict matches keys by design",
)
def _l16_dataparallel_checkpoint_prefix(t: dict, prefix_load_failed: bool) -> str:
    return SHOWN if prefix_load_failed else NOT_SHOWN


# A plain split runs one stage at a time, so K stages are busy 1/K of the step on average; with
# unequal stages the slower one is busy more (https://arxiv.org/abs/1811.06965,
# https://docs.pytorch.org/docs/stable/distributed.pipelining.html).
@rule(
    "L17",
    VERDICT,
    "hand-off time (activations forward, their gradients back) / a "
    "plain 2-stage split's step; the idle time is fixed by the schedule (one of 2 sequential "
    "stages works at a time: busy at most 50 % on average, the slower one more) and shown, "
    "not judged",
    "holds when the hand-off is >= {handoff} of the step (stated "
    "tolerance); else does not hold here (the activations handed over cost too little to see)",
    {"handoff": 0.02},
    (HOLDS, NOT_HERE),
    timed=("handoff_share",),
    flips="stages 10x heavier (more compute per activation handed over) or a fast link put the "
    "hand-off under {handoff} of the step: does not hold; wide activations on a slow link: "
    "holds",
)
def _l17_split_model_idles_devices(t: dict, handoff_share: float) -> str:
    return HOLDS if handoff_share >= t["handoff"] else NOT_HERE


@rule(
    "L18",
    "both",
    "verdict: final loss of a k x batch with the same vs the scaled "
    "lr (notebook 07); mechanism: DDP vs one process on the global "
    "batch, and batch-norm running means between ranks (notebook 16)",
    "learning-rate half holds when the scaled lr ends lower and closer to the small batch's "
    "loss, else does not hold here; batch-norm half shown when DDP equals the global batch (< "
    "{equal}) and the ranks' BN means differ by > {differs} (float32 noise; stated tolerances)",
    {"equal": 1e-4, "differs": 1e-6},
    ("holds (learning-rate part)", NOT_HERE, "mechanism shown (batch-norm part)", NOT_SHOWN),
    flips="learning-rate half: a run too short to tell the two lrs apart (one step: both end at "
    "the untrained loss) or a batch past the linear-scaling range, where the scaled lr "
    "overshoots: does not hold; batch-norm half: none (per-device statistics are DDP's design)",
)
def _l18_data_parallel_scales_the_batch(
    t: dict,
    lr_losses: tuple[float, float, float] | None = None,
    ddp_vs_global: float | None = None,
    bn_spread: float | None = None,
) -> str:
    if lr_losses is not None:
        small, same_lr, scaled_lr = lr_losses
        ok = scaled_lr < same_lr and abs(scaled_lr - small) < abs(same_lr - small)
        return "holds (learning-rate part)" if ok else NOT_HERE
    if ddp_vs_global is None or bn_spread is None:
        raise TypeError(
            "L18 needs lr_losses=(small, same lr, scaled lr) or ddp_vs_global and bn_spread"
        )
    return (
        "mechanism shown (batch-norm part)"
        if ddp_vs_global < t["equal"] and bn_spread > t["differs"]
        else NOT_SHOWN
    )


@rule(
    "L19",
    MECHANISM,
    "an odd-sized data-parallel job (3 processes) and an even control (2), same launcher, model "
    "and backend: did each finish with identical replicas? DDP's all-reduce has no rule about "
    "the process count, so this shows the design, it tests no claim",
    "shown when the odd job and the even control both finish with identical replicas; "
    "a failure of either: mechanism not shown here (its message names a cause other than the "
    "count)",
    {},
    (SHOWN, NOT_SHOWN),
    flips="none on real hardware: DDP's all-reduce has no rule about the process count; an odd "
    "job fails only for another reason (memory, a data split), which the even control shows",
)
def _l19_odd_gpu_count(t: dict, odd_world_finished: bool, even_world_finished: bool) -> str:
    return SHOWN if odd_world_finished and even_world_finished else NOT_SHOWN


@rule(
    "L20",
    MECHANISM,
    "loss + gradient time, Python loop / vectorised (same values asserted): each element costs "
    "the loop a Python-level dispatch (microseconds), the vectorised loss one per operation, "
    "fixed by the interpreter: sized here, not scored",
    "shown when the loop takes >= {slower}x the vectorised time (stated tolerance); the ratio "
    "grows with the elements (the article's ~100x is one size); else mechanism not shown here",
    {"slower": 5},
    (SHOWN, NOT_SHOWN),
    flips="none on real hardware: each element costs the loop a Python-level dispatch; fewer "
    "elements only shrink the ratio (it grows with their number)",
)
def _l20_python_loop_loss(t: dict, ratio: float) -> str:
    return SHOWN if ratio >= t["slower"] else NOT_SHOWN


@rule(
    "L21",
    MECHANISM,
    "the profiler's diagnosis of a loop built input-bound and of one built device-bound: the "
    "advice is demonstrated on loops made for it, not tested on yours",
    "shown when the profile names the right kind for both loops (so it points to different "
    "fixes); the outcome names the kind the device-bound loop read",
    {},
    (*(f"{SHOWN}: the device-bound loop read {k}" for k in DEVICE_KINDS), NOT_SHOWN),
    flips="none: the loops are built for each kind; which kind a device-bound loop reads "
    "(device-bound or overhead-bound) depends on its kernels' size next to their launch",
)
def _l21_profile_first(
    t: dict, data_loop_kind: str, compute_loop_kind: str, compute_kinds_expected: tuple[str, ...]
) -> str:
    ok = compute_loop_kind in compute_kinds_expected and compute_loop_kind in DEVICE_KINDS
    if data_loop_kind == "input-bound" and ok:
        return f"{SHOWN}: the device-bound loop read {compute_loop_kind}"
    return NOT_SHOWN


@rule(
    "L22",
    VERDICT,
    "speed-up bought by code (fast recipe / reference, this machine) vs by "
    "hardware (the fastest committed reference run of the same device class: a GPU against a "
    "GPU, a CPU against a CPU; same model width, no rescaling); and the cost of the same "
    "epochs there / here at the assumed hourly prices",
    "holds when the hardware gain is > {margin}x the code gain and the same epochs cost <= "
    "{cost}x as much there; faster but dearer: holds only when the time saved is worth the "
    "money; else does not hold here; without a reference run of the same model on the same "
    "device class: needs a reference run (not decided, so not counted as a verdict)",
    {"margin": 1, "cost": 1},
    (REFERENCE, HOLDS, "holds only when the time saved is worth the money", NOT_HERE),
    timed=("code_gain",),
    flips="a device of the same class much faster (a newer GPU generation) at a similar price: "
    "holds; one barely faster than the code gain: does not hold; pricier per epoch: holds only "
    "when time is worth the money",
)
def _l22_faster_hardware_vs_code(
    t: dict, code_gain: float, hardware_gain: float | None, cost_ratio: float | None = None
) -> str:
    if hardware_gain is None:
        return REFERENCE
    if hardware_gain <= t["margin"] * code_gain:
        return NOT_HERE
    dearer = cost_ratio is not None and cost_ratio > t["cost"]
    return "holds only when the time saved is worth the money" if dearer else HOLDS


@rule(
    "L23",
    VERDICT,
    "test accuracy after the same epochs: 2 devices at batch 512, lr 0.2 vs 1 device at batch 256, "
    "lr 0.1 (without 2 GPUs: the larger batch with the scaled lr on one device)",
    "holds when the accuracy drops by more than {drop} (the book's "
    "own 1-GPU runs vary by about that much); else does not hold here",
    {"drop": 0.02},
    (GPUS2, HOLDS, NOT_HERE),
    flips="more epochs (or a warm-up for the large batch's lr) close the gap within {drop}: does "
    "not hold; fewer epochs widen it",
)
def _l23_two_gpu_accuracy_drop(t: dict, gpus: int, acc_one: float, acc_two: float | None) -> str:
    return (
        GPUS2
        if gpus < 2 or acc_two is None
        else HOLDS
        if acc_one - acc_two > t["drop"]
        else NOT_HERE
    )


assert set(RULES) == set(CLAIMS), f"claims without a rule: {set(CLAIMS) - set(RULES)}"

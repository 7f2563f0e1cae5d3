"""`devices.capabilities`: every device-dependent choice of the suite (precisions, which bars run,
torch.compile, CUDA graphs, TF32, the fused optimizer, the batch finder's memory budget, whether
the GPU is used at all) decided from a device's description, over a table of the GPUs learners
get. No GPU needed: each row is the description `devices.describe` reads from torch on that
device; the live path is tested with torch.cuda faked, and notebooks 12 and 19's decision cells
run against a fake T4."""

import types
from pathlib import Path

import pytest
import torch
import torch._dynamo  # imported before the fakes: its import reads what they replace

from helpers import capstone, devices
from tests.notebook_scripts import code_cell
from tests.test_devices import fake_accelerator

ROOT = Path(__file__).resolve().parents[1]
# This torch's kind of wheel (CUDA 13: machine code from sm_75, Turing, on) and an older one
# that still carries Pascal (sm_60) and Volta (sm_70) code.
NEW_WHEEL = ["sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120"]
OLD_WHEEL = ["sm_50", "sm_60", "sm_70", "sm_75", "sm_80", "sm_86", "sm_90"]
NOT_CUDA = {"fp16", "cuda graphs", "cudnn", "tf32"}


def gpu(name, capability, memory_gib, arch_list=NEW_WHEEL):
    """What `describe` reads on a CUDA GPU (total_memory as torch reports it, in GiB)."""
    return {
        "kind": "cuda",
        "name": name,
        "capability": capability,
        "memory_gib": memory_gib,
        "arch_list": arch_list,
        "bf16_hw": False,
        "fused_sgd": True,
    }


def other(kind, name, memory_gib, bf16_hw):
    return {
        "kind": kind,
        "name": name,
        "memory_gib": memory_gib,
        "bf16_hw": bf16_hw,
        "fused_sgd": True,
    }


# (row, description, bf16, techniques skipped on a torch that runs it,
#  runs on this torch's kind of wheel)
TABLE = [
    ("T4", gpu("Tesla T4", (7, 5), 14.6), "emulated", {"bf16", "tf32"}, True),
    (
        "P100",
        gpu("Tesla P100-PCIE-16GB", (6, 0), 15.9),
        "emulated",
        {"bf16", "tf32", "compile"},
        False,
    ),
    ("V100-16GB", gpu("Tesla V100-SXM2-16GB", (7, 0), 15.8), "emulated", {"bf16", "tf32"}, False),
    ("V100-32GB", gpu("Tesla V100-SXM2-32GB", (7, 0), 31.7), "emulated", {"bf16", "tf32"}, False),
    ("A10G", gpu("NVIDIA A10G", (8, 6), 22.1), "native", set(), True),
    ("L4", gpu("NVIDIA L4", (8, 9), 22.0), "native", set(), True),
    ("A100-40GB", gpu("NVIDIA A100-SXM4-40GB", (8, 0), 39.4), "native", set(), True),
    ("A100-80GB", gpu("NVIDIA A100-SXM4-80GB", (8, 0), 79.2), "native", set(), True),
    ("H100", gpu("NVIDIA H100 80GB HBM3", (9, 0), 79.1), "native", set(), True),
    (
        "Apple M2 Pro",
        other("mps", "Apple M2 Pro GPU (Metal)", 21.3, True),
        "native",
        NOT_CUDA | {"compile"},
        True,
    ),
    (
        "Apple, macOS 13",
        other("mps", "Apple M1 GPU (Metal)", 5.3, False),
        "none",
        NOT_CUDA | {"compile", "bf16"},
        True,
    ),
    ("CPU", other("cpu", "AMD EPYC 7B12", 31.3, False), "emulated", NOT_CUDA, True),
    (
        "CPU with AMX",
        other("cpu", "Intel Xeon Platinum 8480+", 503.5, True),
        "native",
        NOT_CUDA,
        True,
    ),
]


@pytest.mark.parametrize(
    "row, described, bf16, skipped, runs_on_new_wheel", TABLE, ids=[r[0] for r in TABLE]
)
def test_each_device_gets_its_decisions(row, described, bf16, skipped, runs_on_new_wheel):
    caps = devices.capabilities(
        described=described | {"arch_list": OLD_WHEEL} if "arch_list" in described else described
    )
    assert caps.bf16 == bf16
    assert set(caps.skip) == skipped, caps.skip
    assert all(caps.ok(t) == (t not in skipped) for t in devices.TECHNIQUES)
    assert caps.memory_gib == round(described["memory_gib"], 1)
    cuda = described["kind"] == "cuda"
    assert caps.pin_memory is cuda
    # the batch finder: a CUDA GPU's own OOM error; elsewhere half the memory, at most 8 GiB
    assert caps.batch_budget_bytes == (
        None if cuda else int(min(8.0, described["memory_gib"] / 2) * 2**30)
    )
    # this torch's kind of wheel: a P100 or V100 is named, and the CPU runs the notebook
    new = devices.capabilities(described=described)
    assert new.ok("gpu") is runs_on_new_wheel
    if not runs_on_new_wheel:
        cap = described["capability"]
        why = new.skip["gpu"]
        assert why.startswith(f"{described['name']} (compute capability {cap[0]}.{cap[1]})")
        assert f"sm_{cap[0]}{cap[1]}" in why and "sm_75" in why and "run on the CPU" in why


def test_the_reasons_say_what_and_why_in_words():
    t4 = devices.capabilities(described=TABLE[0][1]).skip
    assert t4["bf16"] == (
        "Tesla T4 (compute capability 7.5) has no native bf16 (that needs 8.0+); "
        "emulated bf16 would measure the emulation"
    )
    assert t4["tf32"].startswith("Tesla T4 (compute capability 7.5) has no TF32 tensor cores")
    p100 = devices.capabilities(described=TABLE[1][1] | {"arch_list": OLD_WHEEL}).skip
    assert p100["compile"] == (
        "torch.compile makes no kernels for Tesla P100-PCIE-16GB (compute capability 6.0): "
        "Triton needs compute capability 7.0+"
    )
    mac13 = devices.capabilities(described=TABLE[10][1]).skip
    assert "macOS 14" in mac13["bf16"] and "Metal" in mac13["compile"]
    no_fused = devices.capabilities(
        described=other("xpu", "Intel Arc A770", 15.9, True) | {"fused_sgd": False}
    )
    assert (
        no_fused.skip["fused SGD"] == "this torch has no fused SGD kernel for xpu"
        and no_fused.bf16 == "native"
    )
    assert devices.capabilities(described=other("xpu", "Intel Arc A380", 5.9, False)).skip["bf16"]


def test_the_arch_list_is_read_as_nvcc_writes_it():
    def runs(cap, archs):
        return devices.capabilities(described=gpu("GPU", cap, 16.0, archs)).ok("gpu")

    assert runs((6, 0), ["sm_60", "sm_70"])  # an older wheel
    assert runs((6, 1), ["sm_60"])  # sm_60 code runs on 6.1 (same major, newer minor)
    assert not runs((7, 0), ["sm_75"])  # ... never on an older minor
    assert runs((7, 0), ["sm_80", "compute_70"])  # PTX, compiled when loaded
    assert not runs((6, 1), ["compute_70"])  # PTX for newer GPUs only
    assert not runs((9, 1), ["sm_90a"])  # sm_90a: 9.0 exactly
    assert runs((12, 1), ["sm_120"])  # two-digit major
    assert not runs((8, 0), [])
    assert (
        "CPU-only build" in devices.capabilities(described=gpu("GPU", (8, 0), 16.0, [])).skip["gpu"]
    )


# ------------------------------------------------------------------- the live path, torch faked
@pytest.fixture
def fake_cuda(monkeypatch):
    """torch reports one CUDA GPU; `fake_cuda(row)` makes it the GPU of a row of TABLE."""
    devices._cuda_refused.cache_clear()

    def use(described, arch_list=NEW_WHEEL):
        fake_accelerator(monkeypatch, "cuda", 1)
        gib, (major, minor) = described["memory_gib"], described["capability"]
        props = types.SimpleNamespace(
            name=described["name"], major=major, minor=minor, total_memory=int(gib * 2**30)
        )
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i=0: props)
        monkeypatch.setattr(torch.cuda, "get_arch_list", lambda: list(arch_list))
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda d=None: described["name"])
        devices._cuda_refused.cache_clear()

    yield use
    devices._cuda_refused.cache_clear()


def test_describe_reads_torch_and_the_decisions_follow(fake_cuda):
    fake_cuda(TABLE[0][1])
    d = devices.describe("cuda")
    assert (d["name"], d["capability"], d["arch_list"], round(d["memory_gib"], 1)) == (
        "Tesla T4",
        (7, 5),
        NEW_WHEEL,
        14.6,
    )
    assert set(devices.capabilities("cuda").skip) - {"fused SGD"} == {
        "bf16",
        "tf32",
    }  # a CPU-only torch: no fused kernel
    assert devices.accelerator() == "cuda" and devices.try_gpu() == torch.device("cuda:0")


def test_a_gpu_this_torch_has_no_kernels_for_is_named_and_the_cpu_is_used(
    fake_cuda, capsys, monkeypatch
):
    fake_cuda(TABLE[1][1])  # a P100 beside a CUDA 13 wheel: its first kernel would fail
    assert devices.accelerator() is None and devices.num_gpus() == 0
    assert devices.try_gpu() == torch.device("cpu") and devices.try_all_gpus() == [
        torch.device("cpu")
    ]
    out = capsys.readouterr().out
    assert out.count("GPU not used") == 1, out  # said once, then asked of the cache
    assert "Tesla P100-PCIE-16GB (compute capability 6.0)" in out and "run on the CPU" in out
    monkeypatch.setattr(devices, "_gpu_info", lambda kind, i: pytest.fail("no GPU is listed"))
    text = devices.describe_hardware()
    assert "GPU   : Tesla P100-PCIE-16GB (compute capability 6.0): this torch ships kernels" in text
    assert (
        devices.capabilities(devices.try_gpu()).kind == "cpu"
    )  # every later decision is the CPU's


# ------------------------------------------------------------------- the notebooks' decisions
def _as_if_on(monkeypatch, described):
    monkeypatch.setattr(devices, "describe", lambda device=None: described)
    return torch.device(described["kind"])


T4, P100_OLD_WHEEL, CPU = TABLE[0][1], TABLE[1][1] | {"arch_list": OLD_WHEEL}, TABLE[11][1]


@pytest.mark.parametrize(
    "described, available, said",
    [
        (
            T4,
            ["fp32", "fp16 + GradScaler"],
            "bf16: skipped — Tesla T4 (compute capability 7.5) "
            "has no native bf16 (that needs 8.0+); "
            "emulated bf16 would measure the emulation",
        ),
        (P100_OLD_WHEEL, ["fp32", "fp16 + GradScaler"], "bf16: skipped — Tesla P100-PCIE-16GB"),
        (
            TABLE[9][1],
            ["fp32", "bf16"],
            "fp16: skipped — fp16 + GradScaler is timed on CUDA GPUs only",
        ),
        (CPU, ["fp32", "bf16"], "bf16: no bf16 instructions on this CPU: EMULATED (slow)"),
    ],
    ids=["T4", "P100", "MPS", "CPU"],
)
def test_mixed_precision_variants_skip_with_the_reason(
    described, available, said, monkeypatch, capsys
):
    ns = {
        "devices": devices,
        "torch": torch,
        "device": _as_if_on(monkeypatch, described),
        "fp32_step": None,
        "autocast_step": None,
        "fp16_step": None,
    }
    exec(code_cell("12_mixed_precision.ipynb", 'BF16_HW = caps.bf16 == "native"'), ns)
    assert ns["available"] == available and ns["BF16"] is ("bf16" in available)
    assert said in capsys.readouterr().out


FP16_BAR = ("fp16 autocast + GradScaler", {"precision": "fp16"})
BF16_BAR = ("bf16 autocast", {"precision": "bf16"})


@pytest.mark.parametrize(
    "described, skipped, graphs, low",
    [
        (T4, {"TF32": "no TF32 tensor cores"}, {"mode": "reduce-overhead"}, FP16_BAR),
        (
            P100_OLD_WHEEL,
            {
                "TF32": "no TF32",
                "torch.compile": "Triton needs compute capability 7.0+",
                "+ CUDA graphs": "needs torch.compile",
            },
            {"mode": "reduce-overhead"},
            FP16_BAR,
        ),
        (
            TABLE[2][1] | {"arch_list": OLD_WHEEL},
            {"TF32": "no TF32"},
            {"mode": "reduce-overhead"},
            FP16_BAR,
        ),
        (TABLE[4][1], {}, {"mode": "reduce-overhead"}, BF16_BAR),
        (TABLE[8][1], {}, {"mode": "reduce-overhead"}, BF16_BAR),
        (
            TABLE[10][1],
            {
                "cudnn.benchmark": "cuDNN",
                "TF32": "TF32",
                "bf16 autocast": "macOS 14",
                "torch.compile": "Metal",
                "+ CUDA graphs": "needs a CUDA GPU",
            },
            {},
            BF16_BAR,
        ),
        (
            CPU,
            {
                "cudnn.benchmark": "cuDNN",
                "TF32": "TF32",
                "+ CUDA graphs": "needs a CUDA GPU",
            },
            {},
            BF16_BAR,
        ),
    ],
    ids=["T4", "P100", "V100", "A10G", "H100", "Apple-macOS13", "CPU"],
)
def test_capstone_bars_skip_with_the_reason(described, skipped, graphs, low, monkeypatch):
    """Which bars the capstone runs: fp16 with a GradScaler where bf16 is not native (T4, V100),
    bf16 where it is; TF32 switches matmuls and convolutions and says what changed."""
    ns = {
        "devices": devices,
        "capstone": capstone,
        "torch": torch,
        "device": _as_if_on(monkeypatch, described),
        "BATCH": 64,
        "BIG_BATCH": 128,
        "COMPILE": True,
    }
    matmul, conv = torch.backends.cuda.matmul, torch.backends.cudnn.conv
    before = matmul.fp32_precision, conv.fp32_precision
    try:  # PyTorch's defaults on a CUDA build: fp32 matmuls ("none": inherited "ieee"), TF32 convs
        matmul.fp32_precision, conv.fp32_precision = "none", "tf32"
        exec(code_cell("19_capstone.ipynb", "NEEDS = {"), ns)
    finally:
        matmul.fp32_precision, conv.fp32_precision = before
    assert set(ns["skip"]) == set(skipped)
    assert all(why in ns["skip"][bar] for bar, why in skipped.items()), ns["skip"]
    assert dict(ns["changes"][8][1]) == {
        "compile": graphs
    }  # "+ CUDA graphs": reduce-overhead on CUDA only
    name, change, what = ns["changes"][5]
    assert (name, change) == low and ("GradScaler" in what) is (low == FP16_BAR)
    capstone.Recipe("r", data="memory").but(name, **change)  # a recipe the loop can train
    name, change, what = ns["changes"][4]
    assert (name, change) == ("TF32", {"tf32": True})
    assert ns["DEFAULTS"] == {"matmuls": "none", "convolutions": "tf32"}
    assert what.endswith("changed from the defaults: matmuls")  # convolutions were TF32 already


def test_device_decisions_are_asked_of_capabilities():
    """Nothing outside `devices.describe` reads a capability, bf16 support or the arch list from
    torch."""
    files = [
        *ROOT.glob("notebooks/*.ipynb"),
        *ROOT.glob("helpers/**/*.py"),
        *ROOT.glob("benchmarks/*.py"),
    ]
    for path in files:
        text = path.read_text()
        for asked in ("get_device_capability", "is_bf16_supported", "get_arch_list"):
            assert path.name == "devices.py" or asked not in text, f"{path.name} asks torch {asked}"

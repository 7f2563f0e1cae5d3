"""fp32 precision on every GPU generation: `devices.fp32_precision` (PyTorch's per-operation
`fp32_precision` settings, process flags that a CPU machine holds too), notebook 12's true-fp32
baseline, and the capstone's 16-bit choice over the table of GPUs in `test_capabilities`."""

import types
from pathlib import Path

import pytest
import torch

from helpers import capstone, devices
from tests.notebook_scripts import code_cell
from tests.test_capabilities import TABLE

ROOT = Path(__file__).resolve().parents[1]
ROWS = {row: described for row, described, *_ in TABLE}


@pytest.fixture
def flags():
    """The two settings the helper owns, as they were before the test, put back after it."""
    matmul, conv = torch.backends.cuda.matmul, torch.backends.cudnn.conv
    before = matmul.fp32_precision, conv.fp32_precision
    yield matmul, conv
    matmul.fp32_precision, conv.fp32_precision = before


def _now():
    return torch.backends.cuda.matmul.fp32_precision, torch.backends.cudnn.conv.fp32_precision


def test_fp32_precision_sets_both_and_restores_what_was_there(flags):
    matmul, conv = flags
    matmul.fp32_precision, conv.fp32_precision = "none", "tf32"  # PyTorch's defaults
    with devices.fp32_precision("ieee") as p:
        assert p == "ieee" and _now() == ("ieee", "ieee")
        with devices.fp32_precision("tf32"):  # nested: the inner block gives back the outer's
            assert _now() == ("tf32", "tf32")
        assert _now() == ("ieee", "ieee")
    assert _now() == ("none", "tf32")
    # the legacy getters stay readable once the defaults are back (nothing was mixed)
    assert torch.get_float32_matmul_precision() == "highest" and torch.backends.cudnn.allow_tf32


def test_fp32_precision_restores_after_an_error(flags):
    matmul, conv = flags
    matmul.fp32_precision, conv.fp32_precision = "tf32", "ieee"  # a state unlike either value
    with pytest.raises(RuntimeError, match="boom"), devices.fp32_precision("ieee"):
        assert _now() == ("ieee", "ieee")
        raise RuntimeError("boom")
    assert _now() == ("tf32", "ieee")


@pytest.mark.parametrize("bad", ["highest", "high", "TF32", "none", True, None])
def test_fp32_precision_rejects_a_bad_value_naming_the_parameter(bad, flags):
    before = _now()
    with pytest.raises(
        ValueError, match=r"fp32_precision: precision must be one of 'ieee', 'tf32'"
    ):
        with devices.fp32_precision(bad):
            pass
    assert _now() == before  # nothing was set


class _Recorded:
    """`timing.benchmark` that runs the work once and keeps the fp32 flags it ran under."""

    def __init__(self):
        self.seen = {}

    def benchmark(self, fn, *args, label="", **kwargs):
        fn()
        self.seen[label] = _now()
        return types.SimpleNamespace(median=1.0, per_second=lambda n: float(n))


def test_mixed_precision_times_fp32_as_true_fp32_on_an_ampere_gpu(flags, monkeypatch):
    """On an A100 PyTorch runs fp32 convolutions in TF32 unless told not to: the flags are set to
    what such a GPU runs by default, and every variant's timing must see "ieee" instead."""
    assert devices.capabilities(described=ROWS["A100-40GB"]).ok("tf32")  # the GPU it is about
    matmul, conv = flags
    matmul.fp32_precision, conv.fp32_precision = "tf32", "tf32"  # TF32 on, as it can be there
    timing = _Recorded()
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.Flatten(), torch.nn.LazyLinear(2))
    X, y = torch.randn(4, 3, 6, 6), torch.tensor([0, 1, 0, 1])
    net(X)
    ns = {"torch": torch, "copy": __import__("copy"), "devices": devices, "timing": timing}
    ns |= {"base_net": net, "batches": [(X, y)], "device": torch.device("cpu"), "TIMED_EPOCHS": 1}
    exec(code_cell("12_mixed_precision.ipynb", "def run(name, data=None):"), ns)
    ns["STEPS_BY_NAME"] = {"fp32": lambda net, opt, X, y: torch.tensor(1.0)}
    ns["run"]("fp32")
    assert timing.seen["fp32"] == ("ieee", "ieee")
    assert _now() == ("tf32", "tf32")  # given back after the timing
    # section 2's convolution block: its fp32 side too
    ns |= {
        "nn": torch.nn,
        "BLOCK_BATCH": 2,
        "BF16": True,
        "record": types.SimpleNamespace(measure=lambda *a, **k: None),
    }
    exec(code_cell("12_mixed_precision.ipynb", "def block_step(dtype=None):"), ns)
    assert timing.seen["conv block fp32"] == ("ieee", "ieee") and _now() == ("tf32", "tf32")


@pytest.mark.parametrize(
    "row, chosen",
    [
        ("T4", "fp16"),
        ("V100-16GB", "fp16"),
        ("V100-32GB", "fp16"),
        ("A10G", "bf16"),
        ("A100-40GB", "bf16"),
        ("H100", "bf16"),
        ("Apple M2 Pro", "bf16"),
        ("Apple, macOS 13", None),
        ("CPU", "bf16"),  # as before: measured (emulated), and dropped when slower
        ("CPU with AMX", "bf16"),
    ],
)
def test_the_capstone_picks_fp16_with_a_scaler_where_bf16_is_not_native(row, chosen):
    described = ROWS[row]
    if "arch_list" in described:  # a V100 runs on the older kind of wheel
        described = described | {"arch_list": ["sm_70", "sm_75", "sm_80", "sm_90"]}
    assert capstone.low_precision(devices.capabilities(described=described)) == chosen

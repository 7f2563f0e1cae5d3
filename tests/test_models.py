"""helpers.models: d2l's ResNet-18 (same names, shapes and outputs as d2l's), FLOPs per sample
and the datasheet peaks."""

import subprocess
import sys

import pytest
import torch
from torch import nn

from helpers import models
from helpers.models import resnet18


@pytest.fixture(scope="module")
def d2l():
    return pytest.importorskip("d2l.torch", reason="d2l is installed by `make` (pip --no-deps)")


def _count(net):
    return sum(p.numel() for p in net.parameters())


def _d2l_net(d2l, num_classes=10, in_channels=1):
    net = d2l.resnet18(num_classes, in_channels)
    net(torch.zeros(2, in_channels, 28, 28))  # materialise d2l's lazy layers
    return net


@pytest.mark.parametrize("in_channels", [1, 3])
def test_same_names_and_shapes_as_d2l(d2l, in_channels):
    ours = resnet18(10, in_channels).state_dict()
    theirs = _d2l_net(d2l, 10, in_channels).state_dict()
    assert list(ours) == list(theirs)
    assert {k: v.shape for k, v in ours.items()} == {k: v.shape for k, v in theirs.items()}


def test_state_dict_loads_both_ways_with_same_outputs(d2l):
    torch.manual_seed(0)
    x = torch.randn(4, 1, 28, 28)
    theirs, ours = _d2l_net(d2l).eval(), resnet18().eval()
    ours.load_state_dict(theirs.state_dict(), strict=True)
    torch.testing.assert_close(ours(x), theirs(x))
    ours2, theirs2 = resnet18().eval(), _d2l_net(d2l).eval()
    assert not torch.allclose(ours2(x), theirs2(x))  # different random inits differ...
    theirs2.load_state_dict(ours2.state_dict(), strict=True)
    torch.testing.assert_close(theirs2(x), ours2(x))  # ...until the weights are shared


def test_no_lazy_modules_and_d2l_size(d2l):
    net = resnet18()
    assert not any(isinstance(m, torch.nn.modules.lazy.LazyModuleMixin) for m in net.modules())
    assert _count(net) == _count(_d2l_net(d2l))


def test_width_shrinks_and_bad_args():
    assert _count(resnet18(width=8)) < _count(resnet18()) / 30
    assert resnet18(width=8)(torch.zeros(2, 1, 28, 28)).shape == (2, 10)
    for bad in ({"num_classes": 0}, {"in_channels": -1}, {"width": 2.5}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            resnet18(**bad)


def test_resnet18_training_flops_match_hand_count():
    # d2l ResNet-18 at 28x28: 0.912 GFLOP forward, x3 for forward + backward
    train = models.training_flops_per_sample(resnet18(), (1, 28, 28))
    assert train == pytest.approx(3 * 0.9116e9, rel=1e-2) and train == pytest.approx(
        2.734e9, rel=1e-3
    )


def test_linear_layer_flops_are_exact():
    net = nn.Linear(10, 5, bias=False)
    # forward 2 * 10 * 5 (multiply-adds); backward the weight's gradient, as many again (the
    # input needs no gradient)
    assert (
        models.training_flops_per_sample(net, (10,), loss_fn=lambda out, y: out.sum())
        == 2 * 2 * 10 * 5
    )


def test_wrappers_are_unwrapped_and_model_untouched():
    net = resnet18(width=4)
    before = {k: v.clone() for k, v in net.state_dict().items()}
    a = models.training_flops_per_sample(net, (1, 28, 28))
    b = models.training_flops_per_sample(nn.DataParallel(net), (1, 28, 28))
    assert a == b > 0
    assert all(torch.equal(before[k], v) for k, v in net.state_dict().items())
    assert all(p.grad is None for p in net.parameters())


@pytest.mark.parametrize(
    "name,precision,tflops",
    [
        ("NVIDIA H100 80GB HBM3", "bf16", 989.4),
        ("NVIDIA H100 PCIe", "bf16", 756.5),
        ("NVIDIA H200", "bf16", 989.4),
        ("NVIDIA A100-SXM4-80GB", "tf32", 156.0),
        ("NVIDIA A10", "bf16", 125.0),
        ("Tesla V100-SXM2-16GB", "fp16", 125.0),
        ("Tesla V100-PCIE-32GB", "fp16", 112.0),  # a PCIe card clocks lower than the SXM2 module
        ("Tesla V100-PCIE-16GB", "fp32", 14.0),
    ],
)
def test_peak_table(name, precision, tflops):
    assert models.peak_flops(name, precision) == pytest.approx(tflops * 1e12)


def test_unknown_devices_give_none_not_a_guess():
    assert models.peak_flops("Intel(R) Xeon(R) CPU") is None
    assert models.peak_flops("Tesla V100-SXM2-16GB", "bf16") is None  # no bf16 hardware
    assert models.peak_flops("Tesla V100S-PCIE-32GB", "fp16") is None  # not in the table
    assert models.peak_flops("NVIDIA B200", "fp32") is None  # no sourced plain-FP32 peak
    assert models.fraction_of_peak(1e12, "some laptop") is None
    assert models.fraction_of_peak(494.7e12, "NVIDIA H100 80GB HBM3", "bf16") == pytest.approx(0.5)


def test_bad_input():
    with pytest.raises(ValueError, match="precision"):
        models.peak_flops("NVIDIA H100", "int8")
    with pytest.raises(ValueError, match="sample_shape"):
        models.training_flops_per_sample(nn.Linear(2, 2), (0,))
    with pytest.raises(ValueError, match="flops_per_second"):
        models.fraction_of_peak(-1, "NVIDIA H100")


def test_a_cpu_refuses_a_width_whose_channels_last_backward_crashes():
    """Below 8 channels oneDNN's channels_last 1x1 strided backward crashed the process (a
    SIGSEGV, not an exception): the parameters cell must stop first, naming WIDTH."""
    with pytest.raises(ValueError, match="WIDTH must be >= 8 on a CPU, got 4"):
        models.check_channels_last_width(4, "cpu")
    assert models.check_channels_last_width(8, "cpu") == 8
    assert models.check_channels_last_width(4, "cuda") == 4  # cuDNN has no such limit


def test_the_width_floor_is_where_the_crash_stops():
    """Run in a child process (a crash must not take pytest down): one channels_last training
    step of the 1x1 stride-2 shortcut at the floor's width passes and matches NCHW."""
    code = (
        "import torch\n"
        "from torch import nn\n"
        "from helpers import models\n"
        "torch.set_num_threads(1)\n"
        "c = models.CPU_CHANNELS_LAST_MIN_WIDTH\n"
        "torch.manual_seed(0)\n"
        "m = nn.Conv2d(c, 2 * c, 1, 2)\n"
        "X = torch.randn(16, c, 28, 28)\n"
        "m(X).square().sum().backward()\n"
        "g = m.weight.grad.clone()\n"
        "m.weight.grad = None\n"
        "m = m.to(memory_format=torch.channels_last)\n"
        "m(X.contiguous(memory_format=torch.channels_last)).square().sum().backward()\n"
        "assert torch.allclose(m.weight.grad, g, rtol=1e-4, atol=1e-3)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]

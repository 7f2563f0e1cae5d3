import pytest
import torch
from torch import nn

from helpers import flops, models


def test_resnet18_training_flops_match_hand_count():
    # d2l ResNet-18 at 28x28: 0.912 GFLOP forward, x3 for forward + backward
    train = flops.training_flops_per_sample(models.resnet18(), (1, 28, 28))
    assert train == pytest.approx(3 * 0.9116e9, rel=1e-2) and train == pytest.approx(2.734e9, rel=1e-3)


def test_linear_layer_flops_are_exact():
    net = nn.Linear(10, 5, bias=False)
    # forward 2 * 10 * 5 (multiply-adds); backward the weight's gradient, as many again (the
    # input needs no gradient)
    assert flops.training_flops_per_sample(net, (10,), loss_fn=lambda out, y: out.sum()) == 2 * 2 * 10 * 5


def test_wrappers_are_unwrapped_and_model_untouched():
    net = models.resnet18(width=4)
    before = {k: v.clone() for k, v in net.state_dict().items()}
    a = flops.training_flops_per_sample(net, (1, 28, 28))
    b = flops.training_flops_per_sample(nn.DataParallel(net), (1, 28, 28))
    assert a == b > 0
    assert all(torch.equal(before[k], v) for k, v in net.state_dict().items())
    assert all(p.grad is None for p in net.parameters())


@pytest.mark.parametrize("name,precision,tflops", [
    ("NVIDIA H100 80GB HBM3", "bf16", 989.4),
    ("NVIDIA H100 PCIe", "bf16", 756.5),
    ("NVIDIA H200", "bf16", 989.4),
    ("NVIDIA A100-SXM4-80GB", "tf32", 156.0),
    ("NVIDIA A10", "bf16", 125.0),
    ("Tesla V100-SXM2-16GB", "fp16", 125.0),
])
def test_peak_table(name, precision, tflops):
    assert flops.peak_flops(name, precision) == pytest.approx(tflops * 1e12)


def test_unknown_devices_give_none_not_a_guess():
    assert flops.peak_flops("Intel(R) Xeon(R) CPU") is None
    assert flops.peak_flops("Tesla V100-SXM2-16GB", "bf16") is None   # no bf16 hardware
    assert flops.fraction_of_peak(1e12, "some laptop") is None
    assert flops.fraction_of_peak(494.7e12, "NVIDIA H100 80GB HBM3", "bf16") == pytest.approx(0.5)


def test_bad_input():
    with pytest.raises(ValueError, match="precision"):
        flops.peak_flops("NVIDIA H100", "int8")
    with pytest.raises(ValueError, match="sample_shape"):
        flops.training_flops_per_sample(nn.Linear(2, 2), (0,))
    with pytest.raises(ValueError, match="flops_per_second"):
        flops.fraction_of_peak(-1, "NVIDIA H100")

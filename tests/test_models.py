import pytest
import torch

from helpers.models import resnet18

d2l = pytest.importorskip("d2l.torch", reason="d2l is installed by `make` (pip --no-deps)")


def _count(net):
    return sum(p.numel() for p in net.parameters())


def _d2l_net(num_classes=10, in_channels=1):
    net = d2l.resnet18(num_classes, in_channels)
    net(torch.zeros(2, in_channels, 28, 28))  # materialise d2l's lazy layers
    return net


@pytest.mark.parametrize("in_channels", [1, 3])
def test_same_names_and_shapes_as_d2l(in_channels):
    ours = resnet18(10, in_channels).state_dict()
    theirs = _d2l_net(10, in_channels).state_dict()
    assert list(ours) == list(theirs)
    assert {k: v.shape for k, v in ours.items()} == {k: v.shape for k, v in theirs.items()}


def test_state_dict_loads_both_ways_with_same_outputs():
    torch.manual_seed(0)
    x = torch.randn(4, 1, 28, 28)
    theirs, ours = _d2l_net().eval(), resnet18().eval()
    ours.load_state_dict(theirs.state_dict(), strict=True)
    torch.testing.assert_close(ours(x), theirs(x))
    ours2, theirs2 = resnet18().eval(), _d2l_net().eval()
    assert not torch.allclose(ours2(x), theirs2(x))  # different random inits differ...
    theirs2.load_state_dict(ours2.state_dict(), strict=True)
    torch.testing.assert_close(theirs2(x), ours2(x))  # ...until the weights are shared


def test_no_lazy_modules_and_d2l_size():
    net = resnet18()
    assert not any(isinstance(m, torch.nn.modules.lazy.LazyModuleMixin) for m in net.modules())
    assert _count(net) == _count(_d2l_net())


def test_width_shrinks_and_bad_args():
    assert _count(resnet18(width=8)) < _count(resnet18()) / 30
    assert resnet18(width=8)(torch.zeros(2, 1, 28, 28)).shape == (2, 10)
    for bad in ({"num_classes": 0}, {"in_channels": -1}, {"width": 2.5}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            resnet18(**bad)

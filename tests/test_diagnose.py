"""helpers.diagnose.StepWindow: profiles the steps it is told to, and says how busy they were."""

import torch

from helpers import diagnose, models


def _loop(window, steps):
    torch.manual_seed(0)
    net = models.resnet18(width=4, in_channels=1)
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    for k in range(1, steps + 1):
        X, y = torch.randn(16, 1, 28, 28), torch.randint(0, 10, (16,))
        opt.zero_grad()
        torch.nn.functional.cross_entropy(net(X), y).backward()
        opt.step()
        window(k)


def test_step_window_profiles_its_steps_and_a_compute_bound_loop_is_busy():
    w = diagnose.StepWindow(device="cpu", warmup=1, steps=2)
    _loop(w, w.stop_after + 2)  # the loop runs on past the window: those steps are not profiled
    w.finish()
    assert w.steps_done == 2 and w.count("aten::convolution") > 0 and w.count("no such op") == 0
    assert 0.5 < w.busy_fraction <= 1.0  # convolutions, not Python, fill a ResNet step


def test_step_window_closed_early_and_never_reached():
    early = diagnose.StepWindow(device="cpu", warmup=1, steps=5)
    _loop(early, 3)
    assert early.finish(3).steps_done == 2 and early.busy_fraction is not None
    never = diagnose.StepWindow(device="cpu", warmup=4, steps=2)
    _loop(never, 2)
    assert never.finish().steps_done == 0 and never.busy_fraction is None and never.count("aten") == 0

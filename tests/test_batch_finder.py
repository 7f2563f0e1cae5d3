"""The largest-batch search: finds the edge, backs off after OOM, validates its input."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from helpers import batch_finder, memory


def _oom_above(limit: int, calls: list[int]):
    def try_batch(bs: int) -> int:
        calls.append(bs)
        if bs > limit:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return bs * 1000
    return try_batch


def test_doubles_then_bisects_to_the_exact_edge():
    calls: list[int] = []
    found = batch_finder.largest_batch(_oom_above(300, calls), start=1, max_batch=4096)
    assert found.batch_size == 300
    assert calls[:10] == [1, 2, 4, 8, 16, 32, 64, 128, 256, 512]
    assert any(not ok and why == "out of memory" for _, ok, _, why in found.tried)
    assert "largest batch that fits: 300" in found.describe()


def test_multiple_of_and_max_batch():
    found = batch_finder.largest_batch(_oom_above(300, []), start=8, multiple_of=8)
    assert found.batch_size == 296
    capped = batch_finder.largest_batch(_oom_above(10**9, []), start=1, max_batch=100)
    assert capped.batch_size == 100


def test_progress_bar_counts_every_try_and_changes_nothing(capsys):
    calls: list[int] = []
    found = batch_finder.largest_batch(_oom_above(300, calls), start=1, max_batch=4096, progress=True)
    assert found.batch_size == 300 and len(found.tried) == len(calls)
    assert "batch search" in capsys.readouterr().err  # the bar was drawn (on stderr)
    quiet = batch_finder.largest_batch(_oom_above(300, []), start=1, max_batch=4096)
    assert quiet.batch_size == 300 and "batch search" not in capsys.readouterr().err


def test_budget_counts_as_not_fitting():
    found = batch_finder.largest_batch(lambda bs: bs * 1000, start=1, budget_bytes=50_000,
                                       max_batch=1024)
    assert found.batch_size == 50
    assert any("budget" in why for _, _, _, why in found.tried)


def test_nothing_fits_and_cpu_style_oom_message():
    def cpu_oom(bs):
        raise RuntimeError("[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: not enough memory")
    assert batch_finder.largest_batch(cpu_oom).batch_size == 0


def test_other_errors_propagate():
    def broken(bs):
        raise RuntimeError("mat1 and mat2 shapes cannot be multiplied")
    with pytest.raises(RuntimeError, match="shapes"):
        batch_finder.largest_batch(broken)


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"start": 0}, "start must be an int >= 1"),
    ({"max_batch": 0}, "max_batch must be an int >= 1"),
    ({"start": 8, "max_batch": 4}, "max_batch .* must be >= start"),
    ({"multiple_of": 0}, "multiple_of"),
    ({"budget_bytes": -1}, "budget_bytes must be a positive finite number or None"),
    ({"progress": "yes"}, "progress must be True or False"),
])
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        batch_finder.largest_batch(lambda bs: 0, **kwargs)


def test_real_cpu_search_with_step_memory_budget():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 64, 10))

    def try_batch(bs):
        X, y = torch.randn(bs, 1, 8, 8), torch.randint(0, 10, (bs,))
        return memory.step_memory(net, X, y)["peak_bytes"]

    small, big = try_batch(4), try_batch(64)
    assert big > small
    budget = (small + big) // 2
    found = batch_finder.largest_batch(try_batch, start=4, max_batch=64, budget_bytes=budget)
    assert 4 <= found.batch_size < 64
    assert try_batch(found.batch_size) <= budget < try_batch(found.batch_size + 1)

import pytest
import torch

from helpers.threads import cpu_threads


def test_cpu_threads_sets_and_restores():
    before = torch.get_num_threads()
    other = 2 if before == 1 else 1  # a value that differs, so setting and restoring can fail
    with cpu_threads(other) as n:
        assert n == other and torch.get_num_threads() == other
    assert torch.get_num_threads() == before
    with pytest.raises(RuntimeError), cpu_threads(1):
        raise RuntimeError("boom")
    assert torch.get_num_threads() == before
    with pytest.raises(ValueError, match="n must be an int >= 1"):
        with cpu_threads(0):
            pass


def test_share_never_oversubscribes_the_cores(monkeypatch):
    from helpers import threads

    monkeypatch.setattr(threads, "usable_cores", lambda: 8)
    assert [threads.share(p) for p in (1, 2, 3, 5, 8, 20)] == [8, 4, 2, 1, 1, 1]
    for p in range(1, 9):
        assert threads.share(p) * p <= 8
    with pytest.raises(ValueError, match="processes must be an int >= 1, got 0"):
        threads.share(0)

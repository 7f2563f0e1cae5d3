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

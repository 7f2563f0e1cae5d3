import pytest
import torch

from helpers import devices


def test_try_all_gpus_returns_cpu_without_gpus(monkeypatch):
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    assert devices.try_all_gpus() == [torch.device("cpu")]
    assert devices.try_gpu() == torch.device("cpu")


def test_try_gpu_with_fake_gpus(monkeypatch):
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert devices.try_gpu(1) == torch.device("cuda:1")
    assert devices.try_gpu(2) == torch.device("cpu")
    assert devices.try_all_gpus() == [torch.device("cuda:0"), torch.device("cuda:1")]


@pytest.mark.parametrize("bad", [-1, 1.5, "0", True])
def test_try_gpu_bad_index(bad):
    with pytest.raises(ValueError, match="i must be an int"):
        devices.try_gpu(bad)


def test_as_device():
    assert devices.as_device("cpu") == torch.device("cpu")
    with pytest.raises(ValueError, match="'cpu', 'cuda'"):
        devices.as_device("tpu")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="no CUDA GPU"):
            devices.as_device("cuda")


def test_hardware_summary_has_what_the_report_needs():
    s = devices.hardware_summary()
    for key in ("cpu", "cpu_cores_usable", "ram_gib", "gpus", "cuda_version", "cpu_bf16_instructions", "torch"):
        assert key in s
    assert s["cpu_cores_usable"] >= 1 and s["ram_gib"] > 0
    assert len(s["gpus"]) == torch.cuda.device_count()
    text = devices.describe_hardware(s)
    assert "RAM" in text and ("GPU 0" in text or "none found" in text)


def test_synchronize_none_waits_for_every_gpu(monkeypatch):
    """`synchronize()` promises every GPU: each index is synchronised, not just the current one."""
    calls = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 3)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda d=None: calls.append(d))
    devices.synchronize()
    assert calls == [0, 1, 2]
    calls.clear()
    devices.synchronize(torch.device("cpu"))
    assert calls == []

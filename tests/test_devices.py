"""Device logic for CUDA, Apple MPS and the CPU. This machine has no GPU, so the accelerator
backends are faked with monkeypatch: `torch.accelerator` (what the helpers ask first), and
`torch.backends.mps` / `torch.mps` (the MPS-specific counters). Until these paths run on a Mac,
this is how the MPS code is tested."""

import subprocess
import sys
import time
import types

import pytest
import torch
import torch._dynamo  # imported before the fakes: its import reads what they replace

from helpers import devices, profiles, training


def fake_accelerator(monkeypatch, kind, count=1, synced=None):
    """Make torch report `kind` ('cuda', 'mps' or None) with `count` devices."""
    acc = types.SimpleNamespace(
        is_available=lambda: kind is not None,
        current_accelerator=lambda check_available=False: torch.device(kind) if kind else None,
        device_count=lambda: count if kind else 0,
        synchronize=lambda device=None: synced.append(device) if synced is not None else None,
    )
    monkeypatch.setattr(torch, "accelerator", acc)
    return acc


@pytest.fixture
def mps(monkeypatch):
    """An Apple GPU: torch.accelerator says mps, torch.backends.mps says available, macOS 14."""
    synced: list = []
    fake_accelerator(monkeypatch, "mps", 1, synced)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: True)
    monkeypatch.setattr(
        torch.backends.mps,
        "is_macos_or_newer",
        lambda major, minor: (14, 0) >= (major, minor),
        raising=False,
    )
    monkeypatch.setattr(torch.mps, "current_allocated_memory", lambda: 123 * 2**20)
    monkeypatch.setattr(torch.mps, "recommended_max_memory", lambda: 12 * 2**30, raising=False)
    monkeypatch.setattr(devices, "_cpu_name", lambda: "Apple M2 Pro")
    return synced


def test_try_all_gpus_returns_cpu_without_gpus(monkeypatch):
    fake_accelerator(monkeypatch, None)
    assert devices.accelerator() is None
    assert devices.try_all_gpus() == [torch.device("cpu")]
    assert devices.try_gpu() == torch.device("cpu")
    assert devices.num_gpus() == 0


def test_try_gpu_with_fake_cuda_gpus(monkeypatch):
    fake_accelerator(monkeypatch, "cuda", 2)
    assert devices.try_gpu(1) == torch.device("cuda:1")
    assert devices.try_gpu(2) == torch.device("cpu")
    assert devices.try_all_gpus() == [torch.device("cuda:0"), torch.device("cuda:1")]


def test_mps_is_the_gpu_on_an_apple_machine(mps):
    assert devices.accelerator() == "mps"
    assert devices.try_gpu() == torch.device("mps")
    assert devices.try_gpu(1) == torch.device("cpu")  # one Apple GPU
    assert devices.try_all_gpus() == [torch.device("mps")]
    assert devices.as_device("mps") == torch.device("mps")
    with pytest.raises(ValueError, match="no CUDA GPU"):
        devices.as_device("cuda")


def test_synchronize_follows_the_device(mps):
    devices.synchronize(torch.device("cpu"))
    assert mps == []  # the CPU has nothing to wait for
    devices.synchronize("mps")
    devices.synchronize()
    assert mps == [torch.device("mps"), None]


def test_mps_memory_counters_and_autocast(mps):
    assert not devices.has_peak_memory_counter("mps")
    assert devices.memory_allocated("mps") == 123 * 2**20
    with pytest.raises(ValueError, match="no peak-memory counter"):
        devices.max_memory_allocated("mps")
    caps = (
        devices.capabilities()
    )  # described from the (fake) torch: tests/test_capabilities.py decides
    assert not caps.pin_memory  # unified memory: nothing to pin
    assert caps.kind == "mps" and caps.bf16 == "native" and caps.memory_gib == 12.0


def test_mps_without_bf16_refuses_bf16(mps, monkeypatch):
    monkeypatch.setattr(
        torch.backends.mps, "is_macos_or_newer", lambda major, minor: False, raising=False
    )
    caps = devices.capabilities("mps")
    assert caps.bf16 == "none" and "macOS 14" in caps.skip["bf16"]


def test_peak_step_bytes_on_mps_counts_instead_of_faking_a_peak(mps):
    net = torch.nn.Linear(4, 2)
    peak, how = training.peak_step_bytes(lambda: net(torch.randn(3, 4)).sum().backward(), "mps")
    assert (
        peak > 0 and "dispatch-mode" in how
    )  # MPS has no peak counter: the step's tensors are counted


def test_hardware_summary_names_the_apple_chip_and_unified_memory(mps):
    s = devices.hardware_summary()
    assert s["accelerator"] == "mps"
    (g,) = s["gpus"]
    assert (
        g["name"] == "Apple M2 Pro GPU (Metal)" and g["unified_memory"] and g["memory_gib"] == 12.0
    )
    text = devices.describe_hardware(s)
    assert "unified memory" in text and "Apple M2 Pro" in text
    assert devices.device_name("mps") == "Apple M2 Pro GPU (Metal)"


def test_auto_profile_follows_the_device(monkeypatch, mps):
    assert profiles.active("auto").name == "gpu"
    fake_accelerator(monkeypatch, None)
    assert profiles.active("auto").name == "smoke"


@pytest.mark.parametrize("bad", [-1, 1.5, "0", True])
def test_try_gpu_bad_index(bad):
    with pytest.raises(ValueError, match="i must be an int"):
        devices.try_gpu(bad)


def test_as_device():
    assert devices.as_device("cpu") == torch.device("cpu")
    with pytest.raises(ValueError, match="'cpu', 'cuda'"):
        devices.as_device("tpu")
    if devices.accelerator() != "cuda":
        with pytest.raises(ValueError, match="no CUDA GPU"):
            devices.as_device("cuda")


def test_hardware_summary_has_what_the_report_needs():
    s = devices.hardware_summary()
    for key in (
        "cpu",
        "cpu_cores_usable",
        "ram_gib",
        "gpus",
        "cuda_version",
        "cpu_bf16_instructions",
        "torch",
    ):
        assert key in s
    assert s["cpu_cores_usable"] >= 1 and s["ram_gib"] > 0
    assert len(s["gpus"]) == devices.num_gpus()
    text = devices.describe_hardware(s)
    assert "RAM" in text and ("GPU 0" in text or "none found" in text)


def test_synchronize_none_waits_for_every_gpu(monkeypatch):
    """`synchronize()` promises every GPU: each index is synchronised, not just the current one."""
    calls = []
    fake_accelerator(monkeypatch, "cuda", 3, calls)
    devices.synchronize()
    assert calls == [0, 1, 2]
    calls.clear()
    devices.synchronize(torch.device("cpu"))
    devices.synchronize("cpu")
    assert calls == []


def test_cpu_threads_sets_and_restores():
    before = torch.get_num_threads()
    other = 2 if before == 1 else 1  # a value that differs, so setting and restoring can fail
    with devices.cpu_threads(other) as n:
        assert n == other and torch.get_num_threads() == other
    assert torch.get_num_threads() == before
    with pytest.raises(RuntimeError), devices.cpu_threads(1):
        raise RuntimeError("boom")
    assert torch.get_num_threads() == before
    with pytest.raises(ValueError, match="n must be an int >= 1"):
        with devices.cpu_threads(0):
            pass


def test_free_cores_leaves_out_a_core_another_program_keeps_busy():
    quiet = devices.free_cores()
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.3)  # the spinner's interpreter has started and spins
        beside = devices.free_cores()
    finally:
        spinner.kill()
        spinner.wait()
    assert 1 <= beside <= max(1, quiet - 1) and quiet <= devices.usable_cores()


def test_share_never_oversubscribes_the_cores(monkeypatch):
    monkeypatch.setattr(devices, "free_cores", lambda: 8)
    assert [devices.share(p) for p in (1, 2, 3, 5, 8, 20)] == [8, 4, 2, 1, 1, 1]
    for p in range(1, 9):
        assert devices.share(p) * p <= 8
    with pytest.raises(ValueError, match="processes must be an int >= 1, got 0"):
        devices.share(0)


def test_float64_references_leave_an_apple_gpu_for_the_cpu():
    assert devices.float64_device("mps") == torch.device("cpu")
    assert devices.float64_device("cuda:1") == torch.device("cuda:1")  # not checked to exist
    assert devices.float64_device(torch.device("cpu")) == torch.device("cpu")
    with pytest.raises(ValueError, match="device"):
        devices.float64_device("tpu")

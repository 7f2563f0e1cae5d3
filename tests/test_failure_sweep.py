"""The failure sweep: bad input and faults get a clear error, nothing hangs, nothing is left behind.

Three parts:
1. `CASES`: every public function and class of `helpers` called with wrong types, zero or
   negative sizes and unknown names. Each must raise the expected exception with a message that
   names the parameter and what is allowed. **Adding a case is one line** in the table:
   `case(callable, exception, message regex, *args, **kwargs)`; modules that later notebooks add
   (training loop, pipelines, launch/DDP, profiling) get their own block of lines.
2. A data set folder that is missing, empty, or holds a truncated or corrupt file: a clear error
   naming the file, within a time limit.
3. A loop over a multi-worker DataLoader interrupted by KeyboardInterrupt (in-process), and a
   training run (`training.train`) in a subprocess stopped by SIGINT (to its process
   group, as a terminal's Ctrl-C or Jupyter's interrupt does, or to its main process only), end
   within a bounded time and leave no worker processes.

Each case is one pytest item, so the count pytest reports is the count of cases tried.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
import psutil
import pytest
import torch
from torch.utils.data import DataLoader
from torchvision import transforms

from helpers import (
    capstone,
    data,
    devices,
    diagnose,
    launch,
    models,
    paths,
    pipelines,
    plotting,
    profiles,
    synthetic,
    timing,
    training,
)
from helpers.suite import catalog, report, results, runner
from tests.interrupt import interruptible


@dataclass
class Case:
    fn: Any
    exc: type[BaseException] | tuple[type[BaseException], ...]
    match: str
    args: tuple = ()
    kwargs: dict = field(default_factory=dict)

    @property
    def id(self) -> str:
        name = getattr(self.fn, "__qualname__", repr(self.fn))
        arg = ",".join(
            [
                *(repr(a)[:20] for a in self.args),
                *(f"{k}={v!r}"[:24] for k, v in self.kwargs.items()),
            ]
        )
        return f"{name}({arg})"


def case(fn: Any, exc: Any, match: str, *args: Any, **kwargs: Any) -> Case:
    return Case(fn, exc, match, args, kwargs)


# Objects that methods are called on (built lazily, inside the test, so that the Recorder
# writes into the test's temporary build folder).
def recorder(method: str):
    def call(*args: Any, **kwargs: Any) -> Any:
        return getattr(results.Recorder("sweep"), method)(*args, **kwargs)

    call.__qualname__ = f"Recorder.{method}"
    return call


def measurement(median: float):
    def per_second(*args: Any, **kwargs: Any) -> Any:
        return timing.Measurement("m", median, 0.0, median, [median]).per_second(*args, **kwargs)

    per_second.__qualname__ = f"Measurement(median={median}).per_second"
    return per_second


class NotAModule:
    pass


def noop() -> None:
    return None


def entered(cm_fn):
    """For context managers, whose checks run on entering."""

    def call(*args: Any, **kwargs: Any) -> Any:
        with cm_fn(*args, **kwargs):
            pass

    call.__qualname__ = f"with {cm_fn.__qualname__}"
    return call


UINT8_1 = np.zeros((1, 4, 4, 1), np.uint8)
X4 = torch.zeros(4, 3, 8, 8, dtype=torch.uint8)
Y4 = torch.zeros(4, dtype=torch.int64)
NO_GPU = devices.num_gpus() == 0
POSITIVE = r"must be (a positive int|an int >= 1)"

CASES = [
    # --- models ----------------------------------------------------------------------------
    case(models.resnet18, ValueError, r"resnet18: width must be an int >= 1, got 0", width=0),
    case(
        models.check_channels_last_width,
        ValueError,
        r"check_channels_last_width: WIDTH must be an int >= 1, got 'eight'",
        "eight",
        "cpu",
    ),
    case(
        models.check_channels_last_width,
        ValueError,
        r"WIDTH must be >= 8 on a CPU, got 2: oneDNN",
        2,
        "cpu",
    ),
    case(models.resnet18, ValueError, r"resnet18: width must be an int >= 1, got -8", width=-8),
    case(
        models.resnet18,
        ValueError,
        r"resnet18: num_classes must be an int >= 1, got '10'",
        num_classes="10",
    ),
    case(
        models.resnet18,
        ValueError,
        r"resnet18: in_channels must be an int >= 1, got 0",
        in_channels=0,
    ),
    case(
        models.resnet18,
        ValueError,
        r"resnet18: in_channels must be an int >= 1, got True",
        in_channels=True,
    ),
    case(models.resnet18, ValueError, r"resnet18: width must be an int >= 1, got 1.5", width=1.5),
    case(models.Residual, ValueError, r"Residual: in_channels must be an int >= 1, got 0", 0, 8),
    case(
        models.Residual, ValueError, r"Residual: num_channels must be an int >= 1, got 'a'", 4, "a"
    ),
    case(
        models.Residual,
        ValueError,
        r"Residual: strides must be an int >= 1, got 0",
        4,
        8,
        strides=0,
    ),
    case(
        models.peak_flops,
        ValueError,
        r"peak_flops: precision must be one of 'bf16', 'fp16', 'tf32', 'fp32', got 'int8'",
        "NVIDIA H100",
        "int8",
    ),
    case(
        models.peak_flops,
        TypeError,
        r"device_name must be a string such as 'NVIDIA H100 80GB HBM3', got 5",
        5,
    ),
    case(
        models.fraction_of_peak,
        ValueError,
        r"fraction_of_peak: flops_per_second must be a finite number >= 0, got -1",
        -1,
        "NVIDIA H100",
    ),
    case(
        models.training_flops_per_sample,
        ValueError,
        r"sample_shape must be positive ints like \(1, 28, 28\), got \(0,\)",
        torch.nn.Linear(2, 2),
        (0,),
    ),
    case(
        models.training_flops_per_sample,
        ValueError,
        r"training_flops_per_sample: batch must be an int >= 1, got 0",
        torch.nn.Linear(2, 2),
        (2,),
        batch=0,
    ),
    # --- timing ----------------------------------------------------------------------------
    case(timing.benchmark, TypeError, r"fn must be callable, got int", 5),
    case(timing.benchmark, ValueError, r"repeats must be an int >= 1, got 0", noop, repeats=0),
    case(timing.benchmark, ValueError, r"repeats must be an int >= 1, got -1", noop, repeats=-1),
    case(timing.benchmark, ValueError, r"repeats must be an int >= 1, got 2.5", noop, repeats=2.5),
    case(timing.benchmark, ValueError, r"warmup must be an int >= 0, got -1", noop, warmup=-1),
    case(timing.benchmark, ValueError, r"number must be an int >= 1, got 0", noop, number=0),
    case(timing.benchmark, ValueError, r"number must be an int >= 1, got '3'", noop, number="3"),
    case(timing.measurement, TypeError, r"measurement: times must be a list of seconds", "1"),
    case(timing.measurement, ValueError, r"times must be a non-empty list of seconds", []),
    case(timing.measurement, ValueError, r"measurement: times must be seconds >= 0, got -1", [-1]),
    case(timing.measurement, ValueError, r"window must be a positive finite number", [1], window=0),
    case(timing.ratio, TypeError, r"ratio: a must be a timing.Measurement, seconds, or a", "x", 1),
    case(timing.ratio, ValueError, r"ratio: b's times include 0 s: nothing to divide by", 1, 0.0),
    case(
        timing.Ratio,
        ValueError,
        r"Ratio: value 3 must lie in its range, 1 to 2",
        3,
        1,
        2,
        ((1, None),),
    ),
    case(
        timing.Ratio,
        ValueError,
        r"Ratio: windows must be a non-empty tuple of \(seconds",
        1,
        1,
        1,
        (),
    ),
    case(
        timing.Timer,
        ValueError,
        r"device must be 'cpu', 'cuda', 'cuda:N', 'mps' or 'xpu'; got 'tpu'",
        device="tpu",
    ),
    case(
        timing.Timer,
        TypeError,
        r"device must be a string \('cpu', 'cuda', 'cuda:N', 'mps' or 'xpu'\)",
        device=5,
    ),
    case(
        measurement(1.0), ValueError, r"per_second: items must be a finite number >= 0, got -5", -5
    ),
    case(
        measurement(1.0),
        ValueError,
        r"per_second: items must be a finite number >= 0, got '64'",
        "64",
    ),
    case(measurement(0.0), ValueError, r"median of 0.0 s, too short .*number=", 64),
    # --- plotting --------------------------------------------------------------------------
    case(
        plotting.one_at_a_time,
        TypeError,
        r"one_at_a_time: fn must be a function \(the explore callback\), got int 3",
        3,
    ),
    case(
        plotting.bar_compare,
        ValueError,
        r"labels and values must be non-empty and the same length",
        [],
        [],
        unit="s",
    ),
    case(
        plotting.bar_compare,
        ValueError,
        r"labels and values must be non-empty and the same length",
        ["a"],
        [1, 2],
        unit="s",
    ),
    case(
        plotting.bar_compare,
        ValueError,
        r"the baseline \(first\) value must be positive",
        ["a", "b"],
        [0, 2],
        unit="s",
    ),
    case(
        plotting.bar_compare,
        TypeError,
        r"values\[0\] \('a'\) must be a number, got str",
        ["a", "b"],
        ["1", 2],
        unit="s",
    ),
    case(
        plotting.bar_compare,
        ValueError,
        r"values must be finite and >= 0; not so for \['b'\]",
        ["a", "b"],
        [1, float("nan")],
        unit="s",
    ),
    case(
        plotting.bar_compare,
        ValueError,
        r"values must be finite and >= 0; not so for \['b'\]",
        ["a", "b"],
        [1, -2],
        unit="s",
    ),
    case(plotting.waterfall, ValueError, r"give at least one \(label, value\) step", []),
    case(plotting.waterfall, ValueError, r"every value must be positive", [("a", 0)]),
    case(plotting.waterfall, ValueError, r"every value must be positive", [("a", 2), ("b", -1)]),
    case(plotting.waterfall, ValueError, r"steps\[0\] must be a \(label, value\) pair", [("a",)]),
    case(
        plotting.waterfall, TypeError, r"value of step 'a' must be a number, got str", [("a", "x")]
    ),
    case(
        plotting.sweep, ValueError, r"for at least one name", {}, xlabel="L", ylabel="s", title=""
    ),
    case(
        plotting.sweep,
        ValueError,
        r"drawn on a log axis: 'a' at 8 is 0",
        {"a": {8: 0.0}},
        xlabel="L",
        ylabel="s",
        title="",
    ),
    case(
        plotting.sweep,
        TypeError,
        r"'a' must map size -> value, got \[1, 2\]",
        {"a": [1, 2]},
        xlabel="L",
        ylabel="s",
        title="",
    ),
    case(plotting.split_with_data_parallel, ValueError, r"draws two stages", ("a", "b", "c")),
    case(
        plotting.split_with_data_parallel, ValueError, r"replicas must be 1 to 4, got 8", replicas=8
    ),
    case(
        plotting.roofline,
        ValueError,
        r"peaks and bandwidth must be positive",
        [],
        peaks={"fp32": 1e9},
        bandwidth=0.0,
        overhead=(1, 1e-6),
        regime=str,
        title="",
    ),
    case(
        plotting.roofline,
        ValueError,
        r"points need name, intensity and flop/s",
        [{"name": "add"}],
        peaks={"fp32": 1e9},
        bandwidth=1e9,
        overhead=(1, 1e-6),
        regime=str,
        title="",
    ),
    case(
        plotting.lines,
        ValueError,
        r"give \{label: \(xs, ys, style\)\}",
        {},
        xlabel="",
        ylabel="",
        title="",
    ),
    case(
        plotting.lines,
        ValueError,
        r"'a' must be \(xs, ys, style\) with xs and ys alike",
        {"a": ([1, 2], [1], "o")},
        xlabel="",
        ylabel="",
        title="",
    ),
    # --- devices ---------------------------------------------------------------------------
    case(devices.try_gpu, ValueError, r"try_gpu: i must be an int >= 0, got -1", -1),
    case(devices.try_gpu, ValueError, r"i must be an int >= 0, got '0'", "0"),
    case(
        devices.as_device,
        ValueError,
        r"device must be 'cpu', 'cuda', 'cuda:N', 'mps' or 'xpu'; got 'tpu'",
        "tpu",
    ),
    case(
        devices.as_device,
        ValueError,
        r"device must be 'cpu', 'cuda', 'cuda:N', 'mps' or 'xpu'; got 'gpu0'",
        "gpu0",
    ),
    case(
        devices.as_device,
        TypeError,
        r"device must be a string \('cpu', 'cuda', 'cuda:N', 'mps' or 'xpu'\) "
        r"or a torch.device; got float",
        3.5,
    ),
    case(
        devices.as_device,
        ValueError,
        r"device 'cuda:99' does not exist: this machine has \d+ cuda|no CUDA GPU",
        "cuda:99",
    ),
    case(
        devices.float64_device,
        ValueError,
        r"device must be 'cpu', 'cuda', 'cuda:N', 'mps' or 'xpu'; got 'tpu'",
        "tpu",
    ),
    case(devices.float64_device, TypeError, r"device must be a string .* got int", 0),
    case(
        devices.synchronize,
        ValueError,
        r"device must be 'cpu', 'cuda', 'cuda:N', 'mps' or 'xpu'; got 'tpu'",
        "tpu",
    ),
    case(devices.synchronize, TypeError, r"device must be a string", 5),
    case(devices.synchronize, ValueError, r"'cuda:99' does not exist|no CUDA GPU", "cuda:99"),
    case(
        devices.describe,
        ValueError,
        r"device must be 'cpu', 'cuda', 'cuda:N', 'mps' or 'xpu'; got 'tpu'",
        "tpu",
    ),
    case(devices.capabilities, TypeError, r"device must be a string .* got float", 3.5),
    case(
        devices.device_name,
        ValueError,
        r"device must be 'cpu', 'cuda', 'cuda:N', 'mps' or 'xpu'; got 'tpu'",
        "tpu",
    ),
    case(
        devices.has_peak_memory_counter,
        ValueError,
        r"device must be 'cpu', 'cuda', 'cuda:N', 'mps' or 'xpu'; got 'tpu'",
        "tpu",
    ),
    case(devices.memory_allocated, ValueError, r"has no allocator counter \(the CPU", "cpu"),
    case(devices.reset_peak_memory, ValueError, r"cpu has no peak-memory counter", "cpu"),
    case(devices.max_memory_allocated, ValueError, r"cpu has no peak-memory counter", "cpu"),
    case(
        devices.empty_cache,
        ValueError,
        r"device must be 'cpu', 'cuda', 'cuda:N', 'mps' or 'xpu'; got 'tpu'",
        "tpu",
    ),
    case(
        devices.capabilities,
        ValueError,
        r"device must be 'cpu', 'cuda', 'cuda:N', 'mps' or 'xpu'; got 'gpu0'",
        "gpu0",
    ),
    case(
        devices.capabilities,
        ValueError,
        r"capability must be a \(major, minor\) pair of ints such as \(8, 0\), got 7.5",
        described={"kind": "cuda", "name": "T4", "memory_gib": 16.0, "capability": 7.5},
    ),
    case(
        devices.capabilities,
        ValueError,
        r"capability must be a \(major, minor\) pair .* got \(8, '0'\)",
        described={"kind": "cuda", "name": "A100", "memory_gib": 80.0, "capability": (8, "0")},
    ),
    case(
        devices.capabilities,
        ValueError,
        r"capabilities: kind must be one of 'cpu', 'cuda', 'mps', 'xpu', got 'tpu'",
        described={"kind": "tpu", "name": "TPU v4", "memory_gib": 32.0},
    ),
    case(
        devices.capabilities,
        ValueError,
        r"described must be a dict like describe\(\)'s; it lacks \['memory_gib'\]",
        described={"kind": "cpu", "name": "x"},
    ),
    case(
        devices.capabilities("cpu").ok,
        ValueError,
        r"Capabilities.ok: what must be one of 'gpu', 'bf16'.*, got 'bf61'",
        "bf61",
    ),
    case(
        devices.describe_hardware,
        ValueError,
        r"summary must be hardware_summary\(\)'s dict; it lacks all: a int",
        5,
    ),
    case(devices.describe_hardware, ValueError, r"it lacks \[.*'ram_gib'.*\]", {"cpu": "x"}),
    case(devices.share, ValueError, r"share: processes must be an int >= 1, got 0", 0),
    case(
        devices.free_cores,
        ValueError,
        r"free_cores: window must be a positive finite number, got 0",
        0,
    ),
    *(
        [
            case(
                devices.as_device,
                ValueError,
                r"device 'cuda' asked for, but this machine has no CUDA GPU",
                "cuda",
            ),
            case(devices.device_name, ValueError, r"no CUDA GPU", "cuda:0"),
        ]
        if NO_GPU
        else []
    ),
    # --- data ------------------------------------------------------------------------------
    case(
        data.load,
        ValueError,
        r"unknown data set 'imagenet': valid names are fashion-mnist, cifar10",
        "imagenet",
    ),
    case(data.load, ValueError, r"unknown data set 5: valid names are fashion-mnist, cifar10", 5),
    case(
        data.load,
        ValueError,
        r"source must be one of 'auto', 'real', 'synthetic', got 'web'",
        "cifar10",
        source="web",
    ),
    case(
        data.load,
        TypeError,
        r"train must be True \(training split\) or False \(test split\); got 'yes'",
        "cifar10",
        train="yes",
    ),
    case(
        data.load,
        TypeError,
        r"transform must be callable .* or None; got 5",
        "fashion-mnist",
        transform=5,
    ),
    case(
        data.load,
        TypeError,
        r"root must be a folder path \(str or Path\) or None; got int",
        "fashion-mnist",
        root=7,
    ),
    case(
        data.fashion_mnist,
        ValueError,
        r"source must be one of 'auto', 'real', 'synthetic', got 'x'",
        source="x",
    ),
    case(data.cifar10, TypeError, r"train must be True .* got 1", 1),
    case(data.describe, TypeError, r"ds must be a data set from helpers.data.load\(\), got int", 5),
    case(
        data.as_tensors,
        TypeError,
        r"ds must be a data set from helpers.data.load\(\) .* got list",
        [1, 2],
    ),
    case(
        devices.not_as_expected,
        TypeError,
        r"not_as_expected: sizes must be text \(str\), got int 64",
        sizes=64,
    ),
    case(
        data.cifar_shaped,
        ValueError,
        r"cifar_shaped: source must be one of 'cifar10', 'synthetic.class_images', got 'mnist'",
        "mnist",
        8,
    ),
    case(
        data.cifar_shaped, ValueError, r"cifar_shaped: n must be an int >= 1, got 0", "cifar10", 0
    ),
    case(
        data.damaged_file,
        ValueError,
        r"unknown data set 'mnist': valid names are fashion-mnist, cifar10",
        "mnist",
        ".",
    ),
    case(
        data.damaged_file,
        TypeError,
        r"root must be a folder path \(str or Path\) or None; got int",
        "cifar10",
        5,
    ),
    case(data.online, ValueError, r"url must be an http\(s\) URL string .* got 5", 5),
    case(
        data.online,
        ValueError,
        r"url must be an http\(s\) URL string .* got 'not a url'",
        "not a url",
    ),
    case(
        data.online,
        ValueError,
        r"online: timeout must be a positive finite number of seconds, got 0",
        "https://example.org/",
        timeout=0,
    ),
    # --- synthetic -------------------------------------------------------------------------
    case(synthetic.class_images, ValueError, r"class_images: n " + POSITIVE + r", got 0", 0, 8, 8),
    case(
        synthetic.class_images, ValueError, r"class_images: n " + POSITIVE + r", got -3", -3, 8, 8
    ),
    case(synthetic.class_images, ValueError, r"height " + POSITIVE + r", got 0", 4, 0, 8),
    case(synthetic.class_images, ValueError, r"width " + POSITIVE + r", got -1", 4, 8, -1),
    case(synthetic.class_images, ValueError, r"height " + POSITIVE + r", got '8'", 4, "8", 8),
    case(synthetic.class_images, ValueError, r"channels " + POSITIVE + r", got 0", 4, 8, 8, 0),
    case(
        synthetic.class_images,
        ValueError,
        r"num_classes " + POSITIVE + r", got 0",
        4,
        8,
        8,
        num_classes=0,
    ),
    case(
        synthetic.class_images,
        ValueError,
        r"noise must be a number >= 0 .* got -1",
        4,
        8,
        8,
        noise=-1,
    ),
    case(
        synthetic.class_images,
        ValueError,
        r"label_noise must be in \[0, 1\), got 2",
        4,
        8,
        8,
        label_noise=2,
    ),
    case(
        synthetic.write_fashion_mnist,
        ValueError,
        r"n_train " + POSITIVE + r", got 0",
        "unused",
        n_train=0,
    ),
    case(
        synthetic.write_cifar10,
        ValueError,
        r"n_test " + POSITIVE + r", got -5",
        "unused",
        n_test=-5,
    ),
    case(
        synthetic.write_cifar10,
        ValueError,
        r"n_train must be an int >= 5, got 3",
        "unused",
        n_train=3,
    ),
    case(
        synthetic.write_image_folder,
        ValueError,
        r"write_image_folder: fmt must be one of 'png', 'jpeg', got 'gif'",
        "unused",
        UINT8_1,
        np.array([0]),
        ["a"],
        fmt="gif",
    ),
    case(
        synthetic.write_image_folder,
        ValueError,
        r"labels must be in 0..0 .* got 3..3",
        "unused",
        UINT8_1,
        np.array([3]),
        ["a"],
    ),
    case(
        synthetic.write_image_folder,
        ValueError,
        r"labels must hold one label per image \(2\)",
        "unused",
        np.zeros((2, 4, 4, 1), np.uint8),
        np.array([0]),
        ["a"],
    ),
    case(
        synthetic.write_image_folder,
        ValueError,
        r"images must be uint8 of shape \(N, H, W, 1 or 3\), got float32",
        "unused",
        UINT8_1.astype(np.float32),
        np.array([0]),
        ["a"],
    ),
    case(
        synthetic.write_image_folder,
        ValueError,
        r"classes must be a non-empty list of names",
        "unused",
        UINT8_1,
        np.array([0]),
        [],
    ),
    case(
        synthetic.write_image_folder,
        ValueError,
        r"quality must be an int in 1..95, got 0",
        "unused",
        UINT8_1,
        np.array([0]),
        ["a"],
        fmt="jpeg",
        quality=0,
    ),
    # --- profiles --------------------------------------------------------------------------
    case(
        profiles.active,
        ValueError,
        r"profile \(or \$FTG_PROFILE\) must be one of 'smoke', 'gpu', 'full', 'auto', got 'fast'",
        "fast",
    ),
    case(
        profiles.active,
        TypeError,
        r"profile must be a string, one of smoke, gpu, full, auto; got 5",
        5,
    ),
    case(
        profiles.choose,
        ValueError,
        r"profile \(or \$FTG_PROFILE\) must be one of .* got 'fast'",
        "fast",
    ),
    case(
        profiles.active,
        ValueError,
        r"profile \(or \$FTG_PROFILE\) must be one of 'smoke', 'gpu', 'full', 'auto', got 'tiny'",
        "tiny",
    ),
    case(
        profiles.Profile, ValueError, r"name must be one of smoke, gpu, full .* got 'fast'", "fast"
    ),
    case(
        profiles.Profile, ValueError, r"name must be one of smoke, gpu, full .* got 'auto'", "auto"
    ),
    # --- results ---------------------------------------------------------------------------
    case(
        results.Recorder,
        ValueError,
        r"notebook must be a non-empty file name like '02_data_loading'",
        "",
    ),
    case(results.Recorder, ValueError, r"notebook must be a non-empty file name .* got 5", 5),
    case(results.Recorder, ValueError, r"no folders\); got '../escape'", "../escape"),
    case(
        results.Recorder,
        TypeError,
        r"profile must be a Profile, a profile name such as 'smoke' or 'gpu' or 'full', or None; "
        r"got 5",
        "x",
        profile=5,
    ),
    case(
        results.Recorder,
        TypeError,
        r"profile must be a Profile, a profile name .* got ''",
        "x",
        profile="",
    ),
    case(
        recorder("judge"),
        ValueError,
        r"unknown claim 'L99'; valid ids are L1 ... L23",
        "L99",
        figure="1x",
    ),
    case(recorder("judge"), ValueError, r"unknown claim 3", 3, figure="1x"),
    case(
        recorder("judge"),
        TypeError,
        r"judge\('L10'\): the rule compares time of .*unexpected keyword",
        "L10",
        figure="1x",
        speed=2,
    ),
    case(
        recorder("judge"),
        ValueError,
        r"figure must be the measured figure behind it",
        "L5",
        figure="",
        gain=2.0,
    ),
    case(recorder("measure"), ValueError, r"value for 'a' is NaN", "a", float("nan"), "s"),
    case(
        recorder("measure"),
        TypeError,
        r"value for 'a' must be a number, got 'fast'",
        "a",
        "fast",
        "s",
    ),
    case(
        recorder("measure"),
        ValueError,
        r"unit must be a string such as 's' or 'samples/s', got 5",
        "a",
        1,
        5,
    ),
    case(recorder("measure"), ValueError, r"name must be a non-empty string", "", 1, "s"),
    case(
        recorder("measure"),
        TypeError,
        r"ratio for 'a' must be a number or None, got 'x'",
        "a",
        1,
        "s",
        ratio="x",
    ),
    case(
        recorder("data_source"),
        ValueError,
        r"dataset must be a non-empty name like 'cifar10'",
        "",
        synthetic=True,
    ),
    case(recorder("figure"), TypeError, r"fig must be a matplotlib Figure, got int", 5, "curve"),
    case(
        recorder("figure"), ValueError, r"name must be a short file name .* got ''", plt.figure, ""
    ),
    case(
        recorder("figure"),
        ValueError,
        r"name must be a short file name .* got 'a/b'",
        plt.figure,
        "a/b",
    ),
    # --- report ----------------------------------------------------------------------------
    case(
        report.build,
        TypeError,
        r"results must be a list of result dicts, as results.load_all\(\) returns",
        5,
    ),
    case(report.build, TypeError, r"results must be a list of result dicts", [{"no": "notebook"}]),
    case(
        report.render,
        ValueError,
        r"report.render: fmt must be one of 'md', 'html', got 'pdf'",
        {},
        fmt="pdf",
    ),
    case(
        report.render_notebooks,
        FileNotFoundError,
        r"notebooks_dir .*nope is not a folder of executed notebooks",
        "/nonexistent/nope",
    ),
    case(
        report.write,
        FileNotFoundError,
        r"build_dir .*does-not-exist does not exist; run the notebooks first",
        "/nonexistent/does-not-exist",
    ),
    # --- diagnose: data wait ---------------------------------------------------------------------
    case(
        diagnose.DataWaitMeter,
        ValueError,
        r"sync_every must be an int >= 1, got 0",
        [],
        sync_every=0,
    ),
    case(
        diagnose.DataWaitMeter,
        ValueError,
        r"sync_every must be an int >= 1, got -2",
        [],
        sync_every=-2,
    ),
    case(
        diagnose.DataWaitMeter, TypeError, r"iterable must be iterable \(a DataLoader.*got int", 5
    ),
    case(
        diagnose.DataWaitMeter,
        ValueError,
        r"device must be 'cpu', 'cuda', 'cuda:N', 'mps' or 'xpu'; got 'tpu'",
        [1],
        device="tpu",
    ),
    case(
        diagnose.wait_verdict,
        ValueError,
        r"wait_verdict: wait_fraction must be a fraction in \[0, 1\], got 1.5",
        1.5,
    ),
    case(
        diagnose.bottleneck,
        ValueError,
        r"bottleneck: busy must be a share in \[0, 1\] or None, got 1.5",
        busy=1.5,
    ),
    case(
        diagnose.bottleneck,
        ValueError,
        r"bottleneck: data_wait must be a share in \[0, 1\] or None, got -0.1",
        data_wait=-0.1,
    ),
    case(
        diagnose.bottleneck,
        ValueError,
        r"bottleneck: rate must be a finite number >= 0 or None, got nan",
        rate=float("nan"),
    ),
    case(
        diagnose.busy_fraction,
        ValueError,
        r"busy_fraction: wall_s must be a positive finite number, got 0",
        0.1,
        0,
    ),
    # --- suite -----------------------------------------------------------------------------
    case(
        runner.main,
        ValueError,
        r"profile \(or \$FTG_PROFILE\) must be one of 'smoke', 'gpu', 'full', 'auto', got 'fast'",
        ["--profile", "fast"],
    ),
    case(
        runner.headless_client,
        TypeError,
        r"headless_client: nb must be a notebook \(nbformat.read\(...\)\), got str",
        "notebook.ipynb",
    ),
    case(
        runner.choose_profile,
        ValueError,
        r"profile \(or \$FTG_PROFILE\) must be one of 'smoke', 'gpu', 'full', 'auto', got 'fast'",
        "fast",
    ),
    case(
        runner.notebook_paths, ValueError, r"pattern must be a glob of notebook names .* got ''", ""
    ),
    case(
        runner.execute,
        ValueError,
        r"execute: timeout \(seconds per cell\) must be an int >= 1, got 0",
        Path("x.ipynb"),
        Path("out"),
        0,
    ),
    case(
        runner.execute,
        FileNotFoundError,
        r"nb_path .*missing.ipynb is not a notebook file",
        Path("/nonexistent/missing.ipynb"),
        Path("out"),
        10,
    ),
    case(
        runner.save_reference,
        FileNotFoundError,
        r"save_reference: no result files in /nonexistent/results; run the notebooks first",
        Path("/nonexistent/results"),
    ),
    # --- catalog ---------------------------------------------------------------------------
    case(
        catalog.load,
        FileNotFoundError,
        r"catalog: path .*nothere.toml is not a file",
        "/nonexistent/nothere.toml",
    ),
    case(
        catalog.runtime_table,
        TypeError,
        r"entries must be the list of dicts catalog.load\(\) returns",
        5,
    ),
    case(
        catalog.runtime_table,
        TypeError,
        r"entries must be the list of dicts",
        [{"title": "no file"}],
    ),
    case(catalog.render_readme, ValueError, r"the README must hold the markers", "text", []),
    case(catalog.number, ValueError, r"number: file must name a notebook", "notes.md"),
    case(catalog.number, ValueError, r"number: file must name a notebook", None),
    case(
        catalog.claim_notebooks,
        TypeError,
        r"claim_notebooks: entries must be the list of dicts catalog.load\(\) returns",
        5,
    ),
    case(
        catalog.claim_notebooks,
        ValueError,
        r"'01_x.ipynb' lists unknown claim\(s\) \['L0'\]",
        [{"file": "01_x.ipynb", "claims": ["L0"]}],
    ),
    # --- pipelines (notebooks 03-06) --------------------------------------------------------
    case(
        pipelines.prepare_image_folder,
        ValueError,
        r"prepare_image_folder: fmt must be one of 'png', 'jpeg', got 'gif'",
        8,
        fmt="gif",
    ),
    case(pipelines.prepare_image_folder, ValueError, r"n must be an int >= 1, got 0", 0),
    case(
        pipelines.image_folder,
        FileNotFoundError,
        r"root: the image folder '/nonexistent/q' does not exist",
        "/nonexistent/q",
    ),
    case(
        pipelines.PerSampleTensorDataset,
        ValueError,
        r"x must be a uint8 tensor of shape \(N, C, H, W\)",
        X4.float(),
        Y4,
    ),
    case(
        pipelines.PerSampleTensorDataset,
        ValueError,
        r"x and y must have the same length, got 4 and 2",
        X4,
        Y4[:2],
    ),
    case(entered(devices.cpu_threads), ValueError, r"cpu_threads: n must be an int >= 1, got 0", 0),
    case(
        entered(devices.fp32_precision),
        ValueError,
        r"fp32_precision: precision must be one of 'ieee', 'tf32', got 'highest'",
        "highest",
    ),
    case(pipelines.cifar_train_transform, ValueError, r"crop must be an int >= 1, got 0", crop=0),
    case(pipelines.tensor_train_transform, ValueError, r"crop must be an int >= 1, got 0", crop=0),
    case(pipelines.tensor_train_transform, ValueError, r"pad must be an int >= 0, got -1", pad=-1),
    # --- data.TensorBatches, pipelines' worker memory, models.small_cnn ----------------------
    case(
        data.TensorBatches,
        ValueError,
        r"TensorBatches: batch_size must be an int >= 1, got 0",
        X4,
        Y4,
        0,
        device="cpu",
    ),
    case(
        data.TensorBatches,
        ValueError,
        r"TensorBatches: x must be a uint8 tensor of shape \(N, C, H, W\)",
        X4.float(),
        Y4,
        2,
    ),
    case(
        data.TensorBatches,
        ValueError,
        r"TensorBatches: y must be a tensor with one label per image \(4\)",
        X4,
        Y4[:1],
        2,
    ),
    case(
        data.TensorBatches,
        ValueError,
        r"TensorBatches: mode must be one of 'device', 'memory', got 'disk'",
        X4,
        Y4,
        2,
        mode="disk",
        device="cpu",
    ),
    case(
        data.TensorBatches,
        ValueError,
        r"TensorBatches: device must be .*got 'tpu'",
        X4,
        Y4,
        2,
        device="tpu",
    ),
    case(
        pipelines.WorkerMemorySampler,
        ValueError,
        r"WorkerMemorySampler: interval must be a positive finite number of seconds, got 0",
        interval=0,
    ),
    case(models.small_cnn, ValueError, r"small_cnn: width must be an int >= 1, got 0", width=0),
    # --- training, memory, launch (notebooks 07-19) --------------------------------------------
    case(
        training.train,
        ValueError,
        r"train: lr_schedule must be one of 'constant', 'linear-decay', 'one-cycle', got 'cosine'",
        torch.nn.Linear(2, 2),
        [],
        lr_schedule="cosine",
        device="cpu",
    ),
    case(
        training.evaluate,
        ValueError,
        r"evaluate: data_iter gave no batches",
        torch.nn.Linear(2, 2),
        [],
        device="cpu",
    ),
    case(
        training.calibration_step,
        ValueError,
        r"calibration_step: num_classes must be an int >= 2, got 1",
        torch.nn.Linear(2, 2),
        (4, 2),
        1,
        "cpu",
    ),
    case(
        training.peak_step_bytes,
        ValueError,
        r"device must be 'cpu', 'cuda', 'cuda:N', 'mps' or 'xpu'; got 'tpu'",
        noop,
        "tpu",
    ),
    case(
        launch.run,
        FileNotFoundError,
        r"run: script '/nonexistent/train.py' is not a file",
        "/nonexistent/train.py",
    ),
    case(launch.run, ValueError, r"run: nprocs must be an int >= 1, got 0", __file__, nprocs=0),
    case(
        launch.run,
        ValueError,
        r"run: timeout must be a positive finite number of seconds, got 0",
        __file__,
        timeout=0,
    ),
    # --- non-finite numbers, devices that are not there, process lifetimes ------------------
    case(
        training.train,
        ValueError,
        r"train: lr must be a positive finite number, got nan",
        torch.nn.Linear(2, 2),
        [],
        lr=float("nan"),
        device="cpu",
    ),
    case(
        training.train,
        ValueError,
        r"train: lr must be a positive finite number, got inf",
        torch.nn.Linear(2, 2),
        [],
        lr=float("inf"),
        device="cpu",
    ),
    case(
        training.train,
        ValueError,
        r"train: steps_per_epoch must be an int >= 1 or None, got 0",
        torch.nn.Linear(2, 2),
        [],
        steps_per_epoch=0,
        device="cpu",
    ),
    case(
        training.train,
        ValueError,
        r"train: train_iter gave no batches",
        torch.nn.Linear(2, 2),
        [],
        steps_per_epoch=1,
        device="cpu",
        progress=False,
    ),
    case(
        recorder("measure"),
        ValueError,
        r"value for 'a' is infinite \(inf\)",
        "a",
        float("inf"),
        "s",
    ),
    case(
        recorder("measure"),
        ValueError,
        r"value for 'a' is infinite \(-inf\)",
        "a",
        float("-inf"),
        "s",
    ),
    case(
        recorder("measure"),
        ValueError,
        r"ratio for 'a' must be finite, got inf",
        "a",
        1,
        "s",
        ratio=float("inf"),
    ),
    case(
        recorder("measure"),
        ValueError,
        r"seconds for 'a' must be finite, got nan",
        "a",
        1,
        "s",
        seconds=float("nan"),
    ),
    case(
        synthetic.cifar10_checksums,
        ValueError,
        r"n_train and n_test must be at most 50000 and 10000",
        60000,
        10,
    ),
    *(
        [
            case(
                training.evaluate,
                ValueError,
                r"device 'cuda' asked for, but this machine has no CUDA GPU",
                models.small_cnn(),
                [(X4, Y4)],
                device="cuda",
            )
        ]
        if NO_GPU
        else []
    ),
    case(
        diagnose.StepWindow, ValueError, r"StepWindow: warmup must be an int >= 1, got 0", warmup=0
    ),
    case(
        diagnose.profiler_activities,
        ValueError,
        r"profiler_activities: device must be a device such as 'cpu' or 'cuda', got 'gpu'",
        "gpu",
    ),
    case(
        diagnose.covered_us,
        ValueError,
        r"covered_us: spans must end after they start, got \(5, 2\)",
        [(0, 1), (5, 2)],
    ),
    case(
        diagnose.busy_seconds,
        ValueError,
        r"busy_seconds: device_type must be one of .*got 'gpu'",
        None,
        "gpu",
    ),
    case(
        diagnose.StepWindow,
        ValueError,
        r"StepWindow: steps must be an int >= 1, got 2.5",
        steps=2.5,
    ),
    case(
        capstone.measure,
        ValueError,
        r"measure: epochs must be an int >= 3, got 2",
        capstone.Recipe("c", data="device", compile={}),
        noop,
        n_train=8,
        device="cpu",
        epochs=2,
    ),
    case(
        capstone.measure,
        ValueError,
        r"measure: busy_steps must be an int >= 0, got -1",
        capstone.Recipe("r"),
        noop,
        n_train=8,
        device="cpu",
        busy_steps=-1,
    ),
    case(
        capstone.Recipe,
        ValueError,
        r"Recipe: precision must be one of 'fp32', 'bf16', 'fp16', got 'fp8'",
        "r",
        precision="fp8",
    ),
    # --- later notebooks' modules: one line per case, e.g.
    # case(training.fit, ValueError, r"epochs must be an int >= 1", net, loader, epochs=0),
]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("c", CASES, ids=[c.id for c in CASES])
def test_bad_input_gives_a_clear_error(c: Case, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # relative paths in a case land in the test's folder
    args = tuple(a() if a is plt.figure else a for a in c.args)  # a fresh figure per case
    try:
        with pytest.raises(c.exc, match=c.match):
            c.fn(*args, **c.kwargs)
    finally:
        plt.close("all")


# Functions with no argument that can be wrong, or whose inputs are checked elsewhere.
NO_BAD_INPUT = {
    "devices.cpu",
    "devices.num_gpus",
    "devices.accelerator",
    "devices.try_all_gpus",
    "devices.hardware_summary",
    "devices.usable_cores",
    "results.load_all",
    "report.measurements_frame",
    "timing.Measurement",
    "models.F",
    "models.nn",
    "plotting.plt",
    "data.Dataset",
    "data.urlparse",
    "catalog.main",
    "data.to_unit_float",
    "data.CifarShaped",  # what data.cifar_shaped returns, its inputs checked there
    "runner.HeadlessOutputWidget",  # made by nbclient, from the kernel's own messages
    "diagnose.Threshold",  # records the module builds: bottleneck's lines and its answer
    "diagnose.Verdict",
    "diagnose.loader_wait_seconds",  # reads a profile StepWindow or the doctor recorded
}  # a batch function: TensorBatches checks the batches


def test_the_sweep_covers_every_public_helper():
    """A new public function in these modules needs a line in CASES (or a reason below)."""
    mods = (
        models,
        timing,
        plotting,
        devices,
        data,
        synthetic,
        profiles,
        results,
        report,
        diagnose,
        runner,
        catalog,
    )
    covered = {
        f"{c.fn.__module__.split('.')[-1]}.{c.fn.__qualname__.split('.')[0]}"
        for c in CASES
        if hasattr(c.fn, "__module__")
    }
    covered |= {  # wrapped above
        "results.Recorder",
        "timing.Measurement",
        "devices.cpu_threads",
        "devices.fp32_precision",
    }
    missing = []
    for m in mods:
        short = m.__name__.split(".")[-1]
        for name, obj in vars(m).items():
            if (
                name.startswith("_")
                or not callable(obj)
                or getattr(obj, "__module__", None) != m.__name__
            ):
                continue
            key = f"{short}.{name}"
            if key not in covered and key not in NO_BAD_INPUT:
                missing.append(key)
    assert not missing, f"public helpers without a failure-sweep case: {missing}"


# --- 2. broken data set folders ---------------------------------------------------------------


def _fashion(root: Path) -> Path:
    synthetic.write_fashion_mnist(root, n_train=64, n_test=32)
    return root / "FashionMNIST" / "raw"


def _cifar(root: Path) -> Path:
    synthetic.write_cifar10(root, n_train=50, n_test=20)
    return root / "cifar-10-batches-py"


def _truncate(path: Path, keep: int | None = None) -> None:
    raw = path.read_bytes()
    path.write_bytes(raw[: len(raw) // 2 if keep is None else keep])


def _no_real_files(root: Path, name: str) -> None:
    root.mkdir(parents=True, exist_ok=True)


def _real_fashion_truncated(root: Path, name: str) -> None:
    raw = _fashion(root / "tmp")  # the synthetic writer makes real-format files; drop the marker
    (root / "FashionMNIST").mkdir(parents=True)
    raw.rename(root / "FashionMNIST" / "raw")
    _truncate(root / "FashionMNIST" / "raw" / "train-images-idx3-ubyte")


def _real_fashion_labels_missing(root: Path, name: str) -> None:
    raw = _fashion(root / "tmp")
    (root / "FashionMNIST").mkdir(parents=True)
    raw.rename(root / "FashionMNIST" / "raw")
    (root / "FashionMNIST" / "raw" / "train-labels-idx1-ubyte").unlink()


def _syn(name: str, damage) -> Any:
    def make(root: Path, _: str) -> None:
        folder = (_fashion if name == "fashion-mnist" else _cifar)(root / "synthetic")
        damage(folder)

    return make


BROKEN = [
    # (id, data set, source, how to break root, message naming the file)
    (
        "missing folder",
        "fashion-mnist",
        "real",
        lambda r, n: None,
        r"FashionMNIST/raw/train-images-idx3-ubyte is missing .*unreachable",
    ),
    (
        "missing folder",
        "cifar10",
        "real",
        lambda r, n: None,
        r"cifar-10-batches-py/data_batch_1 is missing .*unreachable",
    ),
    (
        "empty folder",
        "fashion-mnist",
        "real",
        _no_real_files,
        r"FashionMNIST/raw/train-images-idx3-ubyte is missing",
    ),
    (
        "empty folder",
        "cifar10",
        "real",
        _no_real_files,
        r"cifar-10-batches-py/data_batch_1 is missing",
    ),
    (
        "real images truncated",
        "fashion-mnist",
        "real",
        _real_fashion_truncated,
        r"train-images-idx3-ubyte is truncated: \d+ bytes, its header promises \d+",
    ),
    (
        "real labels missing",
        "fashion-mnist",
        "auto",
        _real_fashion_labels_missing,
        r"train-labels-idx1-ubyte is missing",
    ),
    (
        "images truncated",
        "fashion-mnist",
        "auto",
        _syn("fashion-mnist", lambda f: _truncate(f / "train-images-idx3-ubyte")),
        r"synthetic/FashionMNIST/raw/train-images-idx3-ubyte is truncated: "
        r"\d+ bytes, its header promises \d+",
    ),
    (
        "images cut inside the header",
        "fashion-mnist",
        "auto",
        _syn("fashion-mnist", lambda f: _truncate(f / "train-images-idx3-ubyte", keep=6)),
        r"train-images-idx3-ubyte is (truncated inside its header|not an IDX file)",
    ),
    (
        "images file empty",
        "fashion-mnist",
        "auto",
        _syn("fashion-mnist", lambda f: _truncate(f / "train-images-idx3-ubyte", keep=0)),
        r"train-images-idx3-ubyte is empty \(0 bytes\)",
    ),
    (
        "labels truncated",
        "fashion-mnist",
        "synthetic",
        _syn("fashion-mnist", lambda f: _truncate(f / "train-labels-idx1-ubyte")),
        r"train-labels-idx1-ubyte is truncated",
    ),
    (
        "images not IDX",
        "fashion-mnist",
        "auto",
        _syn(
            "fashion-mnist",
            lambda f: (f / "train-images-idx3-ubyte").write_bytes(b"<html>404</html>" * 10),
        ),
        r"train-images-idx3-ubyte is not an IDX file",
    ),
    (
        "files deleted, marker left",
        "fashion-mnist",
        "auto",
        _syn("fashion-mnist", lambda f: [p.unlink() for p in f.glob("*-ubyte")]),
        r"train-images-idx3-ubyte is missing",
    ),
    (
        "batch truncated",
        "cifar10",
        "auto",
        _syn("cifar10", lambda f: _truncate(f / "data_batch_3")),
        r"cifar-10-batches-py/data_batch_3 is truncated or corrupt",
    ),
    (
        "batch empty",
        "cifar10",
        "auto",
        _syn("cifar10", lambda f: _truncate(f / "data_batch_1", keep=0)),
        r"data_batch_1 is empty \(0 bytes\)",
    ),
    (
        "meta missing",
        "cifar10",
        "synthetic",
        _syn("cifar10", lambda f: (f / "batches.meta").unlink()),
        r"batches.meta is missing",
    ),
    (
        "manifest corrupt",
        "cifar10",
        "auto",
        _syn("cifar10", lambda f: (f / synthetic.MARKER).write_text('{"synthetic": true, "md5"')),
        r"SYNTHETIC.json is missing or not the manifest",
    ),
]


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "what, name, source, damage, match", BROKEN, ids=[f"{b[1]}: {b[0]}" for b in BROKEN]
)
def test_broken_data_folder_names_the_file(what, name, source, damage, match, data_root):
    damage(data_root, name)
    t0 = time.perf_counter()
    with pytest.raises(RuntimeError, match=match):
        data.load(name, train=True, source=source)
    assert time.perf_counter() - t0 < 30, "the error took too long (a hang?)"


def _png_folder(root: Path) -> list[Path]:
    x, y = synthetic.class_images(8, 16, 16, 3)
    synthetic.write_image_folder(root, x, y, synthetic.CIFAR_CLASSES)
    return sorted(root.rglob("*.png"))


@pytest.mark.slow
@pytest.mark.timeout(60)
@pytest.mark.parametrize("damage", ["truncated", "empty", "not an image"])
@pytest.mark.parametrize("num_workers", [0, 2])
def test_broken_image_file_is_named(damage, num_workers, tmp_path):
    files = _png_folder(tmp_path / "imgs")
    bad = files[3]
    if damage == "truncated":
        _truncate(bad)
    elif damage == "empty":
        _truncate(bad, keep=0)
    else:
        bad.write_text("<html>not found</html>")
    ds = pipelines.image_folder(tmp_path / "imgs", transform=transforms.ToTensor())
    loader = DataLoader(ds, batch_size=2, num_workers=num_workers)
    t0 = time.perf_counter()
    with pytest.raises(
        RuntimeError, match=rf"image file {bad} cannot be decoded .*truncated or not an image"
    ):
        for _ in loader:
            pass
    assert time.perf_counter() - t0 < 30, "the error took too long (a hang?)"


@pytest.mark.slow
def test_intact_synthetic_folder_still_loads(data_root):
    """The diagnosis is only an error path: whole files load as before."""
    _fashion(data_root / "synthetic")
    assert len(data.fashion_mnist(train=True)) == 64
    assert data.damaged_file("fashion-mnist", data_root / "synthetic", synthetic_copy=True) is None


# --- 3. interrupted runs leave no worker processes ---------------------------------------------


def _workers_gone(pids: set[int], timeout: float = 15.0) -> list[int]:
    """The pids still alive (zombies count as gone) after waiting up to `timeout`."""
    deadline = time.monotonic() + timeout
    alive = list(pids)
    while alive and time.monotonic() < deadline:
        alive = [
            p
            for p in alive
            if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE
        ]
        time.sleep(0.1)
    return alive


def _loader(data_root: Path) -> DataLoader:
    _fashion(data_root / "synthetic")
    ds = data.fashion_mnist(train=True, transform=transforms.ToTensor())
    return DataLoader(ds, batch_size=4, num_workers=2)


def _train_until_interrupted(batches, stop_at: int, seen: set[int]) -> None:
    """A training loop that gets a Ctrl-C (KeyboardInterrupt) mid-epoch; adds the workers to
    `seen`."""
    me = psutil.Process()
    for step, (X, _) in enumerate(batches):
        torch.nn.functional.relu(X).sum()  # the 'step'
        seen |= {c.pid for c in me.children(recursive=True)}
        if step == stop_at:
            raise KeyboardInterrupt


@pytest.mark.timeout(90)
@pytest.mark.parametrize("wrap", ["DataLoader", "DataWaitMeter(DataLoader)"])
def test_keyboard_interrupt_mid_epoch_leaves_no_workers(wrap, data_root):
    before = {c.pid for c in psutil.Process().children(recursive=True)}
    loader = _loader(data_root)
    batches = loader if wrap == "DataLoader" else diagnose.DataWaitMeter(loader)
    seen: set[int] = set()
    with pytest.raises(KeyboardInterrupt):
        _train_until_interrupted(batches, stop_at=3, seen=seen)
    workers = seen - before
    assert len(workers) >= 2, (
        f"expected 2 DataLoader workers while iterating, saw {sorted(workers)}"
    )
    left = _workers_gone(workers)
    assert not left, f"DataLoader workers still running after the interrupt: {left}"


CTRL_C_SCRIPT = textwrap.dedent("""
    import psutil
    from torch.utils.data import DataLoader
    from torchvision import transforms
    from helpers import data, models, training
    # persistent workers: the same two processes serve every epoch, so the pids reported
    # below are the ones that must be gone after the interrupt
    loader = DataLoader(data.fashion_mnist(transform=transforms.ToTensor()), batch_size=8,
                        num_workers=2, shuffle=True, persistent_workers=True)

    def batches():  # endless: the run lasts until interrupted, however fast the machine
        step = 0
        while True:
            for batch in loader:
                step += 1
                if step == 3:  # training has demonstrably started: say which workers it has
                    kids = psutil.Process().children(recursive=True)
                    print(" ".join(str(c.pid) for c in kids), flush=True)
                yield batch

    training.train(models.small_cnn(in_channels=1, width=4), batches(), steps_per_epoch=10**6,
                   device="cpu", progress=False)
    print("training ended without an interrupt", flush=True)
""")


@pytest.mark.timeout(180)
@pytest.mark.parametrize(
    "target", ["process group (terminal Ctrl-C, Jupyter interrupt)", "main process only"]
)
@pytest.mark.slow
def test_ctrl_c_ends_a_training_run_and_its_workers(target, data_root):
    """SIGINT mid-epoch to a training run over a 2-worker DataLoader: the run ends with
    KeyboardInterrupt within a bounded time and no worker process outlives it."""
    synthetic.write_fashion_mnist(data_root / "synthetic", n_train=256, n_test=32)
    env = {**os.environ, "PYTHONPATH": str(paths.ROOT)}
    proc = subprocess.Popen(
        [sys.executable, "-c", CTRL_C_SCRIPT],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,
        preexec_fn=interruptible,
    )
    try:
        line = proc.stdout.readline()
        workers = {int(p) for p in line.split()}
        assert len(workers) >= 2, (
            f"the run did not report its workers: {line!r} {proc.stderr.read()[-2000:]}"
        )
        time.sleep(0.5)  # the run goes on (endless batches) until the signal lands
        if target.startswith("process group"):
            os.killpg(proc.pid, signal.SIGINT)
        else:
            os.kill(proc.pid, signal.SIGINT)
        try:
            _, err = proc.communicate(timeout=60)  # a hang guard, generous for a loaded machine
        except subprocess.TimeoutExpired:
            pytest.fail("the run did not end within 60 s of Ctrl-C")
        assert proc.returncode != 0 and "KeyboardInterrupt" in err, err[-2000:]
        left = _workers_gone(workers)
        assert not left, f"DataLoader workers still running after Ctrl-C: {left}"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


# --- 4. results files that cannot be read, names that break tables, the run's profile ---------


def _damage_results(path: Path, how: str) -> None:
    if how == "truncated":
        path.write_text(path.read_text()[:40])
    elif how == "empty":
        path.write_bytes(b"")
    elif how == "not UTF-8":
        path.write_bytes(b'{"notebook": "02_y", "x": "\xff\xfe"}')
    else:  # valid JSON, but not a results file
        path.write_text("[1, 2, 3]")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("how", ["truncated", "empty", "not UTF-8", "not a results file"])
def test_unreadable_results_file_is_warned_about_not_dropped(how, tmp_path):
    res = tmp_path / "results"
    results.Recorder("01_x", directory=res).measure("kept", 1.0, "s")
    bad = results.Recorder("03_y", directory=res)
    bad.judge("L1", figure="2x", gain=2.0, past_vs_within=2.0)
    _damage_results(bad.path, how)
    with pytest.warns(UserWarning, match=r"03_y.json"):
        report.write(tmp_path)
    md = (tmp_path / "report.md").read_text()
    assert "## Warning: results files that could not be read" in md
    warning = next(line for line in md.splitlines() if "03_y.json" in line)
    assert {
        "truncated": "truncated or not JSON",
        "empty": "is empty",
        "not UTF-8": "not UTF-8",
        "not a results file": "not a results file",
    }[how] in warning
    assert "## 01_x" in md  # the readable file is still reported
    lines = md.splitlines()
    start = lines.index(next(line for line in lines if line.startswith("- **L1**")))
    l1 = "\n".join(
        lines[
            start + 1 : next(i for i in range(start + 1, len(lines)) if lines[i].startswith("- **"))
        ]
    )
    assert "notebook 03: *results file unreadable*" in l1 and "not run" not in l1, l1
    assert "Warning" in (tmp_path / "report.html").read_text()


def test_a_pipe_in_a_measurement_name_keeps_the_table_whole(tmp_path):
    res = tmp_path / "results"
    results.Recorder("01_x", directory=res).measure("batch | 64", 2.0, "s|step", note="a|b")
    report.write(tmp_path)
    md = (tmp_path / "report.md").read_text()
    # Markdown tables are fixed-width text blocks (pandas), so a `|` cannot split a cell there
    block = md.split("```")[1].splitlines()
    row = block[2]
    assert row.split() == ["batch", "|", "64", "2", "s|step", "a|b"], row
    assert "<td>batch | 64</td>" in (tmp_path / "report.html").read_text()


def test_infinite_figures_never_reach_the_results_file(tmp_path):
    record = results.Recorder("01_x", directory=tmp_path)
    with pytest.raises(ValueError):
        record.measure("t", float("inf"), "s")
    import json

    json.loads(
        record.path.read_text(), parse_constant=lambda c: pytest.fail(f"non-standard JSON: {c}")
    )


@pytest.mark.timeout(60)
def test_the_run_honours_ftg_profile_and_says_why(monkeypatch):
    monkeypatch.setenv("FTG_PROFILE", "smoke")
    assert runner.choose_profile(None) == ("smoke", "from the environment (FTG_PROFILE)")
    assert runner.choose_profile("full")[0] == "full"
    monkeypatch.delenv("FTG_PROFILE")
    name, why = runner.choose_profile(None)
    assert name == ("smoke" if NO_GPU else "gpu") and why.startswith("the default, auto: ")


@pytest.mark.timeout(60)
@pytest.mark.skipif(not NO_GPU, reason="this machine has a GPU: a full run needs no confirmation")
def test_a_full_run_without_a_gpu_asks_first(capsys, monkeypatch):
    import io

    monkeypatch.setattr(sys, "stdin", io.StringIO(""))  # not a terminal: no one to ask
    assert runner.main(["--profile", "full", "--notebooks", "00_*"]) == 2
    err = capsys.readouterr()
    assert "Profile: full (asked for with --profile" in err.out
    assert "this takes hours" in err.err and "--yes (make run PROFILE=full CONFIRM=1)" in err.err
    assert not (paths.build_dir() / "runs").exists(), "the run started anyway"

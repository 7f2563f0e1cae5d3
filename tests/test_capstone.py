"""Notebook 19's plumbing: data, model, recipes, the timing of a bar and the waterfall's rules.
The training code itself is in the notebook's cells (run by nbval and by `make bench`)."""

import pytest
import torch

from helpers import capstone


@pytest.fixture(scope="module")
def tiny():
    return capstone.load_data(96, 64)


def test_load_data_gives_the_same_images_twice(tiny):
    assert tiny.x_train.shape == (96, 1, 28, 28) and tiny.x_train.dtype == torch.uint8
    assert len(tiny.train_ds) == 96 and len(tiny.y_test) == 64
    X, y = tiny.train_ds[5]
    assert torch.equal(X, tiny.x_train[5].float() / 255) and int(y) == int(tiny.y_train[5])
    assert "96 train / 64 test" in tiny.description


def test_run_cost_arithmetic():
    c = capstone.run_cost(1000.0, price_per_hour=2.0, epochs=6, dataset_size=60000)
    assert c["seconds_per_epoch"] == pytest.approx(60.0)
    assert c["hours"] == pytest.approx(0.1)
    assert c["cost"] == pytest.approx(0.2)
    assert capstone.run_cost(1000.0, price_per_hour=2.0, n_devices=4)["cost"] == pytest.approx(
        4 * capstone.run_cost(1000.0, price_per_hour=2.0)["cost"]
    )


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(samples_per_s=0, price_per_hour=1.0), "samples_per_s"),
        (dict(samples_per_s=10, price_per_hour=-1.0), "price_per_hour"),
        (dict(samples_per_s=10, price_per_hour=1.0, epochs=0), "epochs"),
    ],
)
def test_run_cost_bad_input(kwargs, match):
    with pytest.raises(ValueError, match=match):
        capstone.run_cost(**kwargs)


def test_fast_recipe_is_the_book_loop_when_nothing_wins():
    ref = capstone.Recipe("reference")
    wf = [
        (ref, capstone.StepResult("ref", 1.0, 2.0), True),
        (ref.but("uint8 in memory", data="memory"), capstone.StepResult("x", 2.0, 1.0), False),
    ]
    fast = capstone.fast_recipe(wf)
    assert (fast.name, fast.data, fast.init, fast.lr_schedule) == (
        "fast recipe",
        "loader",
        "d2l",
        "constant",
    )
    wf[1] = (wf[1][0], capstone.StepResult("mem", 0.5, 4.0), True)
    fast = capstone.fast_recipe(wf)  # the safeguards ride on whatever won
    assert (fast.data, fast.init, fast.lr_schedule) == ("memory", "default", "linear-decay")


def test_build_net_inits_and_is_reproducible():
    d2l, default = capstone.build_net(8, seed=1), capstone.build_net(8, seed=1, init="default")
    conv_d2l = next(m for m in d2l.modules() if isinstance(m, torch.nn.Conv2d)).weight
    conv_def = next(m for m in default.modules() if isinstance(m, torch.nn.Conv2d)).weight
    assert abs(conv_d2l.std().item() - 0.01) < 0.003  # the book's N(0, 0.01)
    assert conv_def.std().item() > 0.05  # Kaiming-uniform: much larger
    again = capstone.build_net(8, seed=1)
    assert all(torch.equal(p, q) for p, q in zip(d2l.parameters(), again.parameters(), strict=True))
    with pytest.raises(ValueError, match="build_net: init must be one of 'd2l', 'default'"):
        capstone.build_net(8, init="xavier")


@pytest.mark.parametrize(
    "change,match",
    [
        (dict(data="disk"), "Recipe: data must be one of 'loader', 'memory', 'device'"),
        (dict(init="zeros"), "init must be one of"),
        (
            dict(lr_schedule="cosine"),
            "Recipe: lr_schedule must be one of 'constant', 'linear-decay'",
        ),
        (dict(lr_schedule="linear-decay"), "book's loop"),
        (dict(precision="fp8"), "Recipe: precision must be one of 'fp32', 'bf16', 'fp16'"),
        (dict(batch_size=0), "Recipe: batch_size must be an int >= 1, got 0"),
        (dict(lr=-0.1), "Recipe: lr must be a positive finite number"),
    ],
)
def test_recipe_rejects_bad_settings(change, match):
    with pytest.raises(ValueError, match=match):
        capstone.Recipe("bad", **change)


def test_cuda_graphs_recipe_is_recognised():
    ref = capstone.Recipe("r")
    assert not ref.uses_cuda_graphs and not ref.but("c", compile={}).uses_cuda_graphs
    assert ref.but("g", compile={"mode": "reduce-overhead"}).uses_cuda_graphs


# --------------------------------------------------------------------------- measurement rules


def _result(secs, spread, **extra):
    return capstone.StepResult("x", secs, 1.0 / secs, spread_s=spread, extra=extra)


@pytest.mark.parametrize(
    "best,new,spread_best,spread_new,kept",
    [
        (1.00, 0.90, 0.01, 0.01, True),  # 10 % faster, spread 1 %: kept
        (1.00, 0.90, 0.15, 0.01, False),  # gain 0.10 s inside the reference's 0.15 s spread
        (1.00, 0.90, 0.01, 0.12, False),  # ... or inside the new timing's spread
        (1.00, 0.99, 0.00, 0.00, False),  # 1 % faster: inside the 2 % tolerance
        (1.00, 1.10, 0.00, 0.00, False),  # slower
    ],
)
def test_keeps_needs_a_gain_beyond_tolerance_and_measured_spread(
    best, new, spread_best, spread_new, kept
):
    assert capstone.keeps(_result(new, spread_new), _result(best, spread_best), 0.02) is kept


def test_a_cuda_graphs_bar_whose_graphs_did_not_run_is_not_kept():
    skipped = _result(0.5, 0.0, cuda_graphs_used=False)
    assert not capstone.keeps(skipped, _result(1.0, 0.0))
    assert (
        "CUDA graphs did not run" in skipped.note
        and "TORCH_LOGS=perf_hints,cudagraphs" in skipped.note
    )
    assert capstone.keeps(_result(0.5, 0.0, cuda_graphs_used=True), _result(1.0, 0.0))


def fake_train(seconds: list[float], calls: list | None = None):
    """A training function as notebook 19 writes them, with made-up epoch times; it calls
    `on_step` after every step (so a profiler window sees real steps)."""

    def train(net, recipe, num_epochs, max_batches=None, on_step=None):
        if calls is not None:
            calls.append((recipe.name, num_epochs, max_batches))
        if on_step is not None:
            for i in range(1, max_batches + 1):
                torch.ones(64, 64) @ torch.ones(64, 64)
                on_step(i)
        return {"seconds": seconds[:num_epochs], "samples": [32] * num_epochs}

    return train


def test_measure_takes_the_median_of_the_timed_epochs_after_the_warm_up():
    # the warm-up epoch (100 s, compiling) must not count; the median of 1, 3, 2 s over 32 of
    # 96 images each is 2 s per 32 images, i.e. 6 s for the whole 96-image epoch
    calls = []
    r = capstone.measure(
        capstone.Recipe("m", data="memory", batch_size=32),
        fake_train([100.0, 1.0, 3.0, 2.0], calls),
        n_train=96,
        device="cpu",
        width=2,
        epochs=3,
        busy_steps=0,
    )
    assert calls == [("m", 4, None)]
    assert r.seconds_per_epoch == pytest.approx(6.0) and r.samples_per_s == pytest.approx(16.0)
    assert r.spread_s == pytest.approx(6.0)  # (3 - 1) s per 32 images, scaled to 96
    assert r.extra["epoch_seconds"] == pytest.approx([3.0, 9.0, 6.0]) and r.busy_fraction is None
    # its timing, for a claim judged on it: the scaled epochs, and the real window (1 s, not 3 s)
    assert r.timing.median == r.seconds_per_epoch and r.timing.times == r.extra["epoch_seconds"]
    assert (r.timing.window, r.timing.device) == (1.0, "cpu")
    assert r.wait_fraction is None  # nothing profiled


def test_measure_profiles_steady_steps_past_the_loader_prefetch():
    calls = []
    r = capstone.measure(
        capstone.Recipe("m", data="memory", batch_size=8),
        fake_train([1.0] * 4, calls),
        n_train=96,
        device="cpu",
        width=2,
        epochs=3,
        busy_steps=5,
    )
    # 12 batches per epoch on a CPU: 1 unprofiled warm-up step, then the 5 profiled ones
    assert calls[1] == ("m", 1, 6) and 0 < r.busy_fraction <= 1
    assert r.wait_fraction is None  # batches not from a DataLoader: no data wait to read
    ref = capstone.measure(
        capstone.Recipe("ref", batch_size=8),
        fake_train([1.0] * 4, calls),
        n_train=96,
        device="cpu",
        width=2,
        epochs=3,
        busy_steps=5,
    )
    assert (
        calls[3] == ("ref", 1, 12) and 0 < ref.busy_fraction <= 1
    )  # 4 workers x 2 + 2 warm-up steps


def test_measure_refuses_fewer_than_three_timed_epochs():
    """One or two timed epochs give no spread worth keeping a change by."""
    for recipe in (capstone.Recipe("c", data="device", compile={}), capstone.Recipe("ref")):
        with pytest.raises(ValueError, match="epochs must be an int >= 3, got 2"):
            capstone.measure(
                recipe, fake_train([1.0] * 3), n_train=96, device="cpu", epochs=2, busy_steps=0
            )


def test_the_wait_for_the_first_batch_is_counted_once_per_epoch_not_scaled():
    """An epoch cut to 3 batches of 32 that waited 0.5 s for its workers' first batch: the other
    2 batches (0.2 s) scale to the 960-image epoch's 29 batches after the first, the wait does
    not (scaled with them it would count 10 times)."""

    def train(net, recipe, num_epochs, max_batches=None, on_step=None):
        return {
            "seconds": [5.0] + [0.7] * (num_epochs - 1),
            "samples": [96] * num_epochs,
            "first_batch": [3.0] + [0.5] * (num_epochs - 1),
        }

    r = capstone.measure(
        capstone.Recipe("ref", batch_size=32), train, n_train=960, device="cpu", busy_steps=0
    )
    assert r.seconds_per_epoch == pytest.approx(0.5 + 0.2 * (960 - 32) / (96 - 32))
    assert r.extra["first_batch_s"] == pytest.approx(0.5)
    whole = capstone.measure(
        capstone.Recipe("ref", batch_size=32), train, n_train=96, device="cpu", busy_steps=0
    )
    assert whole.seconds_per_epoch == pytest.approx(0.7)  # a whole epoch: as measured


def test_run_waterfall_stacks_kept_changes_and_skips_with_the_reason():
    times = {"ref": 4.0, "uint8 in memory": 2.0, "larger batch": 3.0, "bf16 autocast": 1.0}
    seen = []

    def train(net, recipe, num_epochs, max_batches=None, on_step=None):
        seen.append(recipe)
        return {"seconds": [times[recipe.name]] * num_epochs, "samples": [32] * num_epochs}

    changes = [
        ("uint8 in memory", dict(data="memory"), "no workers"),
        ("larger batch", dict(batch_size=64, lr=0.2), "slower here"),
        ("torch.compile", dict(compile={}), "fused kernels"),
        ("bf16 autocast", dict(precision="bf16"), "bf16"),
    ]
    wf = capstone.run_waterfall(
        capstone.Recipe("ref"),
        changes,
        train,
        skip={"torch.compile": "no time"},
        n_train=32,
        device="cpu",
        width=2,
        epochs=3,
        busy_steps=0,
    )
    assert [(r.name, k) for r, _, k in wf] == [
        ("ref", True),
        ("uint8 in memory", True),
        ("larger batch", False),
        ("torch.compile", False),
        ("bf16 autocast", True),
    ]
    assert wf[3][1].skipped == "no time" and wf[3][1].seconds_per_epoch is None
    # the dropped larger batch is not under bf16: each change goes on the best recipe kept so far
    assert (seen[-1].data, seen[-1].batch_size, seen[-1].precision) == ("memory", 256, "bf16")
    assert capstone.fast_recipe(wf).precision == "bf16"


def test_an_epoch_of_one_batch_scales_its_step_not_the_wait():
    """A slow GPU's sized epochs may hold one batch: the wait for it (0.5 s, the workers'
    start) is counted once, as measured; the step after it (0.1 s) scales to the 320-image
    epoch's 10 batches. Scaling the whole 0.6 s would count the start 10 times (6 s)."""

    def train(net, recipe, num_epochs, max_batches=None, on_step=None):
        return {
            "seconds": [5.0] + [0.6] * (num_epochs - 1),
            "samples": [32] * num_epochs,
            "first_batch": [3.0] + [0.5] * (num_epochs - 1),
        }

    r = capstone.measure(
        capstone.Recipe("ref", batch_size=32), train, n_train=320, device="cpu", busy_steps=0
    )
    assert r.seconds_per_epoch == pytest.approx(0.5 + 0.1 * 320 / 32)


def test_waterfall_work_counts_each_bars_epochs_in_reference_steps():
    # 4 epochs a bar (a warm-up, 3 timed) x (3 bars at the reference batch, 3 fp32 bars at twice
    # it, 5 bars on 16-bit tensor cores at twice it, about half the fp32 cost)
    assert capstone.waterfall_work(256, 512) == 4 * (3 + 3 * 2 + 5 * 1)
    assert capstone.waterfall_work(256, 512, epochs=5) == 6 * (3 + 3 * 2 + 5 * 1)
    assert capstone.waterfall_work(256, 1024) > capstone.waterfall_work(256, 512)
    with pytest.raises(ValueError, match="big_batch must be an int >= 256"):
        capstone.waterfall_work(256, 128)
    with pytest.raises(ValueError, match="epochs must be an int >= 3"):
        capstone.waterfall_work(256, 512, epochs=2)

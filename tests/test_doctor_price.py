"""The price of DataLoader workers, made before `--what-if-loader` re-runs a script: the
arithmetic (a pure function of what the first run measured) on both sides of each of its
conditions, and the measurements it is made from (one batch of the script's own making, handed
over as a worker hands it over). Fast: no script is run."""

from __future__ import annotations

import psutil
import pytest
import torch
from torch.utils.data import BatchSampler, DataLoader, RandomSampler, TensorDataset

from helpers.doctor import whatif

# A loop that waits 32 ms for data of a 40 ms step, the rest compute on one busy core.
BASE = dict(
    step_s=0.040,
    wait_s=0.032,
    workers=2,
    cores=4,
    main_cores=1.0,
    others_cores=0.0,
    load_cpu_share=1.0,
    handover_main_s=0.001,
    handover_worker_s=0.001,
)


def price(**change: float) -> dict:
    return whatif.price_workers(**{**BASE, **change})


def test_a_step_is_priced_as_the_slower_side_workers_or_compute():
    p = price()  # workers: (32 + 1) ms a batch over 2 of them; compute 8 + 1 ms
    assert p["step_s_priced"] == pytest.approx(0.033 / 2)
    assert p["predicted_speedup"] == pytest.approx(0.040 / (0.033 / 2))
    assert "2 workers' loading" in p["why"]
    p = price(workers=8, cores=8)  # 8 workers load faster than the main process computes
    assert p["step_s_priced"] == pytest.approx(0.008 + 0.001)
    assert "the main process's compute and receiving" in p["why"]


def test_the_compute_s_busy_cores_are_the_main_process_s_less_its_loading():
    # all CPU: 1.0 busy core over the step, 32 ms of it loading -> 8 ms on 1 core
    assert price()["compute_cores"] == pytest.approx(1.0)
    # a multi-threaded compute: 1.3 cores over the step, 32 ms loading -> 20 ms over 8 ms
    assert price(main_cores=1.3)["compute_cores"] == pytest.approx((0.052 - 0.032) / 0.008)
    # loading that sleeps (reads, a network): none of the busy cores are its
    assert price(main_cores=0.2, load_cpu_share=0.0)["compute_cores"] == pytest.approx(1.0)


def test_workers_that_would_oversubscribe_the_free_cores_are_not_predicted():
    fits = price(cores=4)  # 2 busy workers + about 0.5 of the main process: fits on 4
    assert fits["predicted_speedup"] is not None
    assert fits["cores_needed"] <= fits["cores_free"]
    tight = price(cores=2)  # the same on 2 cores: they would take turns
    assert tight["predicted_speedup"] is None
    assert tight["cores_needed"] > tight["cores_free"]
    assert tight["why"].startswith("cannot be predicted here: 2 workers loading")
    # one worker fits beside the main process: named with its price (not re-run)
    one = price(cores=2, workers=1)
    assert one["predicted_speedup"] is not None and tight["workers_that_fit"] == 1
    assert tight["why"].endswith(f"1 worker would fit, priced {one['predicted_speedup']:.2f}x")
    assert "workers_that_fit" not in price(cores=1)  # none fits: none named


def test_other_processes_busy_cores_are_not_free():
    assert price(cores=4, others_cores=1.0)["predicted_speedup"] is not None
    crowded = price(cores=4, others_cores=2.0)  # 2 free of 4: the workers alone need 2
    assert crowded["predicted_speedup"] is None
    assert "other processes keep 2.00 busy" in crowded["why"]


def test_workers_that_wait_rather_than_compute_need_no_core_each():
    # the same wait as sleeps (a slow read): 2 workers wait side by side on 2 cores
    sleeping = price(cores=2, load_cpu_share=0.0, main_cores=0.2)
    assert sleeping["predicted_speedup"] == pytest.approx(0.040 / (0.033 / 2))
    assert price(cores=2, load_cpu_share=1.0)["predicted_speedup"] is None


def test_a_worker_s_one_thread_takes_longer_on_loading_the_main_process_spread_over_threads():
    # 32 ms of wait that was 48 ms of CPU on several threads: a worker's one thread takes 48
    p = price(load_cpu_share=1.5, main_cores=1.4, cores=8)
    assert p["worker_batch_s"] == pytest.approx(0.048 + 0.001)


def test_a_hand_over_that_eats_the_gain_predicts_no_gain():
    gain = price(handover_main_s=0.001)
    assert gain["predicted_speedup"] > 1 and "no gain" not in gain["why"]
    # receiving a batch costs the main process more than the loading it saves
    eaten = price(handover_main_s=0.035, main_cores=0.5, load_cpu_share=0.0, cores=8)
    assert eaten["predicted_speedup"] <= 1
    assert eaten["why"].startswith("no gain: the hand-over and the compute eat it")


def test_the_what_if_says_why_it_cannot_predict_before_the_rerun():
    measured = {"step_s": 0.04, "mean_step_s": 0.04, "wait_s": 0.032, "cores": 2, "workers": 0}
    change = {"loader": {"num_workers": 2}}
    finding = {"kind": "input-bound"}
    assert whatif.prediction(finding, measured, change, None) == (
        None,
        "cannot be predicted here: what workers would cost was not measured",
    )
    got, why = whatif.prediction(finding, {**measured, "workers": 1}, change, {})
    assert got is None and "already runs 1 workers" in why
    pricing = {k: BASE[k] for k in ("main_cores", "others_cores", "load_cpu_share")}
    pricing |= {"handover_main_s": 0.001, "handover_worker_s": 0.001}
    got, why = whatif.prediction(finding, measured, change, pricing)
    assert got is None and why.startswith("cannot be predicted here")  # 2 cores: turns
    got, why = whatif.prediction(finding, {**measured, "cores": 4}, change, pricing)
    assert got == pytest.approx(price()["predicted_speedup"]) and "set by" in why
    # pinned batches (CUDA): the pin_memory thread's copy is the main process's too
    pinned = {**change, "loader": {"num_workers": 2, "pin_memory": True}}
    slow_pin = {**pricing, "pin_s": 0.030}
    got, _ = whatif.prediction(finding, {**measured, "cores": 4}, pinned, slow_pin)
    assert got == pytest.approx(price(handover_main_s=0.031)["predicted_speedup"])
    # a what-if measured on the loop itself is its own prediction
    assert whatif.prediction({"predicted_speedup": 1.5}, measured, change)[0] == 1.5
    number = whatif.predicted_speedup(finding, {**measured, "cores": 4}, change, pricing)
    assert number == pytest.approx(price()["predicted_speedup"])  # the number alone


def test_the_what_if_line_says_a_price_it_could_not_make():
    record = {"finding": "input-bound", "change": "every DataLoader built with num_workers=2"}
    record |= {"predicted_speedup": None, "measured_speedup": 0.88}
    record |= {"step_s_before": 0.0152, "step_s_after": 0.0168}
    record["prediction"] = "cannot be predicted here: 2 workers loading ..."
    text = whatif.render(record)
    assert "not predicted (it cannot be predicted here, below), measured 0.88x" in text
    assert "the prediction, from the first run alone: cannot be predicted here" in text


def _loader(**kw) -> DataLoader:
    ds = TensorDataset(torch.randn(64, 3, 8, 8), torch.arange(64))
    return DataLoader(ds, **kw)


@pytest.mark.parametrize(
    "loader",
    [
        _loader(batch_size=16, shuffle=True),
        _loader(sampler=BatchSampler(RandomSampler(range(64)), 16, False), batch_size=None),
    ],
    ids=["batch_size", "batch_sampler"],
)
def test_one_batch_is_of_the_loader_s_own_shape(loader):
    X, y = whatif.one_batch(loader)
    assert X.shape == (16, 3, 8, 8) and y.shape == (16,)
    assert [t.shape for t in whatif._tensors({"batch": (X, [y])})] == [X.shape, y.shape]


def test_the_hand_over_is_measured_through_a_worker_s_mechanism_and_leaves_nothing():
    batch = whatif.one_batch(_loader(batch_size=16))
    moved = whatif.handover(batch)
    if moved is None:  # no fork start method on this platform: said, not measured
        pytest.skip("no fork start method here")
    assert moved["batch_bytes"] == 16 * 3 * 8 * 8 * 4 + 16 * 8
    assert moved["handover_main_s"] > 0 and moved["handover_worker_s"] > 0
    assert not psutil.Process().children(recursive=True)


def test_the_cpu_clock_counts_this_process_s_busy_cores():
    clock = whatif.CpuClock()
    clock.start()
    x = torch.randn(128, 128)
    for _ in range(50):
        x = torch.tanh(x @ x / 128)
    clock.stop()
    assert clock.result["main_cores"] > 0 and clock.result["others_cores"] >= 0


def test_a_prediction_holds_within_its_band_of_the_rerun():
    band = whatif.PREDICTION_BAND
    assert whatif.held_up(1.0 + 0.9 * band, 1.0) and whatif.held_up(1.0 - 0.9 * band, 1.0)
    assert not whatif.held_up(1.0 + 1.1 * band, 1.0)
    assert not whatif.held_up(2.27, 0.88)  # the PNG loop's first prediction: a miss
    record = {"finding": "input-bound", "change": "workers", "step_s_before": 0.02}
    record |= {"predicted_speedup": 2.0, "measured_speedup": 1.9, "step_s_after": 0.0105}
    assert "the prediction held" in whatif.render(record)
    record |= {"measured_speedup": 0.9, "step_s_after": 0.022}
    assert "the prediction missed" in whatif.render(record)

import pytest
import torch

from helpers import capstone


@pytest.fixture(scope="module")
def tiny():
    return capstone.load_data(96, 64)


def test_run_cost_arithmetic():
    c = capstone.run_cost(1000.0, price_per_hour=2.0, epochs=6, dataset_size=60000)
    assert c["seconds_per_epoch"] == pytest.approx(60.0)
    assert c["hours"] == pytest.approx(0.1)
    assert c["cost"] == pytest.approx(0.2)
    assert capstone.run_cost(1000.0, price_per_hour=2.0, n_devices=4)["cost"] == pytest.approx(
        4 * capstone.run_cost(1000.0, price_per_hour=2.0)["cost"])


@pytest.mark.parametrize("kwargs,match", [
    (dict(samples_per_s=0, price_per_hour=1.0), "samples_per_s"),
    (dict(samples_per_s=10, price_per_hour=-1.0), "price_per_hour"),
    (dict(samples_per_s=10, price_per_hour=1.0, epochs=0), "epochs"),
])
def test_run_cost_bad_input(kwargs, match):
    with pytest.raises(ValueError, match=match):
        capstone.run_cost(**kwargs)


def test_waterfall_changes_scale_lr_and_keep_order():
    ref, changes = capstone.waterfall_changes(batch_size=256, lr=0.1, big_batch=1024)
    assert ref.data == "loader" and ref.precision == "fp32"
    names = [c[0] for c in changes]
    assert names.index("larger batch") < names.index("bf16 autocast") < names.index("torch.compile")
    big = dict(changes)["larger batch"] if False else [c for c in changes if c[0] == "larger batch"][0][1]
    assert big == {"batch_size": 1024, "lr": pytest.approx(0.4)}


@pytest.mark.parametrize("mode", ["memory", "device"])
def test_epoch_batches_give_totensor_values_and_every_sample(tiny, mode):
    b = capstone.EpochBatches(tiny.x_train, tiny.y_train, 32, mode=mode, device=torch.device("cpu"))
    assert len(b) == 3
    xs, ys = zip(*list(b), strict=True)
    X, Y = torch.cat(xs), torch.cat(ys)
    assert X.dtype == torch.float32 and len(X) == 96
    # a permutation of the data set, with ToTensor's scaling
    ref = tiny.x_train.float() / 255
    assert torch.allclose(X.sum(0), ref.sum(0), atol=1e-3)
    assert sorted(Y.tolist()) == sorted(tiny.y_train.tolist())
    assert not torch.equal(torch.cat([y for _, y in b]), Y)  # a new shuffle each epoch


def test_epoch_batches_bad_mode(tiny):
    with pytest.raises(ValueError, match="mode"):
        capstone.EpochBatches(tiny.x_train, tiny.y_train, 8, mode="disk", device=torch.device("cpu"))


def test_reference_and_fast_recipe_run_and_fast_keeps_winners(tiny):
    wf = capstone.run_waterfall(tiny, device="cpu", width=2, batch_size=16, big_batch=32,
                                epochs=1, max_batches=2, busy_batches=1, num_workers=0,
                                skip={"torch.compile": "not in tests"}, progress=False)
    names = [r.name for _, r, _ in wf]
    assert names[0] == "reference (d2l)" and len(wf) == 9
    graphs = [r for _, r, _ in wf if r.name == "+ CUDA graphs"][0]
    assert graphs.seconds_per_epoch is None and "GPU" in graphs.skipped
    assert wf[0][2] is True
    for _, r, _ in wf:
        if r.seconds_per_epoch is not None:
            assert r.seconds_per_epoch > 0 and 0 <= r.busy_fraction <= 1
    fast = capstone.fast_recipe(wf)
    assert fast.name == "fast recipe"
    kept = [rec for rec, _, k in wf if k]
    assert fast.data == kept[-1].data and fast.batch_size == kept[-1].batch_size


def test_accuracy_runs_for_both_recipes(tiny):
    ref, changes = capstone.waterfall_changes(batch_size=32, big_batch=32)
    fast = ref.but("fast", data="device", channels_last=True)
    a = capstone.train_for_accuracy(ref, tiny, device="cpu", width=2, epochs=1, num_workers=0)
    b = capstone.train_for_accuracy(fast, tiny, device="cpu", width=2, epochs=1)
    assert 0 <= a <= 1 and 0 <= b <= 1


def test_build_net_is_reproducible():
    a, b = capstone.build_net(4, seed=3), capstone.build_net(4, seed=3)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters(), strict=True))


def test_epoch_batches_drop_last_gives_one_shape(tiny):
    b = capstone.EpochBatches(tiny.x_train, tiny.y_train, 40, mode="device",
                              device=torch.device("cpu"), drop_last=True)
    shapes = {x.shape[0] for x, _ in b}
    assert shapes == {40} and len(b) == 2

import pytest
import torch

from helpers import capstone, training


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
    big = [c for c in changes if c[0] == "larger batch"][0][1]
    assert big == {"batch_size": 1024, "lr": pytest.approx(0.4)}


def test_reference_and_fast_recipe_run_and_fast_keeps_winners(tiny):
    wf = capstone.run_waterfall(tiny, device="cpu", width=2, batch_size=16, big_batch=32,
                                epochs=1, max_batches=2, busy_batches=1, num_workers=0,
                                skip={"torch.compile": "not in tests"}, progress=False)
    names = [r.name for _, r, _ in wf]
    assert names[0] == "reference (d2l)" and len(wf) == 11
    for gpu_only in ("+ CUDA graphs", "cudnn.benchmark", "TF32 matmuls"):
        step = [r for _, r, _ in wf if r.name == gpu_only][0]
        assert step.seconds_per_epoch is None and ("GPU" in step.skipped or "NVIDIA" in step.skipped)
    assert wf[0][2] is True
    for _, r, _ in wf:
        if r.seconds_per_epoch is not None:
            assert r.seconds_per_epoch > 0 and 0 <= r.busy_fraction <= 1
    fast = capstone.fast_recipe(wf)
    assert fast.name == "fast recipe"
    kept = [rec for rec, _, k in wf if k]
    assert fast.data == kept[-1].data and fast.batch_size == kept[-1].batch_size
    if fast.data != "loader":  # the safeguards ride on whatever won
        assert (fast.init, fast.lr_schedule) == ("default", "linear-decay")


def test_fast_recipe_is_the_book_loop_when_nothing_wins():
    ref, changes = capstone.waterfall_changes()
    slower = capstone.StepResult("x", 2.0, 1.0)
    wf = [(ref, capstone.StepResult("ref", 1.0, 2.0), True),
          (ref.but("uint8 in memory", data="memory"), slower, False)]
    fast = capstone.fast_recipe(wf)
    assert (fast.data, fast.init, fast.lr_schedule) == ("loader", "d2l", "constant")
    wf[1] = (wf[1][0], capstone.StepResult("mem", 0.5, 4.0), True)
    fast = capstone.fast_recipe(wf)
    assert (fast.data, fast.init, fast.lr_schedule) == ("memory", "default", "linear-decay")


def test_accuracy_curves_have_one_point_per_epoch_for_both_recipes(tiny):
    ref, changes = capstone.waterfall_changes(batch_size=32, big_batch=32)
    fast = ref.but("fast", data="device", channels_last=True, init="default", lr_schedule="linear-decay")
    a = capstone.accuracy_curve(ref, tiny, device="cpu", width=2, epochs=2, num_workers=0)
    b = capstone.accuracy_curve(fast, tiny, device="cpu", width=2, epochs=2)
    assert len(a) == len(b) == 2 and all(0 <= v <= 1 for v in a + b)
    # accuracies are multiples of 1/64 (the test set): really counted, not made up
    assert all(abs(v * 64 - round(v * 64)) < 1e-9 for v in a + b)
    assert capstone.train_for_accuracy(ref, tiny, device="cpu", width=2, epochs=2, num_workers=0) == a[-1]


def test_accuracy_curve_rejects_zero_epochs(tiny):
    ref, _ = capstone.waterfall_changes()
    with pytest.raises(ValueError, match="epochs"):
        capstone.accuracy_curve(ref, tiny, device="cpu", width=2, epochs=0)


def test_build_net_inits():
    d2l, default = capstone.build_net(8, seed=1), capstone.build_net(8, seed=1, init="default")
    conv_d2l = next(m for m in d2l.modules() if isinstance(m, torch.nn.Conv2d)).weight
    conv_def = next(m for m in default.modules() if isinstance(m, torch.nn.Conv2d)).weight
    assert abs(conv_d2l.std().item() - 0.01) < 0.003   # the book's N(0, 0.01)
    assert conv_def.std().item() > 0.05                 # Kaiming-uniform: much larger
    with pytest.raises(ValueError, match="build_net: init must be one of 'd2l', 'default'"):
        capstone.build_net(8, init="xavier")


@pytest.mark.parametrize("change,match", [
    (dict(data="disk"), "Recipe: data must be one of 'loader', 'memory', 'device'"),
    (dict(init="zeros"), "init must be one of"),
    (dict(lr_schedule="cosine"), "Recipe: lr_schedule must be one of 'constant', 'linear-decay'"),
    (dict(lr_schedule="linear-decay"), "book's loop"),
    (dict(batch_size=0), "Recipe: batch_size must be an int >= 1, got 0"),
    (dict(lr=-0.1), "Recipe: lr must be a positive finite number"),
])
def test_recipe_rejects_bad_settings(change, match):
    with pytest.raises(ValueError, match=match):
        capstone.Recipe("bad", **change)


def test_linear_decay_takes_the_lr_to_zero_over_the_run(tiny):
    recipe = capstone.Recipe("r", data="device", batch_size=32, lr=0.4, lr_schedule="linear-decay")
    net = capstone.build_net(2)
    batches = capstone._epoch_batches(recipe, tiny, torch.device("cpu"), seed=0)
    hist = capstone.train_recipe(net, recipe, batches, device=torch.device("cpu"), num_epochs=3)
    # 3 batches per epoch, 9 steps: epoch e's last update (step 3e) used 0.4 * (1 - (3e - 1) / 9)
    assert hist["lr"] == pytest.approx([0.4 * (1 - (3 * e - 1) / 9) for e in (1, 2, 3)])
    const = capstone.train_recipe(capstone.build_net(2), recipe.but("c", lr_schedule="constant"), batches,
                                  device=torch.device("cpu"), num_epochs=2)
    assert const["lr"] == [0.4, 0.4]


def test_train_recipe_switches_on_each_change_in_the_loop(tiny, monkeypatch):
    """Each waterfall change reaches the shared loop; the backend switches hold while it trains."""
    seen = {}

    def spy(net, batches, **kw):
        seen.update(kw, cudnn=torch.backends.cudnn.benchmark, mm=torch.get_float32_matmul_precision())
        return "history"

    monkeypatch.setattr(capstone.training, "train", spy)
    ref, changes = capstone.waterfall_changes(batch_size=16, big_batch=32, device="cuda")
    recipes = {}
    recipe = ref
    for name, change, _ in changes:
        recipe = recipes[name] = recipe.but(name, **change)
    before = (torch.backends.cudnn.benchmark, torch.get_float32_matmul_precision())
    assert capstone.train_recipe(capstone.build_net(2), recipe, [], device=torch.device("cpu")) == "history"
    assert (seen["lr"], seen["precision"], seen["channels_last"], seen["fused"]) == (0.2, "bf16", True, True)
    assert seen["compile_model"] == {"mode": "reduce-overhead"}  # "+ CUDA graphs"
    assert seen["cudnn"] is True and seen["mm"] == "high"
    capstone.train_recipe(capstone.build_net(2), recipes["torch.compile"], [], device=torch.device("cpu"))
    assert seen["compile_model"] == {}  # compile={}: compiled in Inductor's default mode (not off)
    assert (torch.backends.cudnn.benchmark, torch.get_float32_matmul_precision()) == before
    plain = capstone.train_recipe(capstone.build_net(2), ref.but("m", data="memory"), [], device=torch.device("cpu"))
    assert plain == "history" and (seen["precision"], seen["channels_last"], seen["fused"]) == ("fp32", False, False)


def test_build_net_is_reproducible():
    a, b = capstone.build_net(4, seed=3), capstone.build_net(4, seed=3)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters(), strict=True))


def test_backend_flags_set_tf32_and_cudnn_benchmark_and_restore_them():
    ref, _ = capstone.waterfall_changes()
    before = (torch.backends.cudnn.benchmark, torch.get_float32_matmul_precision())
    with capstone.backend_flags(ref.but("both", cudnn_benchmark=True, tf32=True)):
        assert torch.backends.cudnn.benchmark and torch.get_float32_matmul_precision() == "high"
    assert (torch.backends.cudnn.benchmark, torch.get_float32_matmul_precision()) == before
    with pytest.raises(RuntimeError), capstone.backend_flags(ref.but("tf32", tf32=True)):
        raise RuntimeError("a failing bar")
    assert (torch.backends.cudnn.benchmark, torch.get_float32_matmul_precision()) == before


def test_reference_runs_on_one_device_unless_asked(tiny, monkeypatch):
    """Equal work: the reference uses one device like every fast recipe; n_devices > 1 is the
    book's DataParallel run and needs that many GPUs."""
    out = capstone.train_reference(capstone.build_net(2), tiny.train_ds, None, batch_size=16,
                                   num_workers=0, max_batches=1)
    assert not isinstance(out["net"], torch.nn.DataParallel)
    for bad in (0, True, 1.5):
        with pytest.raises(ValueError, match="train_reference: n_devices must be an int >= 1"):
            capstone.train_reference(capstone.build_net(2), tiny.train_ds, None, n_devices=bad)
    monkeypatch.setattr(capstone.devices, "try_all_gpus", lambda: [torch.device("cpu")])
    monkeypatch.setattr(capstone.devices, "num_gpus", lambda: 0)
    with pytest.raises(ValueError, match="n_devices=2 but this machine has 0 GPU"):
        capstone.train_reference(capstone.build_net(2), tiny.train_ds, None, n_devices=2)


# --------------------------------------------------------------------------- measurement rules


def _result(secs, spread):
    return capstone.StepResult("x", secs, 1.0 / secs, spread_s=spread)


@pytest.mark.parametrize("best,new,spread_best,spread_new,kept", [
    (1.00, 0.90, 0.01, 0.01, True),    # 10 % faster, spread 1 %: kept
    (1.00, 0.90, 0.15, 0.01, False),   # gain 0.10 s inside the reference's 0.15 s spread
    (1.00, 0.90, 0.01, 0.12, False),   # ... or inside the new timing's spread
    (1.00, 0.99, 0.00, 0.00, False),   # 1 % faster: inside the 2 % tolerance
    (1.00, 1.10, 0.00, 0.00, False),   # slower
])
def test_keeps_needs_a_gain_beyond_tolerance_and_measured_spread(best, new, spread_best, spread_new, kept):
    assert capstone.keeps(_result(new, spread_new), _result(best, spread_best), 0.02) is kept


def test_measure_refuses_too_few_epochs_where_it_compiles(tiny):
    r = capstone.Recipe("c", data="device", batch_size=32, compile={})
    for kw in (dict(epochs=2), dict(epochs=3, warmup_epochs=0)):
        with pytest.raises(ValueError, match="compiles; time at least 3 steady epochs"):
            capstone.measure(r, tiny, device="cpu", width=2, busy_batches=0, **kw)


def test_measure_takes_the_median_of_the_steady_epochs_after_the_warm_up(tiny, monkeypatch):
    # fake timings: the warm-up epoch (100 s, compiling) must not count; the median of 1, 3, 2 s
    # over 32 of 96 images each is 2 s per 32 images, i.e. 6 s for the whole 96-image epoch
    fake = [100.0, 1.0, 3.0, 2.0]

    def fake_train(net, recipe, batches, *, num_epochs, **kw):
        assert num_epochs == 4
        return training.History(epochs=[training.EpochStats(
            epoch=i + 1, loss=0.0, accuracy=None, samples=32, seconds=s, samples_per_s=32 / s,
            data_wait_s=0.0, data_wait_fraction=0.0, peak_memory_bytes=0, memory_kind="",
            lr=0.1, optimizer_steps=1) for i, s in enumerate(fake)])

    monkeypatch.setattr(capstone, "train_recipe", fake_train)
    r = capstone.measure(capstone.Recipe("m", data="memory", batch_size=32), tiny, device="cpu",
                         width=2, epochs=3, busy_batches=0)
    assert r.seconds_per_epoch == pytest.approx(6.0)
    assert r.spread_s == pytest.approx(6.0)  # (3 - 1) s per 32 images, scaled to 96
    assert r.extra["epoch_seconds"] == pytest.approx([3.0, 9.0, 6.0])
    assert r.busy_fraction is None


def test_measure_profiles_steady_steps_of_the_same_loop(tiny):
    r = capstone.measure(capstone.Recipe("m", data="memory", batch_size=8), tiny, device="cpu",
                         width=2, epochs=1, max_batches=2, busy_batches=5)
    # 12 batches per epoch: 3 unprofiled warm-up steps, then the 5 profiled ones
    assert r.extra["busy_steps"] == 5 and 0 < r.busy_fraction <= 1
    ref = capstone.measure(capstone.Recipe("ref", batch_size=8), tiny, device="cpu", width=2,
                           epochs=1, max_batches=2, busy_batches=5, num_workers=0)
    assert ref.extra["busy_steps"] == 5 and 0 < ref.busy_fraction <= 1


def test_backend_flags_set_cudnn_benchmark_and_restore_it():
    before = torch.backends.cudnn.benchmark
    with capstone.backend_flags(capstone.Recipe("r", cudnn_benchmark=not before)):
        assert torch.backends.cudnn.benchmark is (not before)
    assert torch.backends.cudnn.benchmark is before
    with pytest.raises(RuntimeError), capstone.backend_flags(capstone.Recipe("r", cudnn_benchmark=True)):
        raise RuntimeError("a failing bar")
    assert torch.backends.cudnn.benchmark is before


def test_cuda_graphs_recipe_is_recognised():
    ref, changes = capstone.waterfall_changes(device="cpu")
    assert not ref.uses_cuda_graphs
    assert ref.but("g", compile={"mode": "reduce-overhead"}).uses_cuda_graphs
    assert not ref.but("c", compile={}).uses_cuda_graphs


def test_a_cuda_graphs_bar_whose_graphs_did_not_run_is_flagged_not_kept():
    ref, _ = capstone.waterfall_changes()
    graphs = ref.but("+ CUDA graphs", data="device", compile={"mode": "reduce-overhead"})
    ran = capstone.StepResult("g", 1.0, 1.0, extra={"cuda_graphs_used": True, "cudagraph_skips": 0,
                                                    "cuda_graph_launches": 20})
    assert not capstone.graphs_missing(graphs, ran) and ran.note == ""
    skipped = capstone.StepResult("g", 1.0, 1.0, extra={"cuda_graphs_used": False, "cudagraph_skips": 1,
                                                        "cuda_graph_launches": 0})
    assert capstone.graphs_missing(graphs, skipped)
    assert "CUDA graphs did not run (1 skip(s), 0 graph launches" in skipped.note
    assert "TORCH_LOGS=perf_hints,cudagraphs" in skipped.note
    # a recipe without graphs is never flagged
    assert not capstone.graphs_missing(graphs.but("c", compile={}), skipped)


def test_measure_a_compiled_recipe_times_three_steady_epochs(tiny):
    # torch.compile with the eager backend: the compiled path (reset, warm-up epoch, median of 3)
    # without Inductor's minutes of compiling on a small CPU
    r = capstone.measure(capstone.Recipe("c", data="device", batch_size=32, compile={"backend": "eager"}),
                         tiny, device="cpu", width=2, epochs=3, busy_batches=1)
    assert len(r.extra["epoch_seconds"]) == 3 and r.extra["warmup_epochs"] == 1
    assert r.seconds_per_epoch == pytest.approx(sorted(r.extra["epoch_seconds"])[1])
    assert r.extra["busy_steps"] == 1 and "cuda_graphs_used" not in r.extra


@pytest.mark.parametrize("data", ["memory", "device"])
def test_epoch_batches_give_totensor_values_and_drop_last_when_compiled(tiny, data):
    ref, _ = capstone.waterfall_changes()
    plain = capstone._epoch_batches(ref.but("p", data=data, batch_size=40), tiny, torch.device("cpu"), 0)
    xs, ys = zip(*list(plain), strict=True)
    assert plain.mode == data and [len(x) for x in xs] == [40, 40, 16]
    assert torch.allclose(torch.cat(xs).sum(0), (tiny.x_train.float() / 255).sum(0), atol=1e-3)
    assert sorted(torch.cat(ys).tolist()) == sorted(tiny.y_train.tolist())
    compiled = capstone._epoch_batches(ref.but("c", data=data, batch_size=40, compile={}), tiny,
                                       torch.device("cpu"), 0)
    assert [len(x) for x, _ in compiled] == [40, 40]

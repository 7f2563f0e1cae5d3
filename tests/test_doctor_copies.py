"""The doctor tells copies apart (CUDA) without a GPU: its accounting is a pure function of event
records, fed here from a trace in the shape torch.profiler gives them
(tests/doctor_traces/cuda_copies.json: two profiled steps of pageable blocking copies, two of
pinned non-blocking ones on a side stream)."""

from __future__ import annotations

import json
import types
from pathlib import Path

import jsonschema
import pytest

from helpers import diagnose, doctor
from helpers.doctor import copies, profiled, rules, whatif

TRACE = json.loads((Path(__file__).parent / "doctor_traces" / "cuda_copies.json").read_text())


def account(name: str, window_us: float | None = None) -> dict:
    s = TRACE[name]
    events = [copies.Event(**e) for e in s["events"]]
    return copies.account(events, s["steps"], 1e-6 * (window_us or s["window_us"]))


def busy(name: str) -> float:
    """The device's busy share of the trace's window, by the suite's formula (a kernel or a copy
    on the device: diagnose.busy_seconds)."""
    s = TRACE[name]
    spans = [(e["start_us"], e["start_us"] + e["dur_us"]) for e in s["events"]]
    cuda = [span for e, span in zip(s["events"], spans, strict=True) if e["device"] == "CUDA"]
    return diagnose.covered_us(cuda) / s["window_us"]


def gpu(c: dict, **kw) -> rules.Measured:
    """A CUDA loop whose every other window filled, its profiled step the trace's."""
    base = dict(
        device="cuda",
        step_s=c["step_s"],
        steps=20,
        batch_size=32,
        cores=2,
        threads=2,
        wait_s=0.0,
        ops_per_step=50,
        dispatch_s=1e-6,
        busy=0.6,
        stall_s=0.0,
        copies=c,
    )
    return rules.Measured(**{**base, **kw})


def kind(c: dict, direction: str) -> dict:
    (k,) = [k for k in c["kinds"] if k["direction"] == direction]
    return k


def test_pageable_blocking_copies_are_copy_bound_with_the_pin_and_non_blocking_fixes():
    c = account("pageable_blocking")
    up = kind(c, "host->device")
    assert (up["memory"], up["blocking"], up["per_step"]) == ("pageable", True, 2)
    read = kind(c, "device->host")  # loss.item(): its wait is the kernels', not the copy's
    assert read["blocking"] and read["held_s"] > 2 * up["held_s"]
    # the host held by the uploads (their calls and the sync after each) plus the read's
    # transfer, which no kernel overlaps: 1.410 + 0.025 + 0.002 ms of each 5 ms step
    assert c["exposed_s"] == pytest.approx(1.437e-3) and c["share"] == pytest.approx(0.2874)
    # the stall: every waiting call's time, the uploads' and the read's (profiled.STALL_EVENTS)
    m = gpu(c, stall_s=c["held_s"] + 3.0e-3, syncs_per_step=3, busy=busy("pageable_blocking"))
    top = rules.findings(m)[0]
    assert top.kind == "copy-bound" and top.share == pytest.approx(c["share"])
    assert "host->device pageable, blocking: 2 a step" in top.evidence
    assert top.fix.index("pin_memory=True") < top.fix.index("non_blocking=True")
    assert "uint8" in top.fix and "06_gpu_data_pipelines.ipynb" in top.fix
    assert "09_device_placement.ipynb" in top.fix and top.notebook == "09_device_placement.ipynb"
    assert "08_item_hygiene.ipynb" not in top.fix  # a loss read moves a few bytes
    assert "host->device pageable blocking x2 (1.35 ms on the device)" in doctor.render(m, [top])
    v = rules.verdict(m)
    assert v.kind == "copy-bound" and v.shares["copy"] == c["share"]
    # the read's 3 ms wait stays the sync rule's (what of it the device idled: the copies kept
    # it busy), the uploads' held time is not counted again there
    assert v.shares["sync"] == pytest.approx(1 - m.busy) and m.busy > 0.9
    assert rules.shares(gpu(c, stall_s=c["held_s"], busy=0.5))["sync"] == pytest.approx(0.0)


def test_pinned_non_blocking_copies_overlapped_by_compute_are_no_finding():
    c = account("pinned_nonblocking")
    up = kind(c, "host->device")
    assert (up["memory"], up["blocking"], up["held_s"]) == ("pinned", False, 0.0)
    assert up["transfer_s"] == pytest.approx(0.323e-3)  # copied, but beside the kernels
    assert c["share"] < rules.COPY_SHARE
    m = gpu(c, busy=busy("pinned_nonblocking"))
    assert rules.copy_bound(m) is None
    assert "copy-bound" not in [f.kind for f in rules.findings(m)]


@pytest.mark.parametrize("name", ["pageable_blocking", "pinned_nonblocking"])
def test_the_copy_share_threshold_either_side(name):
    """The same trace in a window just long enough to fall either side of the line."""
    exposed_us = 1e6 * account(name)["exposed_s"] * TRACE[name]["steps"]
    below = account(name, exposed_us / (rules.COPY_SHARE - 0.001))
    above = account(name, exposed_us / (rules.COPY_SHARE + 0.001))
    assert rules.copy_bound(gpu(below)) is None
    assert rules.copy_bound(gpu(above)).kind == "copy-bound"


def test_records_come_from_the_profiler_s_events():
    def event(name, device, start, dur, thread=1, stream=7, op=5):
        return types.SimpleNamespace(
            name=name,
            device_type=f"DeviceType.{device}",
            time_range=types.SimpleNamespace(start=start, elapsed_us=lambda: dur),
            thread=thread,
            device_resource_id=stream,
            linked_correlation_id=op,
        )

    got = copies.records(
        [
            event("aten::to", "CPU", 0, 30),  # an operator: not read
            event("cudaMemcpyAsync", "CPU", 1, 20),
            event("Memcpy HtoD (Pageable -> Device)", "CUDA", 3, 15),
            event("cudaStreamSynchronize", "CPU", 21, 2),
        ]
    )
    assert got == [
        copies.Event("cudaMemcpyAsync", "CPU", 1, 20, 1, 5),
        copies.Event("Memcpy HtoD (Pageable -> Device)", "CUDA", 3, 15, 7, 5),
        copies.Event("cudaStreamSynchronize", "CPU", 21, 2, 1, 5),
    ]
    (k,) = copies.account(got, 1, 100e-6)["kinds"]
    assert k["blocking"] and k["held_s"] == pytest.approx(22e-6)


def test_where_copies_are_not_seen_the_report_says_so():
    for device in ("cpu", "mps"):
        assert any(u.startswith(profiled.COPIES_UNSEEN) for u in profiled.UNSEEN[device])
    m = rules.Measured(device="cpu", step_s=0.01, steps=20, unseen=list(profiled.UNSEEN["cpu"]))
    assert "not seen here: copies between host and device" in doctor.render(m, [])


def test_counted_copies_defer_to_the_measured_ones():
    """Where the profiler told the copies apart, the counted copy syncs give no second
    copy-bound finding; without it (a CPU) they still do."""
    c = account("pageable_blocking")
    ops = {f"_to_copy {rules.UPLOAD}, pageable": 2}
    m = gpu(c, syncs_per_step=2, sync_ops=ops, stall_s=c["held_s"])
    assert [f.kind for f in rules.findings(m)].count("copy-bound") == 1
    assert rules.sync_bound(m) is None
    cpu = rules.sync_bound(
        rules.Measured(device="cpu", step_s=0.01, steps=20, syncs_per_step=2, sync_ops=ops)
    )
    assert cpu.kind == "copy-bound" and cpu.share is None


def test_the_what_if_pins_the_loader_only_for_pageable_copies():
    finding = {"kind": "copy-bound", "predicted_speedup": None}
    pageable = {"step_s": 0.005, "wait_s": 0.0, "copies": account("pageable_blocking")}
    change, words = whatif.change_for(finding, pageable, loader=True)
    assert change == {"loader": {"pin_memory": True}} and "pin_memory=True" in words
    assert whatif.predicted_speedup(finding, pageable, change) is None  # no prediction
    assert whatif.change_for(finding, pageable, loader=False)[0] is None
    pinned = {"step_s": 0.005, "copies": account("pinned_nonblocking")}
    change, words = whatif.change_for(finding, pinned, loader=True)
    assert change is None and "non_blocking=True" in words


def test_the_report_with_copies_follows_the_schema():
    m = gpu(account("pageable_blocking"))
    d = rules.as_dict(m, rules.findings(m))
    schema = json.loads(rules.SCHEMA_FILE.read_text())
    assert d["schema"] == schema["$id"] == rules.SCHEMA
    jsonschema.validate(json.loads(json.dumps(d)), schema)
    bad = {**d["measured"], "copies": {**d["measured"]["copies"], "share": 1.5}}
    with pytest.raises(jsonschema.ValidationError):  # the schema can fail
        jsonschema.validate({**d, "measured": bad}, schema)


def test_copies_mostly_from_the_device_are_told_to_read_less_not_to_pin():
    """The same trace with its batches copied the other way (outputs to the host each step)."""
    s = TRACE["pageable_blocking"]
    events = [
        copies.Event(
            **{
                **e,
                "name": e["name"].replace("HtoD (Pageable -> Device)", "DtoH (Device -> Pageable)"),
            }
        )
        for e in s["events"]
    ]
    c = copies.account(events, s["steps"], 1e-6 * s["window_us"])
    assert {k["direction"] for k in c["kinds"]} == {"device->host"} and c["held_s"] == 0.0
    f = rules.copy_bound(gpu(c))
    assert f.fix.startswith(rules.COPY_FIXES["reads"]) and "pin_memory" not in f.fix

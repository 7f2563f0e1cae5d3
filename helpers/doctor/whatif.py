"""`--what-if` from the command line: the script re-run, unmodified, for the same steps, with the
setting of the top finding a re-run can act on changed at the child's start; the measured
speed-up beside the predicted.

What a re-run can change from outside a script: intra-op threads (held against the script's own
`torch.set_num_threads` calls: the child wraps it), and the fp32 precision of matmuls and
convolutions (torch's public setters), always; DataLoader workers and pin_memory only when asked
(`--what-if-loader`): the child wraps `DataLoader.__init__` for that (for input-bound, workers;
for copy-bound with copies from pageable memory, pin_memory alone: a copy's non_blocking flag
and its bytes are the script's own code). The rule against
patching torch protects a learner's own process; the doctor's child is its lab, and the report
says what was changed there.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import json
import os

from .. import devices

# The environment variable that carries a change into the doctor's child (JSON).
ENV = "FTG_DOCTOR_WHAT_IF"
# What the child holds changed until it exits.
_HELD = contextlib.ExitStack()
# Findings whose fix a re-run can apply, and what a re-run of each changes.
LOADER_FINDINGS = {"input-bound"}
ALWAYS = {"oversubscribed-threads", "no-tensor-cores"}


def change_for(finding: dict, measured: dict, loader: bool) -> tuple[dict | None, str]:
    """(the change for the child, in words) for a finding; (None, why not) when a re-run from
    outside the script cannot apply its fix."""
    kind, cores = finding["kind"], max(1, int(measured.get("cores") or 1))
    if kind == "oversubscribed-threads":
        threads = max(1, cores - int(measured.get("workers") or 0))
        return {"threads": threads}, (
            f"torch.set_num_threads({threads}) at the script's start, and the script's own "
            "calls held at it (in the doctor's child only)"
        )
    if kind == "no-tensor-cores":
        return {"fp32_precision": "tf32"}, "fp32 matmuls and convolutions in TF32"
    if kind == "copy-bound":
        kinds = (measured.get("copies") or {}).get("kinds", [])
        if not any(k["memory"] == "pageable" and k["direction"] == "host->device" for k in kinds):
            return None, (
                "its fix is the script's own code (non_blocking=True, fewer bytes, data kept on "
                "the device): a re-run from outside cannot make it"
                if kinds
                else "the copies were not told apart here (CUDA only): no setting to try"
            )
        if not loader:
            return None, (
                "its first fix is the DataLoader's pin_memory: add --what-if-loader to let the "
                "doctor's child set it (the script's file is never changed)"
            )
        return {"loader": {"pin_memory": True}}, (
            "every DataLoader built with pin_memory=True (in the doctor's child only; copies "
            "made from tensors the script holds itself stay pageable)"
        )
    if kind in LOADER_FINDINGS:
        if not loader:
            return None, (
                "its fix is the DataLoader's settings: add --what-if-loader to let the doctor's "
                "child change them (the script's file is never changed)"
            )
        pin = measured.get("device") == "cuda"
        change = {"loader": {"num_workers": cores, "persistent_workers": True, "pin_memory": pin}}
        words = f"every DataLoader built with num_workers={cores}, persistent_workers=True" + (
            ", pin_memory=True" if pin else ""
        )
        return change, words + " (in the doctor's child only)"
    return None, (
        f"a {kind} fix changes the script's own code (batch size, model, loop): a re-run from "
        "outside cannot make it; doctor.watch in a notebook tries it on the loop itself"
    )


def predicted_speedup(finding: dict, measured: dict, change: dict) -> float | None:
    """The prediction the re-run is judged against: a what-if the doctor measured on the loop
    (the threads trial); for workers, the data wait shared by k workers beside the rest of the
    step (step / max(rest, wait / k): loading overlaps compute, and k workers load k batches at
    once); else none."""
    if finding.get("predicted_speedup"):
        return float(finding["predicted_speedup"])
    loader, step, wait = change.get("loader"), measured["step_s"], measured.get("wait_s")
    if loader and wait and loader.get("num_workers"):
        return step / max(step - wait, wait / loader["num_workers"])
    return None


def apply_in_child() -> str | None:
    """In the doctor's child, before the script runs: make the change `ENV` carries."""
    raw = os.environ.pop(ENV, None)
    if not raw:
        return None

    change = json.loads(raw)
    if "threads" in change:
        _threads_held_at(int(change["threads"]))
    if change.get("fp32_precision") == "tf32":  # for the rest of the child's life
        _HELD.enter_context(devices.fp32_precision("tf32"))
    if "loader" in change:
        _loaders_with(change["loader"])
    return raw


def _threads_held_at(threads: int) -> None:
    """Set the intra-op threads and hold them there: a script that calls
    `torch.set_num_threads` itself (most that oversubscribe do) would undo a change made only at
    its start, and the re-run would measure the loop unchanged."""
    import torch

    original = torch.set_num_threads
    original(threads)

    @functools.wraps(original)
    def held(_requested: int) -> None:
        original(threads)

    torch.set_num_threads = held  # the doctor's child only, for its --what-if


def _loaders_with(settings: dict) -> None:
    """Every DataLoader the script builds gets `settings` (workers only where it had none)."""
    from torch.utils.data import DataLoader

    original = DataLoader.__init__
    signature = inspect.signature(original)

    @functools.wraps(original)
    def init(self, *args, **kwargs):  # DataLoader's own signature
        bound = signature.bind(self, *args, **kwargs)
        bound.apply_defaults()
        arguments = bound.arguments
        if not arguments.get("num_workers"):
            arguments.update(settings)
        elif settings.get("pin_memory"):
            arguments["pin_memory"] = True
        original(*bound.args, **bound.kwargs)

    DataLoader.__init__ = init  # the doctor's child only, asked for by --what-if-loader


def compare(before: dict, after: dict, finding: dict, change: dict, words: str) -> dict:
    """The what-if's record: predicted and measured speed-up of the timed window's mean step
    (a throughput: with workers, batches arrive in bursts and the median step misleads)."""
    step_before, step_after = (r["measured"]["mean_step_s"] for r in (before, after))
    measured = step_before / step_after if step_after else None
    return {
        "finding": finding["kind"],
        "change": words,
        "predicted_speedup": predicted_speedup(finding, before["measured"], change),
        "measured_speedup": measured,
        "step_s_before": step_before,
        "step_s_after": step_after,
    }


def render(w: dict) -> str:
    predicted = w["predicted_speedup"]
    measured = w["measured_speedup"]
    head = f"What-if for {w['finding']}, re-run with {w['change']}: "
    if measured is None:
        return head + "the re-run gave no timing"
    said = f"predicted {predicted:.2f}x, " if predicted else "no prediction, "
    verdict = (
        "it helps"
        if measured > 1.02
        else "it does not help here: the step did not get faster (2 % or more)"
    )
    return (
        head + f"{said}measured {measured:.2f}x (mean step {1e3 * w['step_s_before']:.2f} -> "
        f"{1e3 * w['step_s_after']:.2f} ms): {verdict}"
    )

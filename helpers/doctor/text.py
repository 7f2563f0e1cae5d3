"""The diagnosis in words: the step and its split, the ranked findings, what was not seen."""

from __future__ import annotations

from .rules import Finding, Measured, inconclusive, verdict

MORE_STEPS = (
    "let the loop run more steps (the command line: a larger --steps and --timeout, or a smaller "
    "input so that each step is shorter; doctor.watch: a loop that does not stop early)"
)


def _share(f: Finding) -> str:
    return f"{100 * f.share:3.0f} %" if f.share is not None else "  n/a"


def render(m: Measured, findings: list[Finding], ranks: dict | None = None) -> str:
    """A few lines for a notebook cell's output or a terminal (`ranks`: --nproc's, each rank's
    step and time in collectives)."""
    rate = f", {m.samples_per_s:.0f} samples/s over the window" if m.samples_per_s else ""
    wait = (
        f"; waiting for data {1e3 * m.wait_s:.2f} ms, the rest {1e3 * (m.step_s - m.wait_s):.2f} ms"
        if m.wait_s is not None
        else ""
    )
    lines = [
        f"Doctor on {m.device}: step {1e3 * m.step_s:.2f} ms (median){rate}{wait}",
        f"  threads {m.threads} + DataLoader workers {m.workers} on {m.cores} usable cores"
        + (f"; loader {m.loader}" if m.loader else ""),
    ]
    if m.step_counting:
        lines.append(f"  {m.step_counting}")
    if m.hot_ops:
        lines.append("  hot ops: " + ", ".join(f"{h['op']} x{h['per_step']:g}" for h in m.hot_ops))
    if m.memory_peak:
        lines.append(
            f"  memory peak {m.memory_peak / 2**30:.2f} GiB of {m.memory_total / 2**30:.1f} GiB"
        )
    if m.memory_slope is not None:
        lines.append(
            f"  memory over {len(m.memory_samples)} steps: {m.memory_slope / 2**20:+.3f} MiB a "
            f"step (least squares; residual spread {(m.memory_spread or 0.0) / 2**20:.3f} MiB)"
        )
    if m.copies is not None:
        lines.append(_copies(m.copies))
    if ranks is not None:
        lines += _ranks(ranks)
    if inconclusive(m):
        lines += [
            f"INCONCLUSIVE: the loop took {m.steps} optimizer steps of the {m.steps_needed} the "
            "doctor's windows need; not measured: " + "; ".join(m.not_measured) + ".",
            "  No verdict rests on what was not measured, not even that the loop is fine. For a "
            f"diagnosis, {MORE_STEPS}.",
        ]
    else:
        v = verdict(m)  # the suite's one classifier, on the shares measured here
        lines.append(f"Verdict: {v.kind} ({v.rule})")
    lines.append("Findings, by share of step time:")
    if not findings:
        lines.append("  none from what was measured")
    for i, f in enumerate(findings, 1):
        lines.append(f"{i}. [{_share(f)}] {f.kind}: {f.evidence}")
        lines.append(f"     fix: {f.fix}  (notebook {f.notebook})")
        if f.predicted_speedup is not None:
            what = (
                f" -> {f.predicted_samples_per_s:.0f} samples/s"
                if f.predicted_samples_per_s
                else ""
            )
            lines.append(f"     measured what-if: {f.predicted_speedup:.2f}x{what}")
        lines.append(f"     rule: {f.rule}")
    for u in m.unseen:
        lines.append(f"  not seen here: {u}")
    return "\n".join(lines)


def _copies(c: dict) -> str:
    """The profiled window's copies between host and device, by kind (CUDA)."""
    kinds = ", ".join(
        f"{k['direction']} {k['memory']} {'blocking' if k['blocking'] else 'non-blocking'} "
        f"x{k['per_step']:g} ({1e3 * k['transfer_s']:.2f} ms on the device)"
        for k in c["kinds"]
    )
    return (
        f"  copies a step: {1e3 * c['exposed_s']:.2f} ms of the {1e3 * c['step_s']:.2f} ms "
        f"profiled step exposed, nothing computing beside them or the host held "
        f"({100 * c['share']:.0f} %)" + (f"; {kinds}" if kinds else "; none")
    )


def _ranks(ranks: dict) -> list[str]:
    """Each rank's median step and time in collectives (--nproc N)."""
    n = ranks["world_size"]
    if not ranks["process_group"]:
        head = (
            f"  {n} ranks, but the script never called torch.distributed.init_process_group: "
            "each rank ran the whole script alone, beside the others on this machine's cores; "
            "no collective, no straggler to look for. The lines above are rank 0's"
        )
    else:
        head = (
            f"  {n} ranks, each under the doctor with the same windows; the lines above and the "
            "findings are rank 0's, with the straggler from every rank's time in collectives"
        )
    lines = [head]
    if ranks["process_group"]:
        lines.append(
            "    in collectives: a gloo or NCCL collective in flight (the median of the profiled "
            "steps); DDP overlaps it with the backward pass alike on every rank, so the ranks' "
            "difference is waiting"
        )
    for r in ranks["per_rank"]:
        c = r["collective_s"]
        waits = (
            f", in collectives {1e3 * c:.2f} ms a step ({100 * r['collective_share']:.0f} %)"
            if c is not None
            else ""
        )
        lines.append(
            f"    rank {r['rank']}: step {1e3 * r['step_s']:.2f} ms (median){waits}; "
            f"verdict {r['verdict']}"
        )
    return lines

"""The capstone benchmark: d2l's ResNet-18 on Fashion-MNIST, reference loop vs fast recipe.

    python -m benchmarks.capstone            # `make bench`; CPU: a small subset, GPU: full size
    python -m benchmarks.capstone --help

Both recipes run side by side in one process on the same data (real Fashion-MNIST when it is
in data/, else the labelled synthetic stand-in). Every step of the waterfall is measured on
this machine; a step that cannot run here (CUDA graphs without a GPU, compilation in CPU mode)
is listed as skipped with the reason. The fraction of peak uses the training FLOPs per image
counted by torch.utils.flop_counter and the datasheet peak of helpers.flops (source printed).

Writes build/results/bench_capstone.{json,md}; on a GPU also results/reference/<date>_<gpu>/
(commit that folder: the report shows it beside a laptop's figures).
Needs only torch, torchvision, numpy, pandas, matplotlib, tqdm (no Jupyter, no d2l).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

from helpers import capstone, devices, flops, paths
from helpers.suite import results


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    gpu = torch.cuda.is_available()
    p = argparse.ArgumentParser(prog="python -m benchmarks.capstone", description=__doc__.split("\n")[0])
    p.add_argument("--device", default=None, help="cpu, cuda or cuda:N (default: first GPU, else CPU)")
    p.add_argument("--n-train", type=int, default=60000 if gpu else 4096, help="training images used")
    p.add_argument("--n-test", type=int, default=10000 if gpu else 2000, help="test images used")
    p.add_argument("--width", type=int, default=64 if gpu else 8,
                   help="ResNet-18 width (64 = d2l's; smaller for a quick CPU run)")
    p.add_argument("--batch", type=int, default=256 if gpu else 64,
                   help="reference batch size (d2l: 256; 64 on a CPU, so a small subset gets enough updates)")
    p.add_argument("--big-batch", type=int, default=1024 if gpu else 128, help="the fast recipe's batch size")
    p.add_argument("--lr", type=float, default=0.1, help="reference learning rate (d2l: 0.1)")
    p.add_argument("--epochs", type=int, default=capstone.MIN_STEADY_EPOCHS,
                   help="timed epochs per step, after one untimed warm-up epoch; the median counts "
                        f"(at least {capstone.MIN_STEADY_EPOCHS} with --compile)")
    p.add_argument("--busy-steps", type=int, default=capstone.BUSY_STEPS,
                   help="steady steps profiled for the busy %% column (0 = skip the profiler)")
    p.add_argument("--max-batches", type=int, default=None if gpu else 4,
                   help="batches per timed epoch (default: whole epochs on a GPU, 4 on a CPU)")
    p.add_argument("--accuracy-epochs", type=int, default=5 if gpu else 3,
                   help="epochs of the accuracy comparison (0 = skip it)")
    p.add_argument("--compile", action=argparse.BooleanOptionalAction, default=gpu,
                   help="measure the torch.compile steps (default on a GPU; ~90 s of compiling on a small CPU)")
    p.add_argument("--threads", type=int, default=None if gpu else 1,
                   help="torch CPU threads (CPU mode default 1: on a small shared CPU, intra-op "
                        "threads oversubscribe and timings swing several-fold)")
    p.add_argument("--reference-dir", default=None,
                   help="where a GPU run also writes its figures (default results/reference/<date>_<gpu>)")
    a = p.parse_args(argv)
    for name in ("n_train", "n_test", "width", "batch", "big_batch", "epochs"):
        if getattr(a, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    if a.accuracy_epochs < 0:
        p.error("--accuracy-epochs must be >= 0")
    if a.busy_steps < 0:
        p.error("--busy-steps must be >= 0")
    if a.compile and a.epochs < capstone.MIN_STEADY_EPOCHS:
        p.error(f"--epochs must be >= {capstone.MIN_STEADY_EPOCHS} with --compile: one timed epoch "
                "after compiling is one sample, not a median (or pass --no-compile)")
    return a


def table(rows: list[dict]) -> str:
    head = ["step", "kept", "s/epoch", "spread s", "samples/s", "x ref", "busy %", "% of peak", "note"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        def f(v, fmt):
            return "-" if v is None else format(v, fmt)
        lines.append("| " + " | ".join([
            r["step"], "yes" if r["kept"] else "no", f(r["seconds_per_epoch"], ".3f"),
            f(r.get("spread_s"), ".3f"),
            f(r["samples_per_s"], ".0f"), f(r["ratio"], ".2f"), f(r["busy_pct"], ".0f"),
            f(r["peak_pct"], ".1f") + (f" of {r['peak_precision']}" if r["peak_pct"] is not None else ""),
            r["note"]]) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    a = parse(argv)
    t_start = time.perf_counter()
    if a.threads:
        torch.set_num_threads(a.threads)
    dev = devices.as_device(a.device)
    name = devices.device_name(dev)
    print(f"Capstone benchmark on {name} ({dev}), torch {torch.__version__}")
    d = capstone.load_data(a.n_train, a.n_test)
    print(d.description)
    skip = {}
    if not a.compile:
        skip["torch.compile"] = "compilation not measured (--no-compile; ~90 s on a small CPU)"
        skip["+ CUDA graphs"] = "needs torch.compile (--compile) and a CUDA GPU"
    wf = capstone.run_waterfall(d, device=dev, width=a.width, batch_size=a.batch, lr=a.lr,
                                big_batch=a.big_batch, epochs=a.epochs, max_batches=a.max_batches,
                                busy_batches=a.busy_steps, skip=skip)
    net = capstone.build_net(a.width)
    per_image = flops.training_flops_per_sample(net, (1, 28, 28))
    ref_s = wf[0][1].seconds_per_epoch
    rows = []
    for recipe, r, kept in wf:
        prec = "bf16" if recipe.precision == "bf16" else "tf32"
        frac = (flops.fraction_of_peak(per_image * r.samples_per_s, name, prec)
                if r.samples_per_s else None)
        rows.append({
            "step": r.name, "kept": kept, "seconds_per_epoch": r.seconds_per_epoch,
            "spread_s": r.spread_s, "samples_per_s": r.samples_per_s,
            "ratio": ref_s / r.seconds_per_epoch if r.seconds_per_epoch else None,
            "busy_pct": 100 * r.busy_fraction if r.busy_fraction is not None else None,
            "peak_pct": 100 * frac if frac is not None else None,
            "peak_precision": prec,  # which dense peak peak_pct is a fraction of
            "note": r.skipped or r.note,
            # CUDA-graph bars: did graphs really replay (None: no graphs asked for)
            "cuda_graphs_used": r.extra.get("cuda_graphs_used"),
            "cudnn_benchmark": r.extra.get("cudnn_benchmark"),
        })
    fast = capstone.fast_recipe(wf)
    fast_row = next(row for row in reversed(rows) if row["kept"])
    md = [f"# Capstone benchmark: {name}", "",
          f"- date: {time.strftime('%Y-%m-%d %H:%M %Z')}; torch {torch.__version__}; device {dev}",
          f"- data: {d.description}",
          f"- model: d2l ResNet-18, width {a.width}; {per_image / 1e9:.3f} GFLOP per training image "
          "(torch.utils.flop_counter, forward + backward)",
          f"- timing: one untimed warm-up epoch, then the median of {a.epochs} timed epoch(s) per step; "
          "a step is kept when it beats the best so far by more than 2 % and the spread; "
          + (f"{a.max_batches} batches per timed epoch, scaled to {len(d.x_train)} images"
             if a.max_batches else "whole epochs"),
          f"- peak: {flops.PEAK_SOURCE}", "", table(rows), "",
          f"**fast recipe**: {fast_row['step']} stack, {fast_row['seconds_per_epoch']:.3f} s/epoch, "
          f"{fast_row['ratio']:.2f}x the reference"]
    if a.accuracy_epochs:
        ref_acc = capstone.train_for_accuracy(wf[0][0], d, device=dev, width=a.width, epochs=a.accuracy_epochs)
        fast_acc = capstone.train_for_accuracy(fast, d, device=dev, width=a.width, epochs=a.accuracy_epochs)
        diff = 100 * (fast_acc - ref_acc)
        md.append(f"\n**accuracy after {a.accuracy_epochs} epoch{'s' if a.accuracy_epochs != 1 else ''}**: reference {ref_acc:.4f}, "
                  f"fast {fast_acc:.4f} ({diff:+.2f} pp){' - SYNTHETIC data' if d.synthetic else ''}")
    else:
        ref_acc = fast_acc = None
        md.append("\naccuracy comparison not run (--accuracy-epochs 0)")
    md.append(f"\ntotal benchmark time {time.perf_counter() - t_start:.0f} s")
    text = "\n".join(md)
    print(text)

    targets = [paths.results_dir()]
    if dev.type == "cuda":
        targets.append(Path(a.reference_dir) if a.reference_dir else paths.reference_run_dir(name))
    for target in targets:
        rec = results.Recorder("bench_capstone", profile="bench", directory=target)
        rec.data_source("fashion-mnist", synthetic=d.synthetic, detail=d.description)
        for row in rows:
            if row["seconds_per_epoch"] is not None:
                rec.measure(f"bench: {row['step']} s/epoch", row["seconds_per_epoch"], "s",
                            ratio=row["ratio"], note="x reference", quiet=True,
                            kept=row["kept"], busy_pct=row["busy_pct"], peak_pct=row["peak_pct"],
                            peak_precision=row["peak_precision"],
                            samples_per_s=row["samples_per_s"], spread_s=row["spread_s"],
                            cuda_graphs_used=row["cuda_graphs_used"])
        if ref_acc is not None:
            rec.measure("bench: reference test accuracy", ref_acc, "", quiet=True)
            rec.measure("bench: fast recipe test accuracy", fast_acc, "", quiet=True)
        rec.data["bench_table"] = rows
        rec.data["bench_args"] = vars(a)
        rec.save()
        (target / "bench_capstone.md").write_text(text + "\n")
        print(f"written: {target / 'bench_capstone.md'}")
    if ref_acc is not None and fast_acc < ref_acc - 0.01:
        print(f"FAIL: the fast recipe lost accuracy: {diff:+.2f} pp against the reference (more than 1 pp)")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

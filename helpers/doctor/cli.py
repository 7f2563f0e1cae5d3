"""`python -m helpers.doctor [--steps N] [--timeout S] [--json] [--what-if [--what-if-loader]]
script.py [args...]`

The script runs unmodified in a child process of its own session, with the doctor's optimizer
hook; after the steps it needs the doctor stops it, and the whole process group (DataLoader
workers included) is ended, also on a timeout or a crash. Exit status: 0 when a diagnosis was
printed, 2 when the script failed or never stepped, 3 when it ran past --timeout, 4 when
inconclusive: the loop ended before the doctor's windows filled (the report says what it
measured, how many steps it saw of how many it needs, and how to get a diagnosis).

`--json` prints a report that follows helpers/doctor/report.schema.json (its version in
"schema"): {"schema", "inconclusive", "verdict": {kind, shares, rule}, "measured": {...},
"findings": [{kind, evidence, share, fix, notebook, predicted_speedup, predicted_samples_per_s,
rule}, ...], "what_if"}, findings ranked by share of step time (null share: counted, not costed),
or {"schema", "error"} with a non-zero status.

`python -m helpers.doctor compare BEFORE.json AFTER.json` compares two such reports of the same
loop, before and after a change: the step-time change with its noise band (the larger of the
two reports' step spreads and a 10 % run-to-run floor; inside it: "no measurable change"), the
findings that appeared or went away, and the shares that moved.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import runpy
import subprocess
import sys
import tempfile
import threading
import traceback
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psutil

from .. import processes
from . import rules, whatif

if TYPE_CHECKING:
    from .session import Session

MIN_STEPS = 12  # warm-up 2, timed >= 3 (+ margin), profiled 2, counted 2
# Steps of the memory window (memory over time; memory.MEMORY_STEPS, not imported here: the shell
# form starts without torch), watched when --steps leaves room for it beside MIN_STEPS.
MEMORY_WINDOW = 8
# Log lines of PyTorch's runtime, not of the script: Kineto's ("ERROR:2026-11-28 09:01:09
# 9239:9239 File.cpp:39] ...") and glog's or torch logging's ("W1128 10:41:32.766000 26419
# path/file.py:183] ..."). A script's own "ERROR: ..." line has neither shape and is kept.
RUNTIME_LOG = re.compile(
    r"^(?:[A-Z]+:\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \d+:\d+ \S+:\d+\]"
    r"|[IWEF]\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ \S+:\d+\])"
)
INCONCLUSIVE = 4  # the exit status when the loop ended before the windows filled
PROCESSES = (
    "the script started processes of its own ({}): the doctor watches only the process "
    "it started; a torchrun or mp.spawn worker's steps are not seen. Diagnose one "
    "process: run its training function in a plain script (one rank, world size 1)."
)


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m helpers.doctor",
        description=__doc__.split("\n\n")[1],
        epilog=" ".join(__doc__.split("\n\n")[3].split()),
    )
    p.add_argument(
        "--steps",
        type=int,
        default=40,
        help=f"optimizer steps to watch (>= {MIN_STEPS}; memory over time from "
        f"{MIN_STEPS + MEMORY_WINDOW})",
    )
    p.add_argument(
        "--timeout", type=float, default=300.0, help="seconds before the script is ended"
    )
    p.add_argument(
        "--json",
        action="store_true",
        help="the diagnosis as JSON on stdout (the script's own output: on stderr)",
    )
    p.add_argument(
        "--what-if",
        action="store_true",
        help="re-run the script, unmodified, for the same steps with the setting of the top "
        "finding a re-run can act on changed (threads, fp32 precision) and print the measured "
        "speed-up beside the predicted",
    )
    p.add_argument(
        "--what-if-loader",
        action="store_true",
        help="with --what-if: the doctor's child may also change DataLoader workers and "
        "pin_memory (it wraps DataLoader in its own process, never in yours)",
    )
    p.add_argument("script", help="the training script, run unmodified")
    p.add_argument("args", nargs=argparse.REMAINDER, help="the script's own arguments")
    a = p.parse_args(argv)
    a.what_if = a.what_if or a.what_if_loader  # asking for the loader's what-if asks for one
    if a.steps < MIN_STEPS:
        p.error(f"--steps must be an int >= {MIN_STEPS}, got {a.steps}")
    if not a.timeout > 0:
        p.error(f"--timeout must be a positive number of seconds, got {a.timeout}")
    if not Path(a.script).is_file():
        p.error(f"script: no such file: {a.script}")
    return a


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["compare"]:  # the subcommand: two reports, no script run
        from .compare import main as compare

        return compare(args[1:])
    a = parse(argv)
    # With --json, stdout is the JSON alone: the script's own output goes to stderr.
    result = _diagnose(a, sys.stderr if a.json else None)
    if a.what_if and "text" in result:
        result["what_if"] = _what_if(a, result, sys.stderr if a.json else None)
        result["text"] += "\n" + result["what_if"]["text"]
    hidden = result.pop("log_lines_hidden", 0) + result.get("what_if", {}).pop(
        "log_lines_hidden", 0
    )
    if hidden and "text" in result:
        result["text"] += (
            f"\n  {hidden} log line{'s' * (hidden != 1)} of PyTorch's runtime (profiler, C++ "
            "logging) hidden; the script's own output is above the report"
        )
    if a.json:
        report = {k: v for k, v in result.items() if k not in ("text", "status")}
        print(json.dumps({"schema": rules.SCHEMA, **report}, indent=1))
    else:
        print(
            result.get("text") or f"doctor: could not diagnose: {result['error']}",
            file=sys.stdout if "text" in result else sys.stderr,
        )
    return result.get("status", 0 if "text" in result else 2)


def _diagnose(a: argparse.Namespace, stdout: Any, change: dict | None = None) -> dict:
    """One run of the script under the doctor (with `change` made at the child's start)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "diagnosis.json"
        cmd = [sys.executable, "-m", "helpers.doctor.cli", "--child", str(out), str(a.steps)]
        env = {whatif.ENV: json.dumps(change)} if change else {}
        with processes.subreaper():  # a worker orphaned by the script stays ours to end
            return _run_child([*cmd, a.script, *a.args], out, a.timeout, stdout, env)


def _what_if(a: argparse.Namespace, result: dict, stdout: Any) -> dict:
    """The top finding a re-run can act on, re-run with its change: measured beside predicted."""
    findings = [f for f in result["findings"] if f["kind"] not in rules.DEVICE_BOUND]
    if not findings:
        return {"text": "What-if: no finding to try (nothing measured points at a setting)"}
    skipped = []  # findings above the one re-run, each with why a re-run cannot try its fix
    for top in findings:
        change, words = whatif.change_for(top, result["measured"], a.what_if_loader)
        if change is not None:
            break
        skipped.append(f"What-if for {top['kind']}: not run: {words}")
    if change is None:
        return {"finding": findings[0]["kind"], "text": skipped[0]}
    after = _diagnose(a, stdout, change)
    if "measured" not in after:
        why = after.get("error", "no diagnosis")
        return {"finding": top["kind"], "change": words, "text": f"What-if: re-run failed: {why}"}
    record = whatif.compare(result, after, top, change, words)
    hidden = after.get("log_lines_hidden", 0)
    text = "\n".join([*skipped, whatif.render(record)])
    return {**record, "text": text, "log_lines_hidden": hidden}


def _run_child(
    cmd: list[str], out: Path, timeout: float, stdout: Any, env_extra: dict | None = None
) -> dict:
    """Run the doctor's child on the script; its result, or why there is none. The child, its
    workers and anything it started end with it (the suite's one way to end a process tree)."""
    before = processes.descendants()
    # no profiler log lines before the report
    env = {**processes.QUIET_PROFILER, **os.environ, **(env_extra or {})}
    child = subprocess.Popen(
        cmd, start_new_session=True, stdout=stdout, stderr=subprocess.PIPE, env=env, text=True
    )
    hidden: list[str] = []
    relay = threading.Thread(target=_relay_stderr, args=(child.stderr, hidden), daemon=True)
    relay.start()
    try:
        child.wait(timeout=timeout)
        relay.join(timeout=5)
        if out.is_file():
            return {**json.loads(out.read_text()), "log_lines_hidden": len(hidden)}
        sys.stderr.writelines(hidden)  # no diagnosis: the runtime's lines may say why
        return {
            "error": f"the script's process ended (status {child.returncode}) before a diagnosis"
        }
    except subprocess.TimeoutExpired:
        sys.stderr.writelines(hidden)  # no diagnosis: the runtime's lines may say why
        return {
            "error": f"the script ran past --timeout {timeout:g} s before the doctor had "
            "seen enough steps; it was ended",
            "status": 3,
        }
    finally:
        processes.end_tree(processes.started_since(before), grace=5.0)
        child.wait()


def _relay_stderr(stream: Any, hidden: list[str]) -> None:
    """The child's stderr to ours, line by line, but PyTorch's runtime log lines: kept back."""
    for line in stream:
        if RUNTIME_LOG.match(line):
            hidden.append(line)
        else:
            sys.stderr.write(line)
            sys.stderr.flush()


def _watch_children(seen: set[str], stop: threading.Event) -> None:
    me = psutil.Process()
    while not stop.wait(0.2):
        for c in me.children(recursive=True):
            try:
                seen.add(" ".join(c.cmdline()[:3]))
            except psutil.Error:
                pass


def child(out: Path, steps: int, script: str, args: list[str]) -> None:
    """Run `script` under the doctor's hook and write the diagnosis (or the reason) to `out`."""
    from .session import Session, Stop  # torch: only in the script's process

    whatif.apply_in_child()  # --what-if's change, before the script builds anything

    # --steps bounds the run: windows counted in steps only (the notebook form also asks for
    # time); the threads what-if times as many steps as the timed window (equal work); the
    # memory window comes out of the steps first, where they leave room for it
    memory = MEMORY_WINDOW if steps >= MIN_STEPS + MEMORY_WINDOW else 0
    session = Session(
        timed=max(3, (steps - 8 - memory) // 2),
        memory=memory,
        trial_steps=None,
        seconds=0.0,
        workers=None,  # counted at the first step: the loader is not in hand
        on_done=_stop,
        trials=lambda s: _threads_trial(s, steps),
    )
    seen: set[str] = set()
    stop = threading.Event()
    threading.Thread(target=_watch_children, args=(seen, stop), daemon=True).start()
    sys.argv = [script, *args]
    sys.path.insert(0, str(Path(script).resolve().parent))
    error = None
    try:
        session.start()
        runpy.run_path(script, run_name="__main__")
    except Stop:
        pass
    except SystemExit as e:
        if e.code not in (None, 0):
            error = f"the script exited with status {e.code}"
    except BaseException as e:  # the learner's script may raise anything
        traceback.print_exc()
        error = f"the script failed: {type(e).__name__}: {e}"
    finally:
        session.close()
        stop.set()
    out.write_text(json.dumps(_result(session, error, seen)))


def _result(session: Session, error: str | None, seen: set[str]) -> dict:
    from .text import MORE_STEPS, render

    if session.steps == 0 and error is None:
        error = (
            "no optimizer step seen: the doctor counts steps of a torch.optim optimizer "
            "(optimizer.step()), and the script took none"
        )
        if seen:
            error += ". " + PROCESSES.format("; ".join(sorted(seen)[:3]))
    if error is None or session.named("timed") is not None:
        try:
            m = session.measured()
        except RuntimeError as e:  # the loop ended before even the timed window filled
            if error is not None:
                return {"error": error}
            return {
                "error": f"inconclusive: {e}; {MORE_STEPS}",
                "inconclusive": True,
                "status": INCONCLUSIVE,
            }
        m.unseen.append(
            "DataLoader settings: from outside a script the loader is not in hand (workers are "
            "counted as child processes); --what-if-loader re-runs the script with workers"
        )
        if error:
            m.unseen.append(f"the script stopped early: {error}")
        findings = rules.findings(m)
        status = INCONCLUSIVE if rules.inconclusive(m) else 0
        return {**rules.as_dict(m, findings), "text": render(m, findings), "status": status}
    return {"error": error}


def _stop() -> None:
    from .session import Stop

    raise Stop


def _threads_trial(s: Session, steps: int) -> list:
    """The one what-if a script allows from outside: the steps with a fair number of threads
    (when --steps leaves room for its warm-up and timed steps)."""
    import torch

    m = s.measured()
    if not rules.oversubscribed(m) or s.steps + 2 + s.trial_length + s.memory_steps > steps:
        return []
    before = torch.get_num_threads()
    return s.trial(
        "threads",
        lambda: torch.set_num_threads(m.fair_threads()),
        lambda: torch.set_num_threads(before),
        None,
    )


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        child(Path(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5:])
    else:
        sys.exit(main())

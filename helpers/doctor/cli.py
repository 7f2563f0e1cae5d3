"""`python -m helpers.doctor [--steps N] [--timeout S] [--json] [--what-if [--what-if-loader]]
[--nproc N] script.py [args...]`

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

`--nproc N` starts N ranks of the script as torchrun does (RANK, LOCAL_RANK, WORLD_SIZE,
LOCAL_WORLD_SIZE, MASTER_ADDR=127.0.0.1, MASTER_PORT), each under a doctor child of its own
with the same windows, so that all stop at the same step; a script's
`dist.init_process_group(backend)` meets through a file, never a store listening on the
network. The report adds each rank's step, its time in collectives, and the straggler
("ranks").

`python -m helpers.doctor compare BEFORE.json AFTER.json` compares two such reports of the same
loop, before and after a change: the step-time change with its noise band (the larger of the
two reports' step spreads and a 10 % run-to-run floor; inside it: "no measurable change"), the
findings that appeared or went away, and the shares that moved.
"""

from __future__ import annotations

import argparse
import functools
import inspect
import json
import os
import re
import runpy
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psutil

from .. import launch, processes
from . import rules, whatif

if TYPE_CHECKING:
    from .session import Session

MIN_STEPS = 12  # warm-up 2, timed >= 3 (+ margin), profiled 2, counted 2
# Steps of the memory window (memory over time; memory.MEMORY_STEPS, not imported here: the shell
# form starts without torch), watched when --steps leaves room for it beside MIN_STEPS.
MEMORY_WINDOW = 8
# Log lines of PyTorch's runtime, not of the script: Kineto's ("ERROR:2026-11-28 09:01:09
# 9239:9239 File.cpp:39] ...") and glog's or torch logging's ("W1128 10:41:32.766000 26419
# path/file.py:183] ...", in a process group "[rank0]:" first). A script's own "ERROR: ..." line
# has neither shape and is kept.
RUNTIME_LOG = re.compile(
    r"^(?:[A-Z]+:\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \d+:\d+ \S+:\d+\]"
    r"|(?:\[rank\d+\]:)?[IWEF]\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ \S+:\d+\])"
)
INCONCLUSIVE = 4  # the exit status when the loop ended before the windows filled
PROCESSES = (
    "the script started processes of its own ({}): the doctor watches only the process "
    "it started; a torchrun or mp.spawn worker's steps are not seen. Diagnose one "
    "process: run its training function in a plain script (one rank, world size 1), or "
    "let the doctor start the ranks: python -m helpers.doctor --nproc N script.py."
)
# The environment variable that tells a doctor child it is one of --nproc's ranks (JSON: the
# rendezvous file's URI and the run's folder, where rank 0 leaves the machine's rates).
RANKS = "FTG_DOCTOR_RANKS"
# How long a rank waits for rank 0's measurement of the machine's rates before its own.
RATES_WAIT_S = 60.0


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
    p.add_argument(
        "--nproc",
        type=int,
        default=1,
        help="ranks to start, as torchrun --nproc-per-node does (each under the doctor, the "
        "same windows); the report adds each rank's time in collectives and the straggler",
    )
    p.add_argument("script", help="the training script, run unmodified")
    p.add_argument("args", nargs=argparse.REMAINDER, help="the script's own arguments")
    a = p.parse_args(argv)
    a.what_if = a.what_if or a.what_if_loader  # asking for the loader's what-if asks for one
    if a.steps < MIN_STEPS:
        p.error(f"--steps must be an int >= {MIN_STEPS}, got {a.steps}")
    if not a.timeout > 0:
        p.error(f"--timeout must be a positive number of seconds, got {a.timeout}")
    if a.nproc < 1:
        p.error(f"--nproc must be an int >= 1, got {a.nproc}")
    if a.nproc > 1 and a.what_if:
        p.error("--what-if re-runs one process: not with --nproc > 1")
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
    if a.nproc == 1:  # --what-if-loader: the first run also measures what workers would cost
        result = _diagnose(a, sys.stderr if a.json else None, price=a.what_if_loader)
    else:
        result = _diagnose_ranks(a, sys.stderr if a.json else None)
    pricing = result.pop("pricing", None)  # the what-if's, not the report's
    if a.what_if and "text" in result:
        result["what_if"] = _what_if(a, result, sys.stderr if a.json else None, pricing)
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


def _diagnose(
    a: argparse.Namespace, stdout: Any, change: dict | None = None, price: bool = False
) -> dict:
    """One run of the script under the doctor (with `change` made at the child's start;
    `price`: the child also measures what DataLoader workers would cost, its "pricing")."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "diagnosis.json"
        cmd = [sys.executable, "-m", "helpers.doctor.cli", "--child", str(out), str(a.steps)]
        env = {whatif.ENV: json.dumps(change)} if change else {}
        if price:
            env[whatif.PRICE_ENV] = "1"
        with processes.subreaper():  # a worker orphaned by the script stays ours to end
            return _run_child([*cmd, a.script, *a.args], out, a.timeout, stdout, env)


def _what_if(a: argparse.Namespace, result: dict, stdout: Any, pricing: dict | None = None) -> dict:
    """The top finding a re-run can act on, re-run with its change: measured beside predicted
    (the prediction made from the first run alone: its report and `pricing`)."""
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
    record = whatif.compare(result, after, top, change, words, pricing)
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
        return {"error": _timeout_error(timeout), "status": 3}
    finally:
        processes.end_tree(processes.started_since(before), grace=5.0)
        child.wait()


def _timeout_error(timeout: float) -> str:
    return (
        f"the script ran past --timeout {timeout:g} s before the doctor had seen enough steps; "
        "it was ended"
    )


def _relay_stderr(stream: Any, hidden: list[str], to: Any = None, prefix: str = "") -> None:
    """The child's stderr to ours (or to `to`), line by line, but PyTorch's runtime log lines:
    kept back."""
    to = to or sys.stderr
    for line in stream:
        if RUNTIME_LOG.match(line):
            hidden.append(line)
        else:
            to.write(prefix + line)
            to.flush()


# --- --nproc N: N ranks, each under a doctor child ------------------------------------------
def _diagnose_ranks(a: argparse.Namespace, stdout: Any) -> dict:
    """N ranks of the script, each under the doctor; one report with each rank's numbers."""
    with tempfile.TemporaryDirectory() as tmp, processes.subreaper():
        folder = Path(tmp)
        env = _ranks_env(folder, a.nproc)
        outs = [folder / f"diagnosis{r}.json" for r in range(a.nproc)]
        cmds = [
            [sys.executable, "-m", "helpers.doctor.cli", "--child", str(out), str(a.steps)]
            + [a.script, *a.args]
            for out in outs
        ]
        envs = [{**env, "RANK": str(r), "LOCAL_RANK": str(r)} for r in range(a.nproc)]
        return _combine_ranks(_run_ranks(cmds, outs, envs, a.timeout, stdout), a.timeout)


def _ranks_env(folder: Path, nproc: int) -> dict[str, str]:
    """torchrun's variables, launch.py's loopback for gloo/NCCL and its rendezvous file, and
    the doctor's note of it; torchrun's one OpenMP thread a rank unless the caller set some."""
    threads = os.environ.get("OMP_NUM_THREADS", "1")
    with socket.socket() as s:  # a free port for MASTER_PORT (nothing listens on it here)
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = launch._ranks_env(folder, nproc, int(threads) if threads.isdigit() else 1)
    ranks = {"init_method": env["INIT_METHOD"], "folder": str(folder)}
    return {
        **processes.QUIET_PROFILER,
        **env,
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        RANKS: json.dumps(ranks),
    }


def _run_ranks(
    cmds: list[list[str]], outs: list[Path], envs: list[dict], timeout: float, stdout: Any
) -> dict:
    """Run the ranks' doctor children until each has its diagnosis, one fails (its peers would
    wait in their next collective: all end then) or --timeout; every tree ends, Ctrl-C too.
    {"results": each rank's result or None, "failed": the rank that failed first, "hidden":
    the runtime's log lines kept back, "timed_out"}."""
    before = processes.descendants()
    procs, hidden = [], []
    failed, timed_out, deadline = None, False, time.monotonic() + timeout
    try:
        for r, (cmd, env) in enumerate(zip(cmds, envs, strict=True)):
            p = subprocess.Popen(
                cmd,
                start_new_session=True,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=env,
                text=True,
            )
            procs.append(p)
            for stream, to in ((p.stdout, stdout or sys.stdout), (p.stderr, sys.stderr)):
                args = (stream, hidden, to, f"[rank {r}] ")
                threading.Thread(target=_relay_stderr, args=args, daemon=True).start()
        while True:
            ended = [p.poll() for p in procs]  # before the files: a result is written first
            results = [json.loads(o.read_text()) if o.is_file() else None for o in outs]
            bad = [
                r
                for r, (res, code) in enumerate(zip(results, ended, strict=True))
                if (res is None and code is not None) or (res is not None and "measured" not in res)
            ]
            if bad:  # the first to fail is the cause: its peers fail after it
                failed = min(bad, key=lambda r: outs[r].stat().st_mtime if results[r] else 0.0)
                break
            if all(res is not None for res in results):
                break
            if time.monotonic() > deadline:
                timed_out = True
                break
            time.sleep(0.1)
    finally:
        processes.end_tree(processes.started_since(before), grace=5.0)
        for p in procs:
            p.wait()
    if failed is not None and results[failed] is None:
        results[failed] = {
            "error": f"the script's process ended (status {ended[failed]}) before a diagnosis"
        }
    return {"results": results, "failed": failed, "hidden": hidden, "timed_out": timed_out}


def _combine_ranks(run: dict, timeout: float) -> dict:
    """The ranks' results as one: rank 0's diagnosis, each rank's step and time in
    collectives, and the straggler; or the first failure, named by its rank."""
    from .text import render

    results, hidden = run["results"], run["hidden"]
    if run["timed_out"] or run["failed"] is not None:
        sys.stderr.writelines(hidden)  # no diagnosis: the runtime's lines may say why
    if run["timed_out"]:
        return {"error": _timeout_error(timeout), "status": 3}
    if run["failed"] is not None:
        r = run["failed"]
        failure = {k: v for k, v in results[r].items() if k in ("inconclusive", "status")}
        return {**failure, "error": f"rank {r}: {results[r]['error']}"}
    per_rank = []
    for r, res in enumerate(results):
        m = res["measured"]
        c = m.get("collective_s")
        per_rank.append(
            {
                "rank": r,
                "step_s": m["step_s"],
                "step_spread_s": m.get("step_spread_s"),
                "collective_s": c,
                "collective_spread_s": m.get("collective_spread_s"),
                "collective_share": None if c is None else min(1.0, c / m["step_s"]),
                "verdict": res["verdict"]["kind"],
                "findings": [f["kind"] for f in res["findings"]],
            }
        )
    m = rules.measured_from(results[0]["measured"])
    found = [rules.Finding(**f) for f in results[0]["findings"]]
    straggler = rules.straggler(per_rank)
    if straggler is not None:
        found = rules.ranked([*found, rules.straggler_finding(straggler)])
    ranks = {
        "world_size": len(results),
        "process_group": all(res["rank"]["process_group"] for res in results),
        "per_rank": per_rank,
        "straggler": straggler,
    }
    status = max(res.get("status", 0) for res in results)  # 4: a rank's windows did not fill
    return {
        **rules.as_dict(m, found),
        "ranks": ranks,
        "text": render(m, found, ranks),
        "status": status,
        "log_lines_hidden": len(hidden),
    }


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
    from .session import Stop  # torch: only in the script's process

    whatif.apply_in_child()  # --what-if's change, before the script builds anything
    ranks = json.loads(os.environ.pop(RANKS, "null"))  # one of --nproc's ranks
    joined: list[bool] = []
    if ranks:
        _join_through_file(ranks["init_method"], joined)
    data_parallel_seen: list[bool] = []
    clock = whatif.CpuClock() if os.environ.pop(whatif.PRICE_ENV, None) else None
    priced: list[dict] = []

    def done() -> None:  # the windows are done: the script's objects are all alive now
        data_parallel_seen.append(_data_parallel_alive())
        if clock is not None:  # --what-if-loader: what workers would cost, its loader in hand
            priced.append(whatif.measure_price(clock))
        _stop()

    session = _session(steps, bool(ranks), done)
    if clock is not None:  # the timed window's CPU use: the main process's, and the others'
        timed = session.named_window("timed")
        timed.enter, timed.exit = clock.start, clock.stop
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
    # else the loop ended before the windows did: what the script left alive
    data_parallel = data_parallel_seen[0] if data_parallel_seen else _data_parallel_alive()
    if not ranks:
        result = _result(session, error, seen, data_parallel)
        if priced and "measured" in result:
            result["pricing"] = priced[0]
        _write(out, result)
        return
    rank, rates = int(os.environ["RANK"]), Path(ranks["folder"]) / "rates.json"
    result = {"error": error}  # a failed rank fails the job: its peers wait for it in vain
    if error is None:
        result = _rank_result(session, rank, rates, seen, data_parallel)
    _write(out, {**result, "rank": {"rank": rank, "process_group": bool(joined)}})


def _rank_result(
    session: Session, rank: int, rates: Path, seen: set[str], data_parallel: bool
) -> dict:
    """A rank's diagnosis: rank 0 measures the machine's rates, once, while the others wait
    for them (N ranks measuring at once would each measure a machine the others keep busy)."""
    if rank != 0:
        _await_rates(session, rates)
    result = _result(session, None, seen, data_parallel)
    if rank == 0:
        _write(rates, session.rates)
    return result


def _session(steps: int, rank: bool, done: Callable[[], None]) -> Session:
    """The child's session. --steps bounds the run: windows counted in steps only (the notebook
    form also asks for time); the threads what-if times as many steps as the timed window (equal
    work); the memory window comes out of the steps first, where they leave room for it. A rank
    runs no what-if (its trial would stop it at another step than its peers, who would then
    wait for it in their next collective), and profiles as many steps as it times (its wait in
    collectives: their median)."""
    from .session import Session

    memory = MEMORY_WINDOW if steps >= MIN_STEPS + MEMORY_WINDOW else 0
    timed = max(3, (steps - 8 - memory) // 2)
    return Session(
        timed=timed,
        profiled=timed if rank else 2,
        memory=memory,
        trial_steps=None,
        seconds=0.0,
        workers=None,  # counted at the first step: the loader is not in hand
        on_done=done,
        trials=None if rank else lambda s: _threads_trial(s, steps),
    )


def _write(path: Path, value: object) -> None:
    """`value` as JSON, whole or not at all: another process polls for the file."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(value))
    os.replace(tmp, path)


def _join_through_file(init_method: str, joined: list[bool]) -> None:
    """A rank's `torch.distributed.init_process_group` with neither an init_method nor a store
    meets its peers through the rendezvous file `init_method` (its rank and world size from
    torchrun's variables, as env:// reads them); an init_method the script passes is kept."""
    import torch.distributed as dist

    if not dist.is_available():
        return
    original = dist.init_process_group
    signature = inspect.signature(original)

    @functools.wraps(original)
    def init(*args: Any, **kwargs: Any) -> Any:  # init_process_group's own signature
        bound = signature.bind(*args, **kwargs)
        given = bound.arguments
        if given.get("init_method") is None and given.get("store") is None:
            # env:// would start a TCPStore, which listens on every interface: a file instead
            given["init_method"] = init_method
            for name, var in (("rank", "RANK"), ("world_size", "WORLD_SIZE")):
                if given.get(name, -1) == -1:  # file:// needs both
                    given[name] = int(os.environ[var])
        joined.append(True)
        return original(*bound.args, **bound.kwargs)

    dist.init_process_group = init  # the doctor's child only, one of --nproc's ranks


def _data_parallel_alive() -> bool:
    """Whether the script holds a torch.nn.DataParallel: looked for among the objects the
    garbage collector tracks (modules are), once, after the windows, so no constructor of
    torch's is wrapped and no step is slowed."""
    import gc

    from torch import nn

    return any(issubclass(type(o), nn.DataParallel) for o in gc.get_objects())


def _await_rates(session: Session, path: Path) -> None:
    """Rank 0's measurement of the machine's rates, where it comes within RATES_WAIT_S (else
    the rank measures them itself)."""
    deadline = time.monotonic() + RATES_WAIT_S
    while not path.is_file() and time.monotonic() < deadline:
        time.sleep(0.05)
    rates = json.loads(path.read_text()) if path.is_file() else None
    if rates:
        session.rates = tuple(rates)


def _result(
    session: Session, error: str | None, seen: set[str], data_parallel: bool = False
) -> dict:
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
        m.data_parallel = data_parallel
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

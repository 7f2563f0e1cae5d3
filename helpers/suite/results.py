"""Record a notebook's measurements and claim verdicts as data the report collects.

    record = Recorder("02_data_loading", profile=profile)
    record.measure("batch bytes, float32", 12.5, "MB")
    record.measure("batch bytes, uint8", 3.1, "MB", ratio=4.0, note="float32 / uint8")
    record.judge("L3", figure="uint8 copies 2.5x faster", copy_gain=2.5)
    record.figure(fig, "batch_memory")

Every call rewrites `build/results/<notebook>.json`: a notebook stopped half-way keeps what it
measured.
"""

from __future__ import annotations

import json
import math
import re
import time
import warnings
from pathlib import Path
from typing import Any

from .. import paths
from ..profiles import PROFILES, Profile
from .claims import DECIDED, RULES, judge, kind_of, window_text


class Recorder:
    def __init__(
        self,
        notebook: str,
        profile: Profile | str | None = None,
        directory: str | Path | None = None,
    ) -> None:
        if not isinstance(notebook, str) or not re.fullmatch(r"[A-Za-z0-9][\w.-]*", notebook):
            raise ValueError(
                "Recorder: notebook must be a non-empty file name like '02_data_loading' "
                f"(letters, digits, _ . -; no folders); got {notebook!r}"
            )
        if not (
            profile is None or isinstance(profile, Profile) or isinstance(profile, str) and profile
        ):
            raise TypeError(
                f"Recorder: profile must be a Profile, a profile name such as "
                f"{' or '.join(repr(p) for p in PROFILES)}, or None; got {profile!r}"
            )
        from .. import devices  # torch: for a notebook that records, not for the runner or report

        self.notebook = notebook
        self.directory = Path(directory) if directory is not None else paths.results_dir()
        self.path = self.directory / f"{notebook}.json"
        self.data: dict[str, Any] = {
            "notebook": notebook,
            "profile": profile.name if isinstance(profile, Profile) else profile,
            "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "hardware": devices.hardware_summary(),
            "data_sources": {},
            "measurements": [],
            "verdicts": [],
            "figures": [],
        }
        self.save()

    def data_source(self, dataset: str, *, synthetic: bool, detail: str = "") -> None:
        """Say which data the numbers come from; synthetic data is labelled in the report."""
        if not isinstance(dataset, str) or not dataset:
            raise ValueError(
                f"data_source: dataset must be a non-empty name like 'cifar10', got {dataset!r}"
            )
        self.data["data_sources"][dataset] = {"synthetic": bool(synthetic), "detail": detail}
        self.save()

    def measure(
        self,
        name: str,
        value: float,
        unit: str,
        *,
        ratio: float | None = None,
        note: str = "",
        quiet: bool = False,
        **extra: Any,
    ) -> None:
        """Record one figure (and optionally its ratio to a baseline). Returns nothing, so a cell
        ending with it shows the printed line only, not the number a second time as `Out[]`."""
        if not isinstance(name, str) or not name:
            raise ValueError("measure: name must be a non-empty string")
        if not isinstance(unit, str):
            raise ValueError(
                f"measure: unit must be a string such as 's' or 'samples/s', got {unit!r}"
            )
        value = _number(f"value for {name!r}", value)
        if math.isnan(value) or math.isinf(value):
            fix = "record a finite figure (a zero time? measure more repeats)"
            what = "NaN" if math.isnan(value) else f"infinite ({value}); {fix}"
            raise ValueError(f"measure: value for {name!r} is {what}")
        ratio = None if ratio is None else _number(f"ratio for {name!r}", ratio, " or None")
        for k, v in {"ratio": ratio, **extra}.items():
            if isinstance(v, float) and not math.isfinite(v):
                raise ValueError(f"measure: {k} for {name!r} must be finite, got {v}")
        entry = {"name": name, "value": value, "unit": unit, "ratio": ratio, "note": note, **extra}
        self.data["measurements"] = [m for m in self.data["measurements"] if m["name"] != name] + [
            entry
        ]
        self.save()
        if not quiet:
            r = f"  ({ratio:.2f}x {note})" if ratio is not None else (f"  ({note})" if note else "")
            print(f"[measured] {name}: {value:.4g} {unit}{r}")

    def judge(
        self, claim: str, *, figure: str, detail: str = "", timing: Any = None, **measured: Any
    ) -> str:
        """The outcome of `claim`'s rule (`claims.judge`) on the `measured` quantities, recorded and
        printed with the rule in plain words and its thresholds beside the figure behind it.
        `timing`: the `timing.Ratio` (a tuple: one per `Rule.timed`) a timed quantity came from,
        so a window too short or a range across a threshold gives "inconclusive"."""
        if not isinstance(figure, str) or not figure:
            raise ValueError(
                f"judge {claim}: figure must be the measured figure behind it, got {figure!r}"
            )
        verdict, r = judge(claim, timing, **measured), RULES[claim]
        timed = _timed(r.timed, timing)
        synthetic = any(s["synthetic"] for s in self.data["data_sources"].values())
        entry = {
            "claim": claim,
            "verdict": verdict,
            "figure": figure,
            "detail": detail,
            "kind": r.kind,
            "synthetic_data": synthetic,
            "rule": r.threshold,
            "measured": measured,
            "timing": timed,
        }
        self.data["verdicts"] = [v for v in self.data["verdicts"] if v["claim"] != claim] + [entry]
        self.save()
        kind = kind_of(verdict)
        label = (
            "verdict"
            if kind in DECIDED
            else "mechanism"
            if kind.startswith("mechanism")
            else "not decided here"
        )
        print(
            f"[{label}] {claim} - {verdict}: {figure}"
            + (" [synthetic data]" if synthetic else "")
            + (
                "\n  fixed by PyTorch's design: demonstrated, not tested"
                if label == "mechanism"
                else ""
            )
            + f"\n  rule: {r.threshold}\n  the other way: {r.other_way}\n  measured: "
            + ", ".join(f"{k} = {_fmt(v)}" for k, v in measured.items())
            + "".join(
                f"\n  timed: {k} from {t['low']:.3g} to {t['high']:.3g} over the repeats, "
                f"shortest window {window_text(t['window_s'])} "
                f"({t['device'] or 'device not named'})"
                for k, t in timed.items()
            )
        )
        return verdict

    def figure(self, fig: Any, name: str) -> None:
        """Save a matplotlib figure next to the results, for the HTML report. Returns nothing, so
        a cell ending with it shows the figure and no `Out[]` line with a file path."""
        if not callable(getattr(fig, "savefig", None)):
            raise TypeError(f"figure: fig must be a matplotlib Figure, got {type(fig).__name__}")
        if not isinstance(name, str) or not re.fullmatch(r"[\w.-]+", name):
            raise ValueError(
                f"figure: name must be a short file name (letters, digits, _ . -), got {name!r}"
            )
        # relative: the report finds it beside the results
        rel = f"figures/{self.notebook}__{name}.png"
        (self.directory / "figures").mkdir(parents=True, exist_ok=True)
        fig.savefig(self.directory / rel, dpi=90, bbox_inches="tight")
        if rel not in self.data["figures"]:
            self.data["figures"].append(rel)
        self.save()

    def save(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        self.data["updated"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        # standard JSON only (no NaN/Infinity), written under a temporary name then renamed
        paths.write_atomic(self.path, json.dumps(self.data, indent=1, default=str, allow_nan=False))


def _timed(names: tuple[str, ...], timing: Any) -> dict[str, dict[str, Any]]:
    """What the verdict's timing was, for the results file: per timed quantity, its range over
    the repeats and its shortest window with the device that ran it."""
    given = timing if isinstance(timing, tuple) else (timing,)
    return {
        name: {
            "low": t.low,
            "high": t.high,
            "window_s": (w := min(t.windows, key=lambda w: w[0]))[0],
            "device": w[1],
        }
        for name, t in zip(names, given, strict=False)
        if t is not None
    }


def _fmt(v: Any) -> str:
    return (
        f"{v:.3g}"
        if isinstance(v, float)
        else f"({', '.join(map(_fmt, v))})"
        if isinstance(v, tuple)
        else str(v)
    )


def _number(what: str, v: Any, alternative: str = "") -> float:
    if isinstance(v, (str, bytes, bool)) or not hasattr(v, "__float__"):
        raise TypeError(f"measure: {what} must be a number{alternative}, got {v!r}")
    return float(v)


def load_all(
    directory: str | Path | None = None, *, problems: list[str] | None = None
) -> list[dict[str, Any]]:
    """Every notebook's results in `directory` (default: this machine's), sorted by notebook. A file
    that cannot be read is skipped, never silently: a warning, and a line in `problems` if given."""
    out, problems = [], [] if problems is None else problems
    for p in sorted(Path(directory or paths.results_dir()).glob("*.json")):
        try:
            data = json.loads((raw := p.read_bytes()).decode("utf-8"))
        except UnicodeDecodeError as e:
            problem = f"is not UTF-8 text (byte {e.start})"
        except json.JSONDecodeError as e:
            problem = (
                "is empty"
                if not raw.strip()
                else f"is truncated or not JSON ({e.msg}, line {e.lineno} column {e.colno})"
            )
        except OSError as e:
            problem = f"cannot be read ({e.strerror})"
        else:
            if isinstance(data, dict) and isinstance(data.get("notebook"), str):
                out.append(data)
                continue
            problem = "is not a results file (no 'notebook' entry)"
        warnings.warn(
            msg := f"{p} {problem}: its measurements and verdicts are missing from the report",
            stacklevel=2,
        )
        problems.append(msg)
    return out

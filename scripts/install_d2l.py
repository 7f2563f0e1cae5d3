"""Install d2l (the Dive-into-Deep-Learning book's package) without its 2023 hard pins.

d2l 1.0.3 requires numpy==1.23.5, pandas==2.0.3, matplotlib==3.7.2, ... exactly. Installed with
its requirements it would downgrade the whole stack; installed with `--no-deps` it works (what
`d2l.torch` imports is in requirements.txt) but `pip check` then reports every pin as broken.
So this script takes the published wheel, rewrites only its metadata (the same packages, without
the `==` pins; `jupyter`, a meta-package the code never imports, dropped), marks the version
`+unpinned` so nobody mistakes it for the original, and installs that with `--no-deps`.
Pip cannot do this itself: it has no option to ignore one package's requirements.

    python scripts/install_d2l.py [--python PATH]     # default: the running interpreter
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import re
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LOCAL = "unpinned"


def pinned_version() -> str:
    """The d2l version in requirements-nodeps.txt."""
    for line in (ROOT / "requirements-nodeps.txt").read_text().splitlines():
        m = re.fullmatch(r"d2l==([\w.]+)", line.split("#", 1)[0].strip())
        if m:
            return m.group(1)
    raise SystemExit("install_d2l: requirements-nodeps.txt has no 'd2l==X' line")


def unpin(metadata: str) -> str:
    out = []
    for line in metadata.splitlines():
        m = re.match(r"Requires-Dist: ([A-Za-z0-9_.\-]+)", line)
        if m:
            if m.group(1).lower() != "jupyter":
                out.append(f"Requires-Dist: {m.group(1)}")
            continue
        if line.startswith("Version: "):
            line = f"{line}+{LOCAL}"
        out.append(line)
    return "\n".join(out) + "\n"


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def rewrite(wheel: Path, out_dir: Path) -> Path:
    """A copy of `wheel` with unpinned requirements and version `<v>+unpinned`."""
    name, version = wheel.name.split("-")[:2]
    old_info, new_info = f"{name}-{version}.dist-info/", f"{name}-{version}+{LOCAL}.dist-info/"
    target = out_dir / wheel.name.replace(f"-{version}-", f"-{version}+{LOCAL}-")
    records = []
    with zipfile.ZipFile(wheel) as zin, zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as zout:
        for item in zin.infolist():
            arc = item.filename.replace(old_info, new_info)
            if arc == new_info + "RECORD":
                continue
            data = zin.read(item)
            if arc == new_info + "METADATA":
                data = unpin(data.decode()).encode()
            zout.writestr(arc, data)
            records.append(f"{arc},{_record_hash(data)},{len(data)}")
        records.append(f"{new_info}RECORD,,")
        zout.writestr(new_info + "RECORD", "\n".join(records) + "\n")
    return target


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--python", default=sys.executable, help="interpreter to install into")
    args = ap.parse_args(argv)
    version = pinned_version()
    pip = [args.python, "-m", "pip", "--disable-pip-version-check", "-q"]
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([*pip, "download", "--no-deps", f"d2l=={version}", "-d", tmp], check=True)
        (wheel,) = Path(tmp).glob("d2l-*.whl")
        fixed = rewrite(wheel, Path(tmp))
        subprocess.run([*pip, "install", "--no-deps", "--force-reinstall", str(fixed)], check=True)
    print(f"install_d2l: installed d2l {version}+{LOCAL} (requirements without pins)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

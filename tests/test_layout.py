"""The shape the suite keeps: the lesson is in the notebook (its technique written in its own code
cells, never printed from a module), no function grows past 60 lines, and nothing in the helpers
reassigns an attribute of torch. How large the helpers are is a figure the README reports
(scripts/code_size.py), not a quota: a fix that needs ten lines never has to delete ten first."""

import ast
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
HELPERS = ROOT / "helpers"
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))

# A notebook, found by words of its title, and the calls its own code cells must make.
TECHNIQUE_CALLS = {
    "Why is it slow": ["matmul.fp32_precision =", "copy_(", "torch.compile("],
    "DataLoader workers": ["DataLoader(", "num_workers="],
    "CPU threads": [
        "cpu_threads(",
        "devices.share(",
        "OMP_WAIT_POLICY",
        "OMP_NUM_THREADS",
        "num_workers=",
    ],
    "GPU data pipelines": ["flip("],
    "Batch size and gradient accumulation": ["OutOfMemoryError"],
    "Mixed precision": ["torch.autocast(", "scaler.scale(", "scaler.step(", "scaler.update("],
    "DistributedDataParallel": ["init_process_group(", "DistributedDataParallel("],
    "profiling a training loop": ["schedule(", "record_function("],
    "Capstone": ["DataLoader(", "backward()"],
    "Where training memory goes": [
        "torch.optim.Adam(",
        "torch.autocast(",
        "use_reentrant=False",
        "torch.no_grad",
        "torch.inference_mode",
        "SavedTensors()",
    ],
    "Attention and variable-length sequences": [
        "scaled_dot_product_attention(",
        "sdpa_kernel(",
        "ignore_index=",
        "create_block_mask(",
    ],
}
SHOWN_FROM_A_MODULE = re.compile(r"getsource|%psource|%pycat|%pinfo2|\?\?\s*$", re.M)


def _cells(nb_path: Path, kind: str) -> list[str]:
    cells = json.loads(nb_path.read_text())["cells"]
    return ["".join(c["source"]) for c in cells if c["cell_type"] == kind]


def _functions(path: Path):
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node


def test_no_function_over_60_lines():
    files = [
        *HELPERS.rglob("*.py"),
        *(ROOT / "tests").glob("*.py"),
        *(ROOT / "benchmarks").glob("*.py"),
    ]
    long = [
        f"{p.relative_to(ROOT)}:{f.name} ({f.end_lineno - f.lineno + 1})"
        for p in files
        for f in _functions(p)
        if f.end_lineno - f.lineno + 1 > 60
    ]
    assert not long


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_no_lesson_code_printed_from_a_module(nb):
    shown = [c.splitlines()[0] for c in _cells(nb, "code") if SHOWN_FROM_A_MODULE.search(c)]
    assert not shown


@pytest.mark.parametrize("title_words", TECHNIQUE_CALLS)
def test_the_technique_is_written_in_its_notebook(title_words):
    found = [nb for nb in NOTEBOOKS if title_words in _cells(nb, "markdown")[0].splitlines()[0]]
    assert len(found) == 1, f"one notebook titled with {title_words!r}, found {found}"
    code = "\n".join(_cells(found[0], "code"))
    assert [call for call in TECHNIQUE_CALLS[title_words] if call not in code] == []


def _torch_names(tree: ast.Module) -> set[str]:
    """The names a module binds to torch or to anything imported from it."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {
                a.asname or a.name.split(".")[0]
                for a in node.names
                if a.name.split(".")[0] == "torch"
            }
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "torch":
            names |= {a.asname or a.name for a in node.names}
    return names


def _root_name(node: ast.expr) -> str | None:
    while isinstance(node, (ast.Attribute, ast.Subscript)):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


# The one place torch is patched, and why it may be: the doctor's child process is its lab,
# where --what-if-loader (asked for by name) rebuilds the script's DataLoaders with workers and
# the threads what-if holds torch.set_num_threads at its count against the script's own calls,
# and where a --nproc rank's default rendezvous (env://: a TCPStore listening on every
# interface) is a file instead; a learner's own process is never patched.
PATCHES_TORCH = {"helpers/doctor/whatif.py": 2, "helpers/doctor/cli.py": 1}


def test_no_assignment_to_torch_attributes():
    """Patching torch (a private method of its rendezvous, say) breaks with its next release
    and changes it for every other user of the process."""
    found = []
    for path in HELPERS.rglob("*.py"):
        tree = ast.parse(path.read_text())
        torch_names = _torch_names(tree)
        for node in ast.walk(tree):
            targets = (
                node.targets
                if isinstance(node, ast.Assign)
                else ([node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else [])
            )
            for t in targets:
                if isinstance(t, ast.Attribute) and _root_name(t) in torch_names:
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
            if (
                isinstance(node, ast.Call)
                and getattr(node.func, "id", None) == "setattr"
                and node.args
                and _root_name(node.args[0]) in torch_names
            ):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    per_file = {}
    for hit in found:
        per_file[hit.split(":")[0]] = per_file.get(hit.split(":")[0], 0) + 1
    assert per_file == PATCHES_TORCH, found


def test_the_torch_attribute_check_can_fail():
    """The check above sees an assignment through an alias and through setattr."""
    tree = ast.parse(
        "import torch.distributed as dist\nfrom torch import nn\n"
        "dist.x = 1\nsetattr(nn.Module, 'y', 2)\n"
    )
    names = _torch_names(tree)
    assigned = [n for n in ast.walk(tree) if isinstance(n, ast.Assign)]
    assert _root_name(assigned[0].targets[0]) in names
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call)]
    assert _root_name(calls[0].args[0]) in names

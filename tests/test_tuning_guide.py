"""notebooks/TUNING_GUIDE.md walks PyTorch's Performance Tuning Guide and AMP recipe: each of their
sections is a row, and each row cites a notebook section that exists or says why none teaches it."""

import json
import re
from pathlib import Path

import pytest

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"
PAGE = (NOTEBOOKS / "TUNING_GUIDE.md").read_text(encoding="utf-8")

# The guide's table of contents, titles verbatim (its ``code`` written `code`):
# https://docs.pytorch.org/tutorials/recipes/recipes/tuning_guide.html
# (pytorch/tutorials, recipes_source/recipes/tuning_guide.py)
GUIDE = {
    "General optimizations": [
        "Enable asynchronous data loading and augmentation",
        "Disable gradient calculation for validation or inference",
        "Disable bias for convolutions directly followed by a batch norm",
        "Use parameter.grad = None instead of model.zero_grad() or optimizer.zero_grad()",
        "Fuse operations",
        "Enable channels_last memory format for computer vision models",
        "Checkpoint intermediate buffers",
        "Disable debugging APIs",
    ],
    "CPU specific optimizations": [
        "Utilize Non-Uniform Memory Access (NUMA) Controls",
        "Utilize OpenMP",
        "Intel OpenMP Runtime Library (`libiomp`)",
        "Switch Memory allocator",
        "Use oneDNN Graph with TorchScript for inference",
        "Train a model on CPU with PyTorch `DistributedDataParallel`(DDP) functionality",
    ],
    "GPU specific optimizations": [
        "Enable Tensor cores",
        "Use CUDA Graphs",
        "Enable cuDNN auto-tuner",
        "Avoid unnecessary CPU-GPU synchronization",
        "Create tensors directly on the target device",
        "Use mixed precision and AMP",
        "Preallocate memory in case of variable input length",
    ],
    "Distributed optimizations": [
        "Use efficient data-parallel backend",
        "Skip unnecessary all-reduce if training with `DistributedDataParallel` and gradient "
        "accumulation",
        "Match the order of layers in constructors and during the execution if using "
        "`DistributedDataParallel(find_unused_parameters=True)`",
        "Load-balance workload in a distributed setting",
    ],
}
# The AMP recipe's practical notes, its "Advanced topics" bullets and "Troubleshooting" entries:
# https://docs.pytorch.org/tutorials/recipes/recipes/amp_recipe.html
# (pytorch/tutorials, recipes_source/recipes/amp_recipe.py)
AMP = {
    "Automatic Mixed Precision recipe: practical notes": [
        "Inspecting/modifying gradients (e.g., clipping)",
        "Saving/Resuming",
        "Inference/Evaluation",
        "Advanced topics · Gradient accumulation",
        "Advanced topics · Gradient penalty/double backward",
        "Advanced topics · Networks with multiple models, optimizers, or losses",
        "Advanced topics · Multiple GPUs (`torch.nn.DataParallel` or "
        "`torch.nn.parallel.DistributedDataParallel`)",
        "Advanced topics · Custom autograd functions (subclasses of `torch.autograd.Function`)",
        "Troubleshooting · Speedup with Amp is minor",
        "Troubleshooting · Loss is inf/NaN",
        "Troubleshooting · Type mismatch error (may manifest as CUDNN_STATUS_BAD_PARAM)",
    ],
}

# A citation: [08 · §2 Hidden synchronisations](08_item_hygiene.ipynb); "§ Exercises" when the
# heading has no number.
LINK = re.compile(r"\[([^\]]+)\]\(([^)\s]+\.ipynb)\)")
CITED = re.compile(r"(\d\d[a-z]?) · §(\d*) (.+)")
HEADING = re.compile(r"#{2,3} (?:(\d+)(?:\.| ·) )?(.+)")  # "## 2. X" and "## 2 · X" are ("2", "X")


def _tables() -> dict[str, list[list[str]]]:
    """The page's table rows (lists of cells) under each `## ` heading."""
    tables, heading = {}, None
    for line in PAGE.splitlines():
        if line.startswith("## "):
            heading = line[3:].strip()
            tables[heading] = []
        elif line.startswith("| ") and not line.startswith("| Section |"):
            tables[heading].append([c.strip() for c in line.strip().strip("|").split("|")])
    return tables


def _headings(notebook: Path) -> set[tuple[str, str]]:
    """(number or "", text) of each `##` and `###` heading in the notebook's markdown."""
    found = set()
    for cell in json.loads(notebook.read_text(encoding="utf-8"))["cells"]:
        if cell["cell_type"] == "markdown":
            for line in "".join(cell["source"]).splitlines():
                if m := HEADING.fullmatch(line.strip()):
                    found.add((m.group(1) or "", m.group(2).strip()))
    return found


def cites_a_real_section(text: str, target: str) -> bool:
    """`text` names the notebook `target` by its number and one of its headings, exactly."""
    m, path = CITED.fullmatch(text), NOTEBOOKS / target
    return (
        m is not None
        and target.startswith(f"{m.group(1)}_")
        and path.is_file()
        and (m.group(2), m.group(3)) in _headings(path)
    )


def test_every_section_of_the_guide_and_the_recipe_is_a_row_in_order():
    tables = _tables()
    assert sorted(tables) == sorted(GUIDE | AMP)
    for heading, titles in (GUIDE | AMP).items():
        assert [row[0] for row in tables[heading]] == titles, heading


LINKS = LINK.findall(PAGE)


@pytest.mark.parametrize(
    "text,target", LINKS, ids=[f"{t[:2]}-{i}" for i, (_, t) in enumerate(LINKS)]
)
def test_each_link_cites_a_section_its_notebook_has(text, target):
    assert cites_a_real_section(text, target), f"[{text}]({target})"


@pytest.mark.parametrize(
    "text,target,real",
    [
        ("08 · §2 Hidden synchronisations", "08_item_hygiene.ipynb", True),
        ("12 · § Exercises", "12_mixed_precision.ipynb", True),
        ("08 · §2 Hidden synchronizations", "08_item_hygiene.ipynb", False),  # not its spelling
        ("08 · §3 Hidden synchronisations", "08_item_hygiene.ipynb", False),  # another number
        ("09 · §2 Hidden synchronisations", "09_device_placement.ipynb", False),  # not there
        ("08 · §2 Hidden synchronisations", "09_device_placement.ipynb", False),  # 08 is not 09
        ("77 · §2 Hidden synchronisations", "77_item_hygiene.ipynb", False),  # no such notebook
        ("07 §2 Hidden synchronisations", "08_item_hygiene.ipynb", False),  # not the format
    ],
)
def test_the_check_rejects_a_citation_that_is_wrong(text, target, real):
    assert cites_a_real_section(text, target) is real


def test_every_row_cites_a_section_or_says_why_not():
    assert len(LINKS) >= 10
    for heading, rows in _tables().items():
        for row in rows:
            assert len(row) == 3, f"{heading}: {row}"
            title, taught, why_not = row
            assert LINK.search(taught) or why_not, f"{heading}: {title} has neither"
            assert not taught or LINK.sub("", taught).strip(" ,") == "", f"{title}: links only"

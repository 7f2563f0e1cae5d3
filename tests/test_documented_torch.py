"""Documented torch only: no underscored torch name in helpers/ or a notebook's code cells
beyond the short allow-list (tests/private_torch.toml), each entry with its reason."""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

import nbformat
import pytest
from IPython.core.inputtransformer2 import TransformerManager

ROOT = Path(__file__).resolve().parents[1]
ALLOWED = tomllib.loads((ROOT / "tests" / "private_torch.toml").read_text())["allowed"]
PRIVATE_IN_TEXT = re.compile(r"\btorch(?:\.\w+)*\._[A-Za-z]\w*(?:\.\w+)*")
# Internals without an underscore, which the name test alone misses: torch's documentation lists
# neither this module nor a storage's `cdata` (its C++ address), yet both read like public API.
UNDOCUMENTED_MODULES = {"torch.multiprocessing.reductions"}
UNDOCUMENTED_ATTRIBUTES = {"cdata", "_cdata"}


def _private(name: str) -> bool:
    if name.startswith("<attribute>.") or any(
        name == m or name.startswith(m + ".") for m in UNDOCUMENTED_MODULES
    ):
        return True
    return any(p.startswith("_") and not p.startswith("__") for p in name.split("."))


def private_torch_names(source: str) -> set[str]:
    """Underscored torch names `source` uses: imported, reached through an alias of a torch
    module (`import torch._dynamo as dynamo; dynamo.reset()`), or named in a string."""
    tree = ast.parse(source)
    alias: dict[str, str] = {"torch": "torch"}  # a notebook's later cells use the setup's import
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] == "torch":
                    alias[a.asname or a.name.split(".")[0]] = a.name if a.asname else "torch"
                    found.add(a.name)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module.split(".")[0] == "torch":
                for a in node.names:
                    alias[a.asname or a.name] = f"{node.module}.{a.name}"
                    found.add(f"{node.module}.{a.name}")
    inner = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in UNDOCUMENTED_ATTRIBUTES:
            found.add(f"<attribute>.{node.attr}")  # on any object: its type is not known here
        if isinstance(node, ast.Attribute) and id(node) not in inner:
            parts, value = [node.attr], node.value
            while isinstance(value, ast.Attribute):
                parts.append(value.attr)
                value = value.value
            if isinstance(value, ast.Name) and value.id in alias:
                found.add(".".join([alias[value.id], *reversed(parts)]))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            found.update(PRIVATE_IN_TEXT.findall(node.value))
    return {n for n in found if _private(n)}


def _allowed(name: str) -> bool:
    return any(name == a["name"] or name.startswith(a["name"] + ".") for a in ALLOWED)


def _sources() -> list[tuple[str, str]]:
    out = [
        (p.relative_to(ROOT).as_posix(), p.read_text()) for p in (ROOT / "helpers").rglob("*.py")
    ]
    python = TransformerManager().transform_cell  # magics as the Python IPython runs
    for nb in sorted((ROOT / "notebooks").glob("*.ipynb")):
        cells = nbformat.read(nb, as_version=4).cells
        # one namespace: an alias imported in the setup cell is used in later ones
        out.append((nb.name, "\n".join(python(c.source) for c in cells if c.cell_type == "code")))
    return out


def test_no_undocumented_torch_name_in_helpers_or_notebooks():
    used = {(where, n) for where, src in _sources() for n in private_torch_names(src)}
    assert not [u for u in used if not _allowed(u[1])], sorted(
        u for u in used if not _allowed(u[1])
    )


def test_every_allowed_name_is_used_and_says_why():
    used = {n for _, src in _sources() for n in private_torch_names(src)}
    for a in ALLOWED:
        assert len(a["reason"].split()) >= 8 and a["link"].startswith("https://"), a["name"]
        assert any(n == a["name"] or n.startswith(a["name"] + ".") for n in used), (
            f"{a['name']} is allowed but no longer used: remove it from the list"
        )


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        (
            "import torch._dynamo as dynamo\ndynamo.reset()",
            {"torch._dynamo", "torch._dynamo.reset"},
        ),
        ("import torch\ntorch._dynamo.utils.counters['x']", {"torch._dynamo.utils.counters"}),
        ("from torch.utils._pytree import tree_leaves", {"torch.utils._pytree.tree_leaves"}),
        (
            "import logging\nlogging.getLogger('torch.nested._internal.sdpa')",
            {"torch.nested._internal.sdpa"},
        ),
        ("import torch\ntorch.compiler.reset()\nprint(torch.__version__)", set()),
        ("from torch import nn\nnn.functional.relu", set()),
        (
            "from torch.multiprocessing.reductions import StorageWeakRef\n"
            "StorageWeakRef(t.untyped_storage()).cdata",
            {"torch.multiprocessing.reductions.StorageWeakRef", "<attribute>.cdata"},
        ),
        ("import weakref\nweakref.ref(t.untyped_storage())", set()),
    ],
    ids=[
        "alias",
        "attribute",
        "from-import",
        "string",
        "public",
        "public-alias",
        "undocumented",
        "weakref",
    ],
)
def test_the_scan_finds_private_names_and_only_those(source, expected):
    assert private_torch_names(source) == expected

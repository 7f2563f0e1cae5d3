"""An experiment cell shows the experiment: its plumbing (recording, plotting, skip logic) takes
at most `MOST_PLUMBING` lines, so a learner reading it sees the technique, not the bookkeeping.

Read statically (AST only, well under a second): every code cell but the parameters cell, the
Explore sections' cells (their plotting is the point: a control redraws a figure) and
`%%writefile` cells (scripts that run elsewhere). `plumbing_lines` says what counts.
"""

from __future__ import annotations

import ast
import json
import textwrap
from pathlib import Path
from typing import NamedTuple

import nbformat

from tests import notebook_sections as ns

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
MOST_PLUMBING = 20  # lines per cell that are not the technique
PLOT_ROOTS = frozenset({"plt", "plotting"})  # pyplot and the notebooks' helpers for figures
LEAVING = (ast.Return, ast.Continue, ast.Break, ast.Pass)


def _root(node: ast.AST) -> str | None:
    """The name an expression starts from: `ax` for `ax.set(...)`, `axes[0].bar(...)`."""
    while isinstance(node, (ast.Call, ast.Attribute, ast.Subscript, ast.Starred)):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node.id if isinstance(node, ast.Name) else None


def _names(target: ast.AST) -> list[str]:
    return [n.id for n in ast.walk(target) if isinstance(n, ast.Name)]


def _plot_names(tree: ast.Module) -> set[str]:
    """`plt`, `plotting` and every name bound from them (`fig, ax = plt.subplots()`, `bars =
    ax.bar(...)`, `for ax in axes`, `for ax, v in zip(axes, values)`: `ax` only)."""
    plot = set(PLOT_ROOTS)
    binds = [n for n in ast.walk(tree) if isinstance(n, (ast.Assign, ast.AnnAssign, ast.For))]
    for _ in range(3):  # a name bound from a name bound from plt: a few rounds reach them all
        for node in binds:
            if isinstance(node, ast.For):
                it, target = node.iter, node.target
                if _root(it) in plot:
                    plot.update(_names(target))
                elif (
                    isinstance(it, ast.Call)
                    and _root(it.func) == "zip"
                    and isinstance(target, ast.Tuple)
                ):
                    for arg, t in zip(it.args, target.elts, strict=False):
                        if _root(arg) in plot:
                            plot.update(_names(t))
            elif node.value is not None and _root(node.value) in plot:
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                plot.update(n for t in targets for n in _names(t))
    return plot


class _Names(NamedTuple):
    plot: set[str]  # drawing names: plt, plotting and what they bound
    text: set[str]  # text only recording or plotting calls read


def _is_text(node: ast.AST) -> bool:
    """A string, an f-string, or one built of them with `+` or `... if ... else ...`."""
    if isinstance(node, ast.BinOp):
        return _is_text(node.left) and _is_text(node.right)
    if isinstance(node, ast.IfExp):
        return _is_text(node.body) and _is_text(node.orelse)
    return (
        isinstance(node, ast.JoinedStr)
        or isinstance(node, ast.Constant)
        and isinstance(node.value, str)
    )


def _text_for_plumbing(tree: ast.Module, plot: set[str]) -> set[str]:
    """Names bound to text that only a recording or plotting call reads (`figure = f"..."`,
    then `record.judge(..., figure=figure)`; `figure += f"..."` adds to it): the text is the
    call's, so are its lines."""
    texts = {
        t.id
        for n in ast.walk(tree)
        if isinstance(n, (ast.Assign, ast.AugAssign)) and _is_text(n.value)
        for t in (n.targets if isinstance(n, ast.Assign) else [n.target])
        if isinstance(t, ast.Name)
    }
    inside = {
        id(name)
        for call in ast.walk(tree)
        if isinstance(call, ast.Call) and (_root(call.func) == "record" or _root(call.func) in plot)
        for arg in [*call.args, *call.keywords]
        for name in ast.walk(arg)
    }
    read_elsewhere = {
        n.id
        for n in ast.walk(tree)
        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load) and id(n) not in inside
    }
    return texts - read_elsewhere


def _is_plumbing(stmt: ast.stmt, names: _Names) -> bool:
    """A statement that records (`record.*`), draws (a call or binding rooted in `plot`) or
    binds text only those read (`names.text`), or adds to it."""
    if isinstance(stmt, ast.Assign) and all(
        isinstance(t, ast.Name) and t.id in names.text for t in stmt.targets
    ):
        return True
    target = getattr(stmt, "target", None)  # `figure += f"..."` adds to such text
    if isinstance(stmt, ast.AugAssign) and isinstance(target, ast.Name) and target.id in names.text:
        return True
    if isinstance(stmt, (ast.Expr, ast.Assign, ast.AnnAssign, ast.AugAssign)):
        value = stmt.value
        return value is not None and (_root(value) == "record" or _root(value) in names.plot)
    return False


def _lines(stmt: ast.stmt) -> int:
    return stmt.end_lineno - stmt.lineno + 1


def _count(body: list[ast.stmt], names: _Names) -> int:
    n = 0
    for stmt in body:
        if _is_plumbing(stmt, names) or _all_plumbing(stmt, names) or _is_skip(stmt, names):
            n += _lines(stmt)
        else:
            for field in ("body", "orelse", "finalbody"):
                n += _count(getattr(stmt, field, []), names)
            for handler in getattr(stmt, "handlers", []):
                n += _count(handler.body, names)
    return n


def _children(stmt: ast.stmt) -> list[ast.stmt]:
    return [*getattr(stmt, "body", []), *getattr(stmt, "orelse", [])]


def _all_plumbing(stmt: ast.stmt, names: _Names) -> bool:
    """A loop, `with`, `if` or function that only records or draws (a docstring aside)."""
    if not isinstance(stmt, (ast.For, ast.With, ast.If, ast.While, ast.FunctionDef)):
        return False
    kids = [
        s
        for s in _children(stmt)
        if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))
    ]
    return bool(kids) and all(
        _is_plumbing(s, names) or _all_plumbing(s, names) or isinstance(s, ast.Pass) for s in kids
    )


def _is_skip(stmt: ast.stmt, names: _Names) -> bool:
    """`if <reason>: print(why); return` (or continue, break), with no `else`: skip logic."""
    if not isinstance(stmt, ast.If) or stmt.orelse:
        return False
    printed_or_recorded = all(
        isinstance(s, LEAVING)
        or _is_plumbing(s, names)
        or isinstance(s, ast.Expr)
        and isinstance(s.value, ast.Call)
        and _root(s.value) == "print"
        for s in stmt.body
    )
    return printed_or_recorded and isinstance(stmt.body[-1], LEAVING)


def _parse(source: str) -> ast.Module:
    """The cell as Python: a magic or shell line becomes `pass` (same indent, same line)."""
    return ast.parse(ns.python_source(source))


def plumbing_lines(source: str) -> int:
    """Source lines of a cell's statements that are not the technique: a recording call
    (`record.measure(...)`, all its lines), plotting (a call on `plt`, `plotting` or a name bound
    from them: `fig`, `ax`, `axes`, `bars`; `ax.set(...)` over four lines is four), a block that
    does only those (a loop of `ax.annotate`, a plotting function), and skip logic (an `if` whose
    body only prints or records, then returns, continues or breaks); text bound only for those
    calls (`figure = f"..."` read by `record.judge` alone) is theirs. IPython magics are left out.
    """
    tree = _parse(source)
    plot = _plot_names(tree)
    return _count(tree.body, _Names(plot, _text_for_plumbing(tree, plot)))


def _measured(cell: dict) -> bool:
    """Not the parameters cell, not a `%%writefile` script, not an Explore callback's cell."""
    if "parameters" in cell["metadata"].get("tags", []) or cell["source"].lstrip().startswith(
        "%%writefile"
    ):
        return False
    tree = _parse(cell["source"])
    return not any(
        isinstance(d, ast.Name) and d.id == "one_at_a_time" or _root(d) == "one_at_a_time"
        for node in ast.walk(tree)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        for d in node.decorator_list
    )


def heavy_cells(nb) -> list[tuple[int, int]]:
    """(cell index, plumbing lines) of each checked cell over MOST_PLUMBING, the worst first."""
    _, secs = ns.sections(nb)
    explore = {i for s in secs if s.explore for i in s.code}
    counts = [
        (i, plumbing_lines(cell.source))
        for i, cell in enumerate(nb.cells)
        if cell.cell_type == "code" and i not in explore and _measured(cell)
    ]
    return sorted(((i, n) for i, n in counts if n > MOST_PLUMBING), key=lambda c: -c[1])


def _read(path: Path) -> nbformat.NotebookNode:
    """The notebook without nbformat's validation (most of the read time)."""
    nb = json.loads(path.read_text())
    for cell in nb["cells"]:
        cell["source"] = "".join(cell["source"])
    return nbformat.from_dict(nb)


def test_experiment_cells_are_lean():
    heavy = {p.name: heavy_cells(_read(p)) for p in NOTEBOOKS}
    worst = sorted(
        ((n, f"{name} cell {i}: {n} lines") for name, cells in heavy.items() for i, n in cells),
        reverse=True,
    )
    assert not worst, (
        f"cells with over {MOST_PLUMBING} lines of recording, plotting or skip logic "
        "(move them into one-line helper calls): " + "; ".join(w for _, w in worst)
    )


def _cell(source: str) -> nbformat.NotebookNode:
    return nbformat.v4.new_code_cell(source)


PLANTED = (
    """x = torch.randn(64)
m = timing.benchmark(lambda: x.sum(), repeats=3)
fig, ax = plt.subplots(figsize=(4, 3))
"""
    + "".join(f'ax.plot([{k}], [m.median], "o", label="point {k}")\n' for k in range(16))
    + (
        """ax.set(
    xlabel="run",
    ylabel="s",
)
"""
    )
)


def test_a_cell_of_plotting_fails_and_one_helper_call_passes():
    """21 lines of plotting (`subplots`, 16 calls, a 4-line `ax.set`) fail; the same cell with
    the plotting moved into one helper call passes; the parameters cell and an Explore callback's
    cell are never counted."""
    nb = nbformat.v4.new_notebook(
        cells=[nbformat.v4.new_markdown_cell("## 1. Timing"), _cell(PLANTED)]
    )
    assert plumbing_lines(PLANTED) == MOST_PLUMBING + 1
    assert heavy_cells(nb) == [(1, MOST_PLUMBING + 1)]
    lean = "x = torch.randn(64)\nm = timing.benchmark(lambda: x.sum(), repeats=3)\n"
    nb.cells[1] = _cell(lean + 'plotting.points(m, title="run")\n')
    assert plumbing_lines(nb.cells[1].source) == 1 and heavy_cells(nb) == []
    params = _cell(PLANTED)
    params.metadata["tags"] = ["parameters"]
    explore = _cell("@one_at_a_time\ndef explore(k=1):\n" + textwrap.indent(PLANTED, "    "))
    nb.cells[1:] = [params, explore]
    assert heavy_cells(nb) == []


def test_skip_logic_and_recording_count():
    source = """for name in names:
    if name not in measured:
        print(f"{name}: skipped")
        continue
    t = timing.benchmark(work[name])
    record.measure(
        name,
        t.median,
        "s",
    )
"""
    assert plumbing_lines(source) == 3 + 5  # the skip, the recording call


def test_text_only_a_recording_call_reads_counts_as_recording():
    """Moving a verdict's sentence out of the call into a name does not make a cell leaner; text
    the technique also reads (a print) stays the technique's."""
    call = 'record.judge("L1", gain=gain, figure=figure)\n'
    sentence = 'figure = (\n    f"{gain:.2f}x "\n    "faster"\n)\n'
    assert plumbing_lines(sentence + call) == 4 + 1
    assert plumbing_lines(sentence + "print(figure)\n" + call) == 1
    more = (
        'if more:\n    figure += (\n        "; and more"\n    )\n'  # an `if` that only adds to it
    )
    assert plumbing_lines(sentence + more + call) == 4 + 4 + 1
    assert plumbing_lines("gain = 2.0\n" + call) == 1  # a measured number is the technique's

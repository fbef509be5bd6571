"""The README's architecture picture is drawn from the real imports, and stays so.

The module graph of tests/test_layers.py (every import statement of every module, inside functions and under
``if TYPE_CHECKING:`` too, and every ``import_module``/``__import__`` of an "exactlens..." string) grouped into
boxes: each subpackage of exactlens is one box, the small top-level modules are ``shared`` (errors, outputs,
jsonio, progress, plugins, requests, results, verb_registry, ...: the base layer) and ``api`` (with the
package's ``__init__`` and ``__main__``). Boxes are drawn from the top down in the order of their imports: a box
stands above everything it imports, where it can (boxes that import each other would share a rank, their arrows
marked ``↑``). The test compares the README's picture with the scan; ``python tests/test_readme_picture.py
--write`` redraws it after a change of the imports.
"""

from __future__ import annotations

import sys
from pathlib import Path

from test_layers import graph as module_graph

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "exactlens"
README = ROOT / "README.md"
BEGIN = "<!-- import picture: drawn by tests/test_readme_picture.py from the imports; do not edit by hand -->"
END = "<!-- end of the import picture -->"
SHARED = {"errors", "jsonio", "lazy", "outputs", "plugins", "progress", "devices", "dtypes", "interrupts",
          "resources", "version", "callable_package"}
ENTRY = {"__init__", "__main__", "api"}


def box_of(module: str) -> str:
    """The box of a dotted module name under exactlens ("exactlens.analysis.diff.parts" -> "analysis")."""
    parts = module.split(".")
    if len(parts) == 1:
        return "api"
    top = parts[1]
    if (SRC / top).is_dir():
        return top
    if top in SHARED:
        return "shared"
    if top in ENTRY:
        return "api"
    return "shared"  # requests, results, verb_registry: the base layer of tests/test_layers.py too


def import_graph() -> dict[str, set[str]]:
    """Box -> the boxes its modules import (itself left out), from tests/test_layers.py's module graph."""
    out: dict[str, set[str]] = {}
    for module, imported in module_graph().items():
        source = box_of(module)
        out.setdefault(source, set()).update({box_of(name) for name in imported} - {source})
    return out


def _ranks(graph: dict[str, set[str]]) -> dict[str, int]:
    """Rank 0 imports nothing; a box's rank is one more than the highest rank it imports, boxes in a circle of
    imports sharing one rank (the circle's strongly connected group)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                group.append(w)
                if w == v:
                    break
            groups.append(group)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    group_of = {v: i for i, g in enumerate(groups) for v in g}
    rank: dict[int, int] = {}
    for i, group in enumerate(groups):  # Tarjan emits a group after every group it reaches
        below = [rank[group_of[w]] for v in group for w in graph.get(v, ()) if group_of[w] != i]
        rank[i] = 1 + max(below, default=-1)
    return {v: rank[group_of[v]] for v in graph}


def picture(graph: dict[str, set[str]] | None = None) -> str:
    """The picture: one box per line, top (imports the most) to bottom, each with its arrows."""
    graph = import_graph() if graph is None else graph
    ranks = _ranks(graph)
    order = sorted(graph, key=lambda v: (-ranks[v], v))
    width = max(len(v) for v in graph) + 2
    lines = []
    for rank in sorted(set(ranks.values()), reverse=True):
        row = [v for v in order if ranks[v] == rank]
        lines.append(f"  {'┌' + '─' * width + '┐'}")
        for v in row:
            arrows = ", ".join(w + (" ↑" if ranks[w] >= ranks[v] else "") for w in sorted(
                graph[v], key=lambda w: (-ranks[w], w)))
            head = f"  │ {v:<{width - 1}}│"
            lines += _wrapped(head, arrows, f"  │{' ' * width}│")
        lines.append(f"  {'└' + '─' * width + '┘'}")
    return "\n".join(lines)


def _wrapped(head: str, arrows: str, blank: str, width: int = 116) -> list[str]:
    """``head ──> arrows``, the arrows wrapped under each other within ``width`` characters."""
    if not arrows:
        return [head]
    lines, line = [], f"{head} ──> "
    for word in arrows.split(", "):
        piece = word + ", "
        if len(line) + len(piece) > width and not line.endswith("──> "):
            lines.append(line.rstrip())
            line = f"{blank}     "
        line += piece
    lines.append(line.rstrip().removesuffix(","))
    return lines


def readme_block(text: str) -> str:
    start = text.index(BEGIN) + len(BEGIN)
    block = text[start:text.index(END)]
    return block.strip().removeprefix("```").removesuffix("```").strip("\n")


def test_the_readme_picture_is_the_import_graph() -> None:
    drawn = readme_block(README.read_text())
    assert drawn == picture(), "the imports changed: python tests/test_readme_picture.py --write redraws it"


def test_the_scan_sees_the_imports_it_should() -> None:
    graph = import_graph()
    assert "analysis" in graph["verbs"] and "model" in graph["analysis"]  # e.g. verbs/diff.py, analysis/diff/
    assert "papers" not in {w for v, ws in graph.items() if v != "papers" for w in ws}  # the core never imports papers
    assert graph["markup"] == set()  # below every layer: it imports nothing of exactlens
    assert {"constructions", "model", "tasks"} <= graph["papers"]
    # every box has a rank below the boxes that import it, unless they import each other
    ranks = _ranks(graph)
    for v, targets in graph.items():
        for w in targets:
            assert ranks[w] < ranks[v] or v in _reach(graph, w), (v, w)


def _reach(graph: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        v = todo.pop()
        for w in graph.get(v, ()):
            if w not in seen:
                seen.add(w)
                todo.append(w)
    return seen


if __name__ == "__main__":
    if "--write" in sys.argv:
        text = README.read_text()
        start = text.index(BEGIN) + len(BEGIN)
        README.write_text(text[:start] + "\n```\n" + picture() + "\n```\n" + text[text.index(END):])
    print(picture())

"""The import graph of src/exactlens, every import counted (module level, inside functions, under
``if TYPE_CHECKING:``, and ``import_module``/``__import__`` calls on a constant "exactlens..." name):
no import from a lower layer to a higher one, no circle, and the core never imports the papers.
The layer order is docs/architecture.md's "The layers"."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"

LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("base", ("markup", "errors", "version", "dtypes", "devices", "jsonio", "outputs", "resources", "processes", "lazy",
              "allocator", "progress", "interrupts", "plugins", "requests", "results", "verb_registry",
              "callable_package")),
    ("tasks", ("tasks",)),
    ("model", ("model",)),
    ("constructions", ("constructions",)),
    ("interop", ("interop",)),
    ("train", ("train",)),
    ("analysis", ("analysis",)),
    ("viz", ("viz",)),
    ("sweep", ("sweep",)),
    ("verbs", ("verbs",)),
    ("entries", ("", "__main__", "cli", "api")),
)
"""Lowest first: a module may import its own layer and those before it. ``""``: the package itself
(``import exactlens as el`` is the API's face). The papers (exactlens.papers) are plug-ins above them all."""


def modules(root: Path = SRC) -> dict[str, Path]:
    found = {}
    for path in sorted((root / "exactlens").rglob("*.py")):
        name = ".".join(path.relative_to(root).with_suffix("").parts)
        found[name.removesuffix(".__init__")] = path
    return found


def _resolve(name: str, known: dict[str, Path]) -> str | None:
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name or None


def imports(module: str, path: Path, known: dict[str, Path]) -> set[str]:
    """Every exactlens module ``module`` imports, wherever the statement stands."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    out: set[str | None] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {_resolve(a.name, known) for a in node.names if a.name.startswith("exactlens")}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.startswith("exactlens"):
                for alias in node.names:
                    full = f"{target}.{alias.name}"
                    out.add(full if full in known else _resolve(target, known))
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            called = ast.unparse(node.func)
            text = str(node.args[0].value)
            if called.endswith(("__import__", "import_module")) and text.startswith("exactlens"):
                out.add(_resolve(text, known))
    out.discard(None)
    out.discard(module)
    return out  # type: ignore[return-value]


def graph(root: Path = SRC) -> dict[str, set[str]]:
    known = modules(root)
    return {m: imports(m, p, known) for m, p in known.items()}


def layer_of(module: str) -> int | None:
    """The index in LAYERS of a core module; None for a paper."""
    parts = module.split(".")
    if parts[1:2] == ["papers"]:
        return None
    head = parts[1] if len(parts) > 1 else ""
    for i, (_, members) in enumerate(LAYERS):
        if head in members:
            return i
    raise AssertionError(f"{module} is in no layer: add its package to LAYERS (and to docs/architecture.md)")


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected groups of two or more modules (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []
    for start in edges:
        if start in index:
            continue
        work = [(start, iter(sorted(edges.get(start, ()))))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on.add(start)
        while work:
            node, rest = work[-1]
            step = next(rest, None)
            if step is not None:
                if step not in index:
                    index[step] = low[step] = len(index)
                    stack.append(step)
                    on.add(step)
                    work.append((step, iter(sorted(edges.get(step, ())))))
                elif step in on:
                    low[node] = min(low[node], index[step])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                group = []
                while True:
                    member = stack.pop()
                    on.discard(member)
                    group.append(member)
                    if member == node:
                        break
                if len(group) > 1:
                    found.append(sorted(group))
    return found


def upward(edges: dict[str, set[str]]) -> list[str]:
    bad = []
    for module, targets in sorted(edges.items()):
        here = layer_of(module)
        for target in sorted(targets):
            there = layer_of(target)
            if here is not None and there is None:
                bad.append(f"{module} -> {target} (the core imports a paper)")
            elif here is not None and there is not None and there > here:
                bad.append(f"{module} ({LAYERS[here][0]}) -> {target} ({LAYERS[there][0]})")
    return bad


def test_the_scan_sees_every_kind_of_import(tmp_path):
    """The scanner counts in-function, TYPE_CHECKING and import_module imports, and finds an upward arrow and
    a circle in a planted package (so the checks below can fail)."""
    pkg = tmp_path / "exactlens"
    for sub in ("tasks", "viz"):
        (pkg / sub).mkdir(parents=True)
        (pkg / sub / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "tasks" / "a.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                        "    from exactlens.viz import b\n")
    (pkg / "tasks" / "c.py").write_text("def f():\n    from . import a\n")
    (pkg / "viz" / "b.py").write_text("import importlib\nimportlib.import_module('exactlens.tasks.c')\n")
    (pkg / "tasks" / "d.py").write_text("def g():\n    import exactlens.tasks.c\n")
    edges = graph(tmp_path)
    assert edges["exactlens.tasks.a"] == {"exactlens.viz.b"}
    assert edges["exactlens.tasks.c"] == {"exactlens.tasks.a"}
    assert edges["exactlens.viz.b"] == {"exactlens.tasks.c"}
    assert edges["exactlens.tasks.d"] == {"exactlens.tasks.c"}
    assert circles(edges) == [["exactlens.tasks.a", "exactlens.tasks.c", "exactlens.viz.b"]]
    assert upward(edges) == ["exactlens.tasks.a (tasks) -> exactlens.viz.b (viz)"]


def test_no_import_runs_from_a_lower_layer_to_a_higher_one():
    assert upward(graph()) == []


def test_no_import_circles():
    assert circles(graph()) == []


def test_every_core_package_has_a_layer():
    for module in graph():
        layer_of(module)


def test_the_architecture_doc_states_the_layer_order():
    text = (SRC.parents[0] / "docs" / "architecture.md").read_text(encoding="utf-8")
    order = " -> ".join(name for name, _ in LAYERS)
    assert order in text, f"docs/architecture.md should state the layer order: {order}"


def test_what_is_found_by_name_instead_of_imported():
    """The two late bindings the layers rely on (docs/architecture.md): SIIT's analysis, provided from the top, and
    the verbs, found in the registry by the sweep engine and the callable packages."""
    import pytest

    import exactlens  # noqa: F401 (provides the SIIT side)
    from exactlens.analysis.diff.alignment.pairs import make_pairs
    from exactlens.analysis.diff.runs import same_decisions
    from exactlens.errors import ExactLensError
    from exactlens.lazy import provided
    from exactlens.sweep.check import verb_spec
    from exactlens.verb_registry import VERBS, find_verb

    side = provided("siit_side")
    assert side.make_pairs is make_pairs and side.same_decisions is same_decisions
    with pytest.raises(ExactLensError, match="'no such slot'"):
        provided("no such slot")
    assert verb_spec("verify") is find_verb("verify") is VERBS["verify"]
    with pytest.raises(ExactLensError, match="unknown verb 'nope'; verbs: .*verify"):
        verb_spec("nope")

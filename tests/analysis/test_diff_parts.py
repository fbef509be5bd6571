"""The diff as declared parts (exactlens.analysis.diff.parts) and one request (DiffRequest): the order the
needs give, the declarations kept honest at run time, the request's checks shared by every entry, and
the light modules the command line loads."""

from __future__ import annotations

import ast
import inspect
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from exactlens.analysis.diff import PARTS, DiffRequest, diff
from exactlens.analysis.diff.parts import STEPS, Done, Part, plan
from exactlens.errors import ExactLensError

ROOT = Path(__file__).resolve().parents[2]
DIFF_SOURCES = sorted((ROOT / "src" / "exactlens" / "analysis" / "diff").glob("*.py"))


def _names(steps: list[Part]) -> list[str]:
    return [s.name for s in steps]


def test_plan_runs_what_the_chosen_parts_need_first() -> None:
    assert _names(plan(("circuit",))) == ["words", "head_matching", "circuit"]
    assert _names(plan(("interventions", "behaviour"))) == ["words", "behaviour", "probe_fits", "interventions"]
    full = _names(plan(PARTS))
    assert set(full) == {s.name for s in STEPS}
    for step in STEPS:  # every step after everything it needs
        assert all(full.index(need) < full.index(step.name) for need in step.needs), step.name


def test_plan_orders_by_needs_not_by_declaration() -> None:
    def nothing(ctx, request):
        return Done()

    late = Part("late", nothing, needs=("early",))
    early = Part("early", nothing, needs=("base",), shared=True)
    base = Part("base", nothing, shared=True)
    assert _names(plan(["late"], [late, early, base])) == ["base", "early", "late"]
    with pytest.raises(ExactLensError, match="unknown diff step 'nowhere'"):
        plan(["late"], [late, Part("early", nothing, needs=("nowhere",))])
    with pytest.raises(ExactLensError, match="circle"):
        plan(["late"], [late, Part("early", nothing, needs=("late",))])


def test_parts_are_the_declared_steps_a_user_may_ask_for() -> None:
    names = [s.name for s in STEPS]
    assert len(set(names)) == len(names)
    assert PARTS == tuple(s.name for s in STEPS if not s.shared)
    assert all(need in names for s in STEPS for need in s.needs)
    assert all(s.sections for s in STEPS if not s.shared)  # a part the user asks for shows in the JSON
    assert DiffRequest.__dataclass_fields__["parts"].default == PARTS


def test_circuit_choices_are_the_circuit_packages() -> None:
    from exactlens.analysis.circuit.ablation import ABLATIONS
    from exactlens.analysis.circuit.discovery import METHODS
    from exactlens.analysis.circuit.graph import GRANULARITIES
    from exactlens.analysis.diff.request import CIRCUIT_ABLATIONS, CIRCUIT_GRANULARITIES, CIRCUIT_METHODS

    assert (CIRCUIT_METHODS, CIRCUIT_GRANULARITIES, CIRCUIT_ABLATIONS) == (METHODS, GRANULARITIES, ABLATIONS)


def test_pair_designs_are_the_alignment_packages() -> None:
    from exactlens.analysis.diff.alignment.fit import PAIR_DESIGNS as OWN
    from exactlens.analysis.diff.request import PAIR_DESIGNS

    assert PAIR_DESIGNS == OWN


def test_a_request_and_keywords_give_the_same_diff() -> None:
    options = dict(lengths=[2, 3], strings=4, parts=("behaviour", "attention"), seed=1)
    by_keywords = diff("first-flawed", "first", **options)
    request = DiffRequest(target="first-flawed", against="first", lengths=[2, 3], strings=4,
                          parts=("behaviour", "attention"), seed=1, device=None)
    by_request = diff("first-flawed", "first", request)
    for result in (by_keywords, by_request):
        result.pop("seconds")
    assert by_keywords == by_request
    assert set(by_keywords["summary"]) == {"agreement", "trained_accuracy", "exact_accuracy",
                                           "mean_matched_attention_distance"}
    assert "probes" not in by_keywords and "weights" not in by_keywords
    with pytest.raises(ExactLensError, match="not both"):
        diff("first-flawed", "first", request, strings=8)
    with pytest.raises(ExactLensError, match="strings takes an integer >= 2"):
        diff("first-flawed", "first", DiffRequest(target="first-flawed", against="first", strings=1))
    with pytest.raises(ExactLensError, match="html: the page is el.diff's"):
        diff("first-flawed", "first", html="page.html")
    with pytest.raises(ExactLensError, match="has no option 'lenghts'"):
        diff("first-flawed", "first", lenghts=[2])


def test_a_step_adding_what_it_does_not_declare_is_refused(monkeypatch) -> None:
    import exactlens.analysis.diff.orchestrator as orchestrator

    def sneaky(ctx, request):
        return Done({"behaviour": {}}, {"agreement": 1.0, "secret": 2.0})

    steps = [s if s.name != "behaviour" else Part("behaviour", sneaky, ("words",), ("behaviour",), ("agreement",))
             for s in STEPS]
    monkeypatch.setattr(orchestrator, "plan", lambda chosen: plan(chosen, steps))
    with pytest.raises(ExactLensError, match="'behaviour' added secret"):
        diff("first-flawed", "first", lengths=[2], strings=4, parts=("behaviour",))


def test_the_request_and_the_verb_load_without_torch() -> None:
    code = ("import sys, json; import exactlens.analysis.diff.request, exactlens.verbs.diff; "
            "print(json.dumps(sorted(m for m in ('torch', 'numpy', 'scipy') if m in sys.modules)))")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == []


def _functions(path: Path) -> list[ast.FunctionDef | ast.AsyncFunctionDef]:
    tree = ast.parse(path.read_text())
    return [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]


def _parameters(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    a = node.args
    return len(a.posonlyargs) + len(a.args) + len(a.kwonlyargs) + (a.vararg is not None) + (a.kwarg is not None)


def test_no_diff_function_takes_more_than_ten_parameters() -> None:
    wide = [(path.name, f.name, _parameters(f)) for path in DIFF_SOURCES for f in _functions(path)
            if _parameters(f) > 10]
    assert wide == []


def test_the_orchestration_stays_short() -> None:
    from exactlens.analysis.diff.orchestrator import diff as orchestrate

    assert len(inspect.getsource(orchestrate).splitlines()) < 60

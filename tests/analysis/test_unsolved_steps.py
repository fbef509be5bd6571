"""``das_unsolved_steps``: fewer DAS Adam steps where the trained model does not solve the task (every verdict is
then "model does not solve the task" whatever the fits find), the steps used in the JSON and the reason on the
page; a model that solves the task keeps ``das_steps``."""

from __future__ import annotations

import pytest

from exactlens import tasks
from exactlens.analysis.diff import diff
from exactlens.constructions import build
from exactlens.errors import ExactLensError
from exactlens.viz.diff_page import diff_html

FAST = dict(parts=("alignment",), das_max_dim=1, das_steps=40, alignment_pairs=32, lengths=[4, 5, 6])


def _one_as_first():
    """ONE's exact circuit presented as a model of FIRST: it never reads w_1, so it does not solve FIRST."""
    one = build("one", dtype="float64")
    one.cfg.task = tasks.get("first").spec()
    one.cfg.decision_rule = None
    return one


@pytest.fixture(scope="module")
def unsolved() -> tuple[dict, dict]:
    """The same diff of a model that does not solve the task with the usual steps and with 4 where unsolved."""
    return diff(_one_as_first(), "first", **FAST), diff(_one_as_first(), "first", das_unsolved_steps=4, **FAST)


def test_an_unsolved_diff_takes_the_unsolved_steps_and_says_so(unsolved: tuple[dict, dict]) -> None:
    usual, short = unsolved
    assert short["alignment_details"]["solves"]["solves"] is False
    assert short["alignment_details"]["settings"]["steps"] == 4
    assert short["alignment_details"]["settings"]["unsolved_steps"] == 4
    assert short["settings"]["das_unsolved_steps"] == 4 and short["settings"]["das_steps"] == 40
    assert usual["alignment_details"]["settings"]["steps"] == 40
    page = diff_html(short)
    assert "took 4 Adam steps instead of 40" in page and "does not solve the task" in page
    assert "Adam steps instead of" not in diff_html(usual)


def test_an_unsolved_diff_keeps_its_verdicts(unsolved: tuple[dict, dict]) -> None:
    usual, short = unsolved
    verdicts = {name: v["verdict"] for name, v in usual["summary"]["verdicts"].items()}
    assert verdicts and set(verdicts.values()) == {"model does not solve the task"}, verdicts
    assert {name: v["verdict"] for name, v in short["summary"]["verdicts"].items()} == verdicts
    assert [(r["variable"], r["site"]) for r in short["alignment"]] == [(r["variable"], r["site"])
                                                                        for r in usual["alignment"]]


def test_a_solving_model_keeps_its_steps() -> None:
    result = diff(build("first", dtype="float64"), "first", das_unsolved_steps=4, **FAST)
    assert result["alignment_details"]["solves"]["solves"] is True
    assert result["alignment_details"]["settings"]["steps"] == 40
    assert "Adam steps instead of" not in diff_html(result)


def test_unsolved_steps_must_be_a_positive_count() -> None:
    with pytest.raises(ExactLensError, match="das_unsolved_steps"):
        diff(build("first", dtype="float64"), "first", das_unsolved_steps=0, **FAST)

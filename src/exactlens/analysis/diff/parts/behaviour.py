"""The ``behaviour`` part: accuracy of each model and the agreement of their decisions, per length."""

from __future__ import annotations

from typing import Any

from exactlens.analysis.diff.parts.base import Done, Part, number
from exactlens.markup import table

SUMMARY = ("agreement", "trained_accuracy", "exact_accuracy", "per_position_agreement", "trained_mse",
           "exact_mse", "trained_r2")


def run(ctx: Any, request: Any) -> Done:
    from exactlens.analysis.diff.behaviour import behaviour_table

    out = behaviour_table(ctx.values["words"], ctx.side, ctx.exact)
    return Done({"behaviour": out}, {key: out[key] for key in SUMMARY if key in out})


def text(result: dict[str, Any]) -> list[str]:
    s = result["summary"]
    return [f"  accuracy trained {number(s['trained_accuracy'])}, exact {number(s['exact_accuracy'])}, "
            f"agreement {number(s['agreement'])}"]


def page(result: dict[str, Any]) -> list[str]:
    rows = [[r["length"], r["strings"], r["trained_accuracy"], r["exact_accuracy"], r["agreement"]]
            for r in result["behaviour"]["rows"]]
    return ["<h3>Behaviour</h3>", table(["|w|", "words", "trained acc", "exact acc", "agreement"], rows, 0)]


PART = Part("behaviour", run, ("words",), ("behaviour",), SUMMARY, order=10, text=text, page=page,
            help="accuracy of each model and the agreement of their decisions, per length")

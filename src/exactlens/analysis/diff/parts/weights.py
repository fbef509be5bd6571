"""The ``weights`` part: QK and OV circuits of matched heads in the exact label basis."""

from __future__ import annotations

from typing import Any

from exactlens.analysis.diff.parts.base import Done, Part, mean_of, number
from exactlens.markup import table

SUMMARY = ("mean_qk_cosine", "mean_ov_cosine")


def run(ctx: Any, request: Any) -> Done:
    from exactlens.analysis.diff.weights import weights_table

    out = weights_table(ctx.values["words"], ctx.side, ctx.exact, ctx.values["head_matching"]["matching"])
    ctx.say("diff: weights done")
    return Done({"weights": out}, {
        "mean_qk_cosine": mean_of([p["qk_cosine"] for p in out["pairs"] if p["qk_cosine"] is not None]),
        "mean_ov_cosine": mean_of([p["ov_cosine"] for p in out["pairs"] if p["ov_cosine"] is not None])})


def text(result: dict[str, Any]) -> list[str]:
    return [f"  weights L{p['trained_layer']}H{p['trained_head']}: QK cosine {number(p['qk_cosine'])}, "
            f"OV cosine {number(p['ov_cosine'])}" for p in result["weights"]["pairs"]]


def page(result: dict[str, Any]) -> list[str]:
    def top(values: list[float]) -> str:
        return " ".join(f"{v:.3g}" for v in values[:4])

    rows = [[f"L{p['trained_layer']} H{p['trained_head']}", f"L{p['exact_layer']} H{p['exact_head']}", p["qk_cosine"],
             p["qk_relative_error"], p["ov_cosine"], p["ov_relative_error"], top(p["qk_singular_values"]["trained"]),
             top(p["qk_singular_values"]["exact"])] for p in result["weights"]["pairs"]]
    return ["<h3>Weights (QK and OV in the exact label basis)</h3>",
            table(["trained", "exact", "QK cosine", "QK rel. error", "OV cosine", "OV rel. error",
                   "QK sing. values (trained)", "QK sing. values (exact)"], rows, 2)]


PART = Part("weights", run, ("words", "head_matching"), ("weights",), SUMMARY, order=60, text=text, page=page,
            help="QK and OV circuits of matched heads in the exact basis")

"""The ``attention`` part: the attention table (pattern distances and the optimal one-to-one head matching,
computed by the shared input ``head_matching``; with a [CLS] readout, the attention from [CLS] to the first
symbol)."""

from __future__ import annotations

from typing import Any

from exactlens.analysis.diff.parts.base import Done, Part, number
from exactlens.markup import esc, table


def run(ctx: Any, request: Any) -> Done:
    return Done({"attention": ctx.values["head_matching"]})


def text(result: dict[str, Any]) -> list[str]:
    return [f"  head L{m['trained_layer']}H{m['trained_head']} ~ exact L{m['exact_layer']}"
            f"H{m['exact_head']}: TV distance {number(m['distance'])}" for m in result["attention"]["matching"]]


def page(result: dict[str, Any]) -> list[str]:
    a = result["attention"]
    rows = [[f"L{m['trained_layer']} H{m['trained_head']}", f"L{m['exact_layer']} H{m['exact_head']}", m["distance"]]
            for m in a["matching"]]
    out = ["<h3>Attention</h3>", f"<p>{esc(a['distance'])}; optimal one-to-one matching:</p>",
           table(["trained head", "exact head", "distance"], rows, 2)]
    if a.get("cls_to_first"):
        c = a["cls_to_first"]
        rows = [[r["length"], r["trained_summed"], r["exact_summed"], str(r["trained"]), str(r["exact"])]
                for r in c["rows"]]
        out += [
            f"<p>Attention from position {c['query_position']} (CLS) to position {c['key_position']} "
            "(the first symbol), mean over words; summed over layers (mean over heads), and per layer "
            "and head:</p>",
            table(["|w|", "trained, summed", "exact, summed", "trained per layer/head", "exact per layer/head"],
                  rows, 0),
        ]
    return out


PART = Part("attention", run, ("head_matching",), ("attention",), order=50, text=text, page=page,
            help="the attention table")

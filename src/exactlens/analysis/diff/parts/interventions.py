"""The ``interventions`` part: interchange interventions along the probe directions."""

from __future__ import annotations

from typing import Any

from exactlens.analysis.diff.parts.base import Done, Part, number
from exactlens.markup import table


def run(ctx: Any, request: Any) -> Done:
    from exactlens.analysis.diff.interventions import intervention_table

    probes, maps = ctx.values["probe_fits"]
    out = intervention_table(ctx.values["words"], ctx.side, ctx.exact, probes, maps, request.intervention_pairs,
                             request.seed)
    ctx.say("diff: interventions done")
    return Done({"interventions": out}, {"mean_iia": out["iia"], "mean_iia_changed": out["iia_changed"]})


def text(result: dict[str, Any]) -> list[str]:
    return [f"  intervention {f['label']} at {f['trained_site']}: IIA {number(f['iia'])}, "
            f"on changed pairs {number(f['iia_changed'])}" for f in result["interventions"]["features"]]


def page(result: dict[str, Any]) -> list[str]:
    rows = [[f["label"], f["trained_site"], f["exact_site"], f["r2"], f["pairs"], f["iia"], f["exact_changed"],
             f["iia_changed"]] for f in result["interventions"]["features"]]
    return [
        "<h3>Interchange interventions</h3>",
        "<p>IIA: fraction of (base, counterfactual) pairs on which the trained model, patched along the "
        "probe direction, decides as the exact model patched on the label; last column: only pairs whose "
        "exact decision the patch changes.</p>",
        table(["feature", "trained site", "exact site", "R^2", "pairs", "IIA", "exact changed", "IIA (changed)"],
              rows, 3),
    ]


PART = Part("interventions", run, ("words", "probe_fits"), ("interventions",), ("mean_iia", "mean_iia_changed"),
            order=70, text=text, page=page, help="interchange interventions along the probe directions")

"""The ``circuit`` part: the trained model's discovered circuit against the exact circuit (nodes mapped through
the head matching), with both circuits drawn."""

from __future__ import annotations

from typing import Any

from exactlens.analysis.diff.parts.base import Done, Part, number
from exactlens.markup import esc, num, table
from exactlens.markup.circuit import circuit_svg

SUMMARY = ("circuit_edge_auroc", "circuit_edge_jaccard", "circuit_edge_jaccard_between_components",
           "circuit_node_jaccard")
SHARED, TRAINED_ONLY, MISSED = "#2e7d32", "#e08a00", "#c62828"


def run(ctx: Any, request: Any) -> Done:
    from exactlens.analysis.diff.circuit import circuit_part

    out = circuit_part(ctx.model, ctx.exact_model, ctx.lengths, request.strings, request.seed,
                       ctx.values["head_matching"]["matching"], request.circuit_method, request.circuit_granularity,
                       request.circuit_ablation, carry=ctx.carry)
    summary = {} if not out["available"] else {"circuit_edge_auroc": out["edges"]["auroc"],
                                               "circuit_edge_jaccard": out["edges"]["jaccard"],
                                               # a post-LN model's every edge passes a norm that a norm-free
                                               # construction lacks: compare with norm chains joined too
                                               "circuit_edge_jaccard_between_components":
                                                   out["edges"]["between_components"]["jaccard"],
                                               "circuit_node_jaccard": out["nodes"]["jaccard"]}
    ctx.say("diff: circuit done")
    return Done({"circuit": out}, summary)


def text(result: dict[str, Any]) -> list[str]:
    c = result["circuit"]
    if not c["available"]:
        return [f"  circuit: not compared ({c['reason']})"]
    e, n = c["edges"], c["nodes"]
    return [f"  circuit ({c['method']}, {c['granularity']}, {c.get('ablation', 'resample')} ablation): "
            f"edges shared {e['shared']} of exact "
            f"{e['truth']} / found {e['found']} (Jaccard {number(e['jaccard'])}, AUROC {number(e['auroc'])}; "
            f"between components Jaccard {number(e['between_components']['jaccard'])}); "
            f"nodes shared {n['shared']} of {n['truth']} / {n['found']}; the method on the exact model: "
            f"edge AUROC {number(c['method_check']['edge_auroc'])}"]


def circuit_svgs(c: dict[str, Any]) -> tuple[str, str]:
    """The trained model's discovered circuit (green: an edge of the exact circuit; orange: not) and
    the exact circuit (green: found; red: missed; dashed: constant, left out of the scores)."""
    shared = set(c["edges"]["shared_edges"])
    found = [e for e in c["trained_edges"] if e["selected"]]
    trained = {"nodes": c["trained_nodes"], "graph_edges": c["trained_graph_edges"],
               "circuit_nodes": sorted({e["edge"].split("->")[0] for e in found}),
               "legend": "green: selected edge of the exact circuit; orange: selected, not in it; dashed: its exact "
                         "counterpart is constant (not scored); faint: not selected",
               "edges": [{"edge": e["edge"], "features": [f"score {e['score']:.3g}"], "constant": e["exact_constant"],
                          "colour": None if e["exact_constant"] else
                          SHARED if e["exact_edge"] in shared else TRAINED_ONLY} for e in found]}
    exact = dict(c["exact_circuit"])
    exact["legend"] = "green: found in the trained model; red: missed; dashed: constant (not scored)"
    exact["edges"] = [{**e, "colour": None if e["constant"] else (SHARED if e["edge"] in shared else MISSED)}
                      for e in exact["edges"]]
    return circuit_svg(trained), circuit_svg(exact)


def page(result: dict[str, Any]) -> list[str]:
    """Overlap tables and both circuits drawn."""
    c = result["circuit"]
    if not c["available"]:
        return [f"<h3>Circuit</h3><p>Not compared: {esc(c['reason'])}.</p>"]
    e, n, check = c["edges"], c["nodes"], c["method_check"]
    j = e["between_components"]
    rows = [["edges", e["truth"], e["found"], e["shared"], e["precision"], e["recall"], e["jaccard"], e["auroc"]],
            ["edges between components", j["truth"], j["found"], j["shared"], j["precision"], j["recall"],
             j["jaccard"], j["auroc"]],
            ["nodes", n["truth"], n["found"], n["shared"], n["precision"], n["recall"], n["jaccard"], n["auroc"]]]
    trained_svg, exact_svg = circuit_svgs(c)
    return ["\n".join([
        "<h3>Circuit: the trained model's, found by discovery, against the exact one</h3>",
        f"<p>{esc(c['method'])} at {esc(c['granularity'])} granularity, {esc(c.get('ablation', 'resample'))} "
        f"ablation (threshold {num(c['threshold'], 4)}) on "
        f"{esc(c['words'])} words of lengths {esc(c['lengths'])}; trained nodes are mapped onto the exact ones "
        "through the head matching above (a layer's MLP and norms follow its heads). The exact circuit is read "
        f"off the construction's weights; its {esc(e['constant_left_out'])} constant edges are left out. "
        f"{esc(e['truth_with_counterpart'])} of its {esc(e['truth'])} scored edges have a counterpart in the "
        f"trained graph (recall over those: {num(e['recall_of_reachable'])}); between components (each post-LN "
        "norm chain joined into an edge from the component before it to the one after, on both sides) "
        f"{esc(e['between_components']['truth_with_counterpart'])} have one.</p>",
        table(["level", "exact circuit", "found", "shared", "precision", "recall", "Jaccard", "AUROC of scores"],
              rows),
        f"<p>The same method on the exact model, against its own circuit: edge AUROC {num(check['edge_auroc'])}, "
        f"precision {num(check['precision'])}, recall {num(check['recall'])} (a low overlap above means "
        "something only where this is high).</p>",
        f'<div class="pair"><div><h4>trained (discovered)</h4><div style="overflow-x:auto">{trained_svg}</div></div>'
        f'<div><h4>exact (ground truth)</h4><div style="overflow-x:auto">{exact_svg}</div></div></div>',
    ])]


PART = Part("circuit", run, ("head_matching",), ("circuit",), SUMMARY, order=90, page_order=34, text=text,
            page=page, help="the trained model's discovered circuit against the exact circuit")

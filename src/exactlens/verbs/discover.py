"""``exactlens discover TARGET --method METHOD [--against NAME] [--metrics auroc,cpr,cmd]``: circuit discovery.

Runs a discovery method on the edge graph (exactlens.analysis.circuit.discovery): node-level
activation patching, edge attribution patching (EAP, EAP-IG on inputs or activations), exact edge
patching, or ACDC-style pruning; or reads a circuit from a MIB circuit file (--score-file). A
construction is scored against its own ground-truth circuit: ROC curve, AUROC over edges and nodes,
and precision and recall of the edges the method selects at its own threshold; any model gets MIB's
faithfulness curve (CPR, CMD) of the method's ranking. A checkpoint trained with ``train --siit`` is
scored against the circuit its run recorded, without --against (exactlens.analysis.circuit.recorded).
Any model (a checkpoint) is compared
with the circuit of --against (a construction of its task, run on the same words) after mapping its
nodes onto the construction's by layer and head index: edge and node overlap, AUROC, and the overlap
between components (post-LN norm chains joined), so depth, heads and layer norms may differ
(`exactlens diff --parts attention,circuit` matches heads by their attention instead).
"""

from __future__ import annotations

from typing import Any

from exactlens.analysis.circuit.request import DiscoverRequest
from exactlens.errors import ExactLensError
from exactlens.results import Result, View
from exactlens.verbs import VerbSpec, register_verb, tell
from exactlens.verbs.circuit import foreign_target
from exactlens.viz.backend import pyplot

__all__ = ["DiscoverRequest", "format_discover_text", "run"]


def run(request: DiscoverRequest) -> Result:
    from exactlens.analysis.circuit.evaluate import discover_report

    target, foreign = foreign_target(request)
    if foreign is not None and request.against is None and not request.score_file:
        raise ExactLensError(f"{foreign['source']} has no ground-truth circuit of its own: give against=NAME, a "
                             f"construction of task {foreign['task']['name']!r} (see `exactlens list`)")
    what = f"the circuit of {request.score_file}" if request.score_file else request.method
    tell(f"discover: {what} on {request.target if foreign is None else foreign['source']}")
    data = discover_report(target, request=request)
    if foreign is not None:
        data["foreign"] = foreign
    return Result("discover", data)


def _f(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


def _faithfulness_text(d: dict[str, Any], what: str) -> str:
    if d.get("cpr") is None:
        return f"{what}: faithfulness undefined: {d.get('faithfulness_undefined', '-')}"
    curve = " ".join(f"{p['size'] * 100:g}%:{p['f']:.2f}" for p in d["faithfulness"])
    return f"{what}: CPR {d['cpr']:.3f}, CMD {d['cmd']:.3f}; f by size {curve}"


def format_discover_text(result: dict[str, Any]) -> str:
    how = (f"the circuit of {result['details']['score_file']}" if result["method"] == "file"
           else f"{result['method']}, threshold {result['threshold']:g}")
    lines = [f"{result['model']}: {how} at {result['granularity']} granularity, {result['ablation']} "
             f"ablation, {result['seconds']:.2f} s; selected {len(result['selected'])} of "
             f"{len(result['edges'])} edges"]
    top = sorted(result["edges"], key=lambda e: -e["score"])[:12]
    lines += [f"  {e['edge']:<30}{e['score']:.4g}" + ("  *" if e["selected"] else "") for e in top]
    if "score" in result:
        s = result["score"]
        truth = result.get("truth")
        if truth:
            lines.append(f"ground truth: {truth['what']} (SIIT against {truth['construction']})")
        lines.append(f"against the ground truth ({s['n_positive']} circuit edges, {s['n_constant']} constant ones "
                     f"left out): edge AUROC {_f(s['edge_auroc'])}, node AUROC {_f(s['node_auroc'])}, precision "
                     f"{_f(s['precision'])}, recall {_f(s['recall'])}")
        best = s.get("best_cut")
        if best:
            lines.append(f"best cut the scores allow (oracle, read from the truth): score >= {best['cut']:.4g} selects "
                         f"{best['n_selected']}: F1 {best['f1']:.3f}, precision {best['precision']:.3f}, recall "
                         f"{best['recall']:.3f}")
    eq = result.get("equivalent")
    if eq and len(eq["candidates"]) > 1:
        c = eq["candidates"][eq["best"]]
        lines.append(f"best-matching valid circuit: {eq['best']} ({c['n_edges']} observable edges): F1 {_f(c['f1'])}, "
                     f"precision {_f(c['precision'])}, recall {_f(c['recall'])}")
    if eq and eq.get("swappable_heads"):
        pairs = ", ".join(" <-> ".join(p) for p in eq["swappable_heads"])
        lines.append(f"swappable heads (identical weights): {pairs}")
    if "faithfulness" in result:
        lines.append(_faithfulness_text(result, "faithfulness (MIB's sizes)"))
    if "exact_circuit" in result:
        what = "the recorded circuit ranked alone" if result.get("truth") else "the exact circuit ranked alone"
        lines.append(_faithfulness_text(result["exact_circuit"], what))
    if result.get("truth") and not result["truth"]["scored"]:
        lines.append(f"SIIT model of {result['truth']['construction']}: {result['truth']['what']}")
    if result.get("circuit_file"):
        lines.append(f"written in MIB's circuit format to {result['circuit_file']}")
    if "overlap" in result:
        o = result["overlap"]
        if not o["comparable"]:
            lines.append(f"not comparable: {o['reason']}")
        else:
            e, joined, n = o["edges"], o["edges"]["between_components"], o["nodes"]
            lines.append(f"against the circuit of {o['against']} (nodes mapped by {o['mapping']}; "
                         f"{e['constant_left_out']} constant edges left out):")
            lines.append(f"  edges: jaccard {_f(e['jaccard'])}, precision {_f(e['precision'])}, recall "
                         f"{_f(e['recall'])}, AUROC {_f(e['auroc'])}; {e['truth_with_counterpart']} of {e['truth']} "
                         f"circuit edges have a counterpart")
            lines.append(f"  between components (norm chains joined): jaccard {_f(joined['jaccard'])}, recall "
                         f"{_f(joined['recall'])}, AUROC {_f(joined['auroc'])}; {joined['truth_with_counterpart']} "
                         f"of {joined['truth']} have a counterpart")
            lines.append(f"  nodes: jaccard {_f(n['jaccard'])}, AUROC {_f(n['auroc'])}; missed "
                         f"{', '.join(n['exact_only']) or 'none'}; extra {', '.join(n['trained_only']) or 'none'}")
    return "\n".join(lines)


def headline(d: dict[str, Any]) -> list[tuple[str, Any]]:
    rows = [("method", d["method"]), ("selected edges", f"{len(d['selected'])} of {len(d['edges'])}")]
    if "score" in d:
        rows += [("edge AUROC", d["score"]["edge_auroc"]), ("node AUROC", d["score"]["node_auroc"]),
                 ("precision", d["score"]["precision"]), ("recall", d["score"]["recall"])]
    overlap = d.get("overlap")
    if overlap and overlap.get("comparable"):
        rows += [("against", overlap["against"]), ("edge jaccard", overlap["jaccard"]),
                 ("jaccard between components", overlap["edges"]["between_components"]["jaccard"]),
                 ("node jaccard", overlap["nodes"]["jaccard"])]
    elif overlap:
        rows.append(("against", overlap["reason"]))
    if "faithfulness" in d:
        rows += [("CPR", d["cpr"]), ("CMD", d["cmd"])]
    if "exact_circuit" in d:
        rows += [("exact circuit CPR / CMD", f"{_f(d['exact_circuit']['cpr'])} / {_f(d['exact_circuit']['cmd'])}")]
    return rows + [("seconds", d["seconds"])]


def plot(result: Result) -> Any:
    curves = "faithfulness" in result and result.get("cpr") is not None
    if "score" not in result and not curves:
        return None
    plt = pyplot()
    panels = int("score" in result) + int(curves)
    fig, axes = plt.subplots(1, panels, figsize=(3.6 * panels, 3.2), squeeze=False)
    axes = list(axes[0])
    if "score" in result:
        ax = axes.pop(0)
        roc = result["score"]["roc"]
        ax.plot([p[0] for p in roc], [p[1] for p in roc], drawstyle="steps-post", marker=".")
        ax.plot([0, 1], [0, 1], color="#bbb", lw=0.8)
        ax.set_xlabel("false-positive rate")
        ax.set_ylabel("true-positive rate")
        ax.set_title(f"{result['method']} on {result['model']}: AUROC {_f(result['score']['edge_auroc'])}", fontsize=9)
    if curves:
        ax = axes.pop(0)
        for data, label in ((result, result["method"]), (result.get("exact_circuit"), "exact circuit")):
            if data and data.get("cpr") is not None:
                points = data["faithfulness"]
                ax.plot([p["size"] * 100 for p in points], [p["f"] for p in points], marker=".",
                        label=f"{label}: CPR {data['cpr']:.2f}, CMD {data['cmd']:.2f}")
        ax.axhline(1.0, color="#bbb", lw=0.8)
        ax.set_xscale("log")
        ax.set_xlabel("edges kept (% of the graph, MIB's sizes)")
        ax.set_ylabel("faithfulness f")
        ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


register_verb(VerbSpec("discover", "circuit discovery (patching, EAP, ACDC) scored against the ground truth",
                       DiscoverRequest, run, views={"discover": View(headline, format_discover_text, plot)},
                       description=__doc__.split("\n\n")[1], order=75))

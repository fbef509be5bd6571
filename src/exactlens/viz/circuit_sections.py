"""The report's circuit parts: each construction's ground-truth circuit (drawn, with its ablation
check), and a section scoring the discovery methods against the circuits of the catalogue."""

from __future__ import annotations

from typing import Any

from exactlens.markup.circuit import circuit_svg
from exactlens.progress import bar
from exactlens.viz.page import ReportContext, Section, esc, fmt, progress, table
from exactlens.viz.parallel import per_construction

QUICK_DISCOVERY = ("first", "parity", "one")  # the quick report scores these (where present)


def _circuit_settings(ctx: ReportContext) -> dict[str, int]:
    return {"words": 16, "span": 4} if ctx.quick else {"words": 64, "span": 6}


def circuit_html(ctx: ReportContext, name: str, record: dict[str, Any]) -> str:
    """The construction's circuit at qkv granularity, read off its weights and checked by resample
    ablation on the task's words."""
    from exactlens.analysis.circuit.evaluate import circuit_report, default_lengths
    from exactlens.constructions import get
    from exactlens.tasks import of_model

    settings = _circuit_settings(ctx)
    model = get(name).make(dtype="float64")
    lengths = default_lengths(of_model(model))[: settings["span"]]
    result = circuit_report(model, granularity="qkv", lengths=lengths, words=settings["words"])
    record["circuit"] = result
    check = result["check"]
    rows = [[e["edge"], ", ".join(e["features"]), "yes" if e["constant"] else "no",
             check["inside_changed"].get(e["edge"], "-")] for e in result["edges"]]
    return "\n".join([
        "<h3>Circuit</h3>",
        f"<p>Read off the weights (<code>exactlens circuit {esc(name)} --granularity qkv</code>): "
        f"{result['n_circuit_edges']} of {result['n_edges']} edges. Resample ablation on {check['n_words']} words "
        f"(lengths {esc(', '.join(map(str, result['lengths'])))}): every edge outside the circuit ablated at once "
        f"changes <b>{check['outside_changed']}</b> decisions; circuit edges whose ablation alone changes none: "
        f"{esc(', '.join(check['unnecessary']) or 'none')}.</p>",
        f'<div class="scroll">{circuit_svg(result)}</div>',
        table(["edge", "features carried", "constant", "decisions changed when ablated alone"], rows),
    ])


REPORT_METHODS = ("patching", "eap", "eap-ig-inputs", "acdc")  # edge-patching and EAP-IG on activations: the benchmark


def _discovery_names(ctx: ReportContext) -> list[str]:
    return [n for n in ctx.names if n in QUICK_DISCOVERY] if ctx.quick else list(ctx.names)


SMALLER = {"tracr-shuffle_dyck2": {"words": 16}}
"""The full report's constructions scored at a smaller setting than the others (stated on the page, with
SMALLER_WHY)."""
SMALLER_WHY = ("the largest graph of the catalogue (835 head / 2071 qkv edges): at 32 words per length its discovery "
               "rows were the full report's longest task (136 s of CPU on 2026-11-28, most of it ACDC's edge-by-edge "
               "pruning), so it runs at half the words; docs/circuits.md, \"Time of the whole catalogue\", compares "
               "both")


def _discovery_settings(ctx: ReportContext, name: str | None = None) -> dict[str, int]:
    """The catalogue's words per length and span of lengths; with ``name``, that construction's own (SMALLER)."""
    if ctx.quick:
        return {"words": 16, "span": 3}
    return {"words": 32, "span": 4, **(SMALLER.get(name, {}) if name is not None else {})}


def _smaller(ctx: ReportContext, names: list[str]) -> dict[str, dict[str, Any]]:
    """The constructions of ``names`` at a smaller setting: {name: {its settings, "reason"}}."""
    return {} if ctx.quick else {n: {**SMALLER[n], "reason": SMALLER_WHY} for n in names if n in SMALLER}


def discovery_rows(ctx: ReportContext, name: str) -> list[dict[str, Any]]:
    """The catalogue's rows of one construction (its part of the section, run where the report puts it), each
    with the words per length it ran at."""
    from exactlens.analysis.circuit.evaluate import catalogue

    settings = _discovery_settings(ctx, name)
    return [{**row, "words": settings["words"]} for row in catalogue([name], methods=REPORT_METHODS, **settings)]


@per_construction(discovery_rows, _discovery_names)
def discovery_sections(ctx: ReportContext) -> list[Section]:
    from exactlens.analysis.circuit.scoring import best_cut_text

    names = _discovery_names(ctx)
    if not names:
        return []
    progress(f"report: circuit discovery on {len(names)} constructions")
    settings, smaller = _discovery_settings(ctx), _smaller(ctx, names)
    ctx.record_settings(circuit_discovery={**settings, "methods": list(REPORT_METHODS), "smaller": smaller})
    try:
        rows = [row for name in bar(names, desc="circuit catalogue", unit="construction")
                for row in ctx.part(discovery_rows, name)]
    except Exception as err:
        return [Section("Circuit discovery", "circuit-discovery", ctx.error("circuit discovery", err))]
    data = ctx.write_json("circuit_discovery.json", {"settings": {**settings, "smaller": smaller}, "rows": rows})
    body = [[r["construction"] + (f" ({r['words']} words)" if r["construction"] in smaller else ""),
             r["granularity"], r["method"], f"{r['n_positive']} / {r['n_edges']}",
             fmt(r["edge_auroc"], 3), fmt(r["node_auroc"], 3), fmt(r["precision"], 3), fmt(r["recall"], 3),
             best_cut_text(r.get("best_cut")), _cpr_cmd(r.get("cpr"), r.get("cmd")),
             _cpr_cmd(r.get("exact_cpr"), r.get("exact_cmd")),
             f"{r['seconds']:.2f} + {r.get('faithfulness_seconds', 0.0):.2f}"] for r in rows]
    text = (
        "<p>Each construction's circuit is read off its weights (see its section) and is the ground truth for "
        "the discovery methods run on the same edge graph: node-level activation patching, edge attribution "
        "patching (EAP), EAP with integrated gradients on inputs (5 steps) and ACDC-style pruning (exact edge "
        "patching and EAP-IG on activations: benchmarks/circuit_discovery.py), with resample ablation on the "
        "task's words "
        f"({settings['words']} per length, the shortest {settings['span']} lengths). Positives are the "
        "circuit's edges whose activation varies (constant ones are left out: no ablation can see them). "
        "AUROC over edges and nodes; precision and recall at each method's own threshold; the best cut is "
        "the F1-best threshold on the method's scores, found with the truth (where its cut should have sat; "
        "* where it is 0: the best selection takes edges the method did not score. Scores below 1e-9 of the "
        "top one count as 0 everywhere here: rounding residue must not rank). CPR and CMD are MIB's: the "
        "faithfulness f = 1 - D(C) / D(empty) of the method's top 0.1 % ... 100 % of edges, its area (CPR, 1 "
        "best) and its area away from 1 (CMD, 0 best), beside the exact circuit's own (ranked alone; '-' "
        "where f is undefined: the ablation moves nothing). Time: the method's seconds + its curve's. "
        f'Data: '
        f'<a href="{esc(data)}">{esc(data)}</a>.</p>'
    ) + "".join(f"<p>Stated smaller setting: <b>{esc(n)}</b> at {s['words']} words per length (the others "
                f"{settings['words']}): {esc(s['reason'])}.</p>" for n, s in smaller.items())
    headers = ["construction", "granularity", "method", "circuit / edges", "edge AUROC", "node AUROC", "precision",
               "recall", "best cut: F1 (precision / recall)", "CPR / CMD", "exact circuit CPR / CMD", "s"]
    return [Section("Circuit discovery", "circuit-discovery", text + table(headers, body))]


def _cpr_cmd(cpr: float | None, cmd: float | None) -> str:
    return "-" if cpr is None else f"{cpr:.2f} / {cmd:.2f}"

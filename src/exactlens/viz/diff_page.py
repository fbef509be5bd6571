"""HTML for a circuit diff: summary, behaviour, the probe table and the DAS alignment as heat maps, head matching,
weights, interventions, and circuitsvis attention views of both models side by side.

:func:`diff_html` gives an HTML fragment (used by the report section); :func:`write_diff_page`
writes a standalone page whose attention views (offline circuitsvis pages) sit in a folder next to
it. Every text is escaped.
"""

from __future__ import annotations

import contextlib
import html
from pathlib import Path
from typing import Any

import torch

from exactlens.outputs import check_output, naming, staged

_CSS = """
body { font-family: system-ui, sans-serif; margin: 0 auto; max-width: 1200px; padding: 1em 2em; color: #222; }
table { border-collapse: collapse; margin: .5em 0 1em; font-size: .85em; display: block; max-width: 100%;
        overflow-x: auto; }
img, svg { max-width: 100%; height: auto; } code { overflow-wrap: anywhere; }
th, td { border: 1px solid #ddd; padding: 2px 6px; text-align: right; }
th { background: #f4f4f4; } td.l { text-align: left; }
.pair { display: flex; gap: 1em; } .pair > div { flex: 1; min-width: 0; }
iframe { width: 100%; height: 560px; border: 1px solid #ddd; }
code { background: #f3f3f3; padding: 0 .2em; }
"""


def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _n(value: Any, digits: int = 3) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return _e(value)


def _table(headers: list[str], rows: list[list[Any]], left: int = 1) -> str:
    head = "".join(f"<th>{_e(h)}</th>" for h in headers)
    body = "".join(
        "<tr>" + "".join(f"<td{' class=l' if j < left else ''}>{_n(v)}</td>" for j, v in enumerate(r)) + "</tr>"
        for r in rows
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _heat(r2: float | None) -> str:
    """Cell colour: white (R^2 <= 0) to green (R^2 = 1); grey when there is no score."""
    if r2 is None:
        return "#eee"
    v = max(0.0, min(1.0, r2))
    return f"rgb({int(255 - 155 * v)},{int(255 - 55 * v)},{int(255 - 155 * v)})"


def probe_heatmap(probes: dict[str, Any]) -> str:
    sites = probes["sites"]
    head = "<th>feature</th><th>positions</th><th>exact site</th>" + "".join(
        f"<th><code>{_e(s)}</code></th>" for s in sites
    )
    rows = []
    for f in probes["features"]:
        cells = "".join(f'<td style="background:{_heat(f["r2"][s])}">{_n(f["r2"][s])}</td>' for s in sites)
        rows.append(
            f"<tr><td class=l>{_e(f['label'])}</td><td class=l>{_e(f['positions'])}</td>"
            f"<td class=l><code>{_e(f['exact_site'])}</code></td>{cells}</tr>"
        )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>"


VERDICT_MARKS = {"computed": "✓ computed", "not found": "not found", "indistinguishable from the answer": "= answer",
                 "illusion suspected": "⚠ illusion", "unconverged": "unconverged",
                 "model does not solve the task": "task unsolved", "too few pairs": "too few pairs",
                 "in the input": "in the input", "untestable": "untestable"}


def _ci(ci: Any) -> str:
    return "–" if not ci else f"[{ci[0]:.2f}, {ci[1]:.2f}]"


def iia_heatmap(rows: list[dict[str, Any]], sites: list[str]) -> str:
    """Variables x sites: DAS IIA on held-out pairs whose answer changes, each cell with its verdict
    and the 95 % interval (the chosen dimension, the changed pairs, the random-subspace mean and p95
    and the untrained baseline in the tooltip; grey where no pair changes or the site was not fit).
    An answer-determined variable's localization test (every position of a component output) is a
    row of its own."""
    variables: list[tuple[str, str, str]] = []
    cells: dict[tuple[str, str, str], dict[str, Any]] = {}
    for r in rows:
        key = (r["variable"], r["origin"], r.get("test", "interchange"))
        if key not in variables:
            variables.append(key)
        cells[(r["variable"], r.get("test", "interchange"), r["site"])] = r
    head = "<th>variable</th><th>from</th>" + "".join(f"<th><code>{_e(s)}</code></th>" for s in sites)
    body = []
    for name, origin, test in variables:
        tds = []
        for site in sites:
            r = cells.get((name, test, site))
            if r is None:
                tds.append('<td style="background:#eee">-</td>')
                continue
            verdict = r.get("verdict")
            tip = (f"{verdict or ''}; IIA {_n(r['iia_changed'])} {_ci(r.get('iia_ci'))} on "
                   f"{r.get('changed_pairs', '-')} changed pairs; {r['position']} positions, dim {r['dim']}, "
                   f"{r['pairs']} pairs; lift {_n(r.get('lift'))}; random subspace {_n(r['random_iia_changed'])} "
                   f"(p95 {_n(r.get('random_iia_p95'))}), untrained {_n(r['untrained_iia_changed'])}; training IIA "
                   f"{_n(r.get('training_iia_changed'))}")
            mark = f"<br><small>{_e(VERDICT_MARKS.get(verdict, verdict))}</small>" if verdict else ""
            tds.append(f'<td style="background:{_heat(r["iia_changed"])}" title="{_e(tip)}">'
                       f'{_n(r["iia_changed"])}<br><small>{_e(_ci(r.get("iia_ci")))} k={r["dim"]}</small>'
                       f'{mark}</td>')
        label = name if test != "localization" else f"{name} (every position)"
        body.append(f"<tr><td class=l>{_e(label)}</td><td class=l>{_e(origin)}</td>{''.join(tds)}</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


SHARED, TRAINED_ONLY, MISSED = "#2e7d32", "#e08a00", "#c62828"


def circuit_svgs(c: dict[str, Any]) -> tuple[str, str]:
    """The trained model's discovered circuit (green: an edge of the exact circuit; orange: not) and
    the exact circuit (green: found; red: missed; dashed: constant, left out of the scores)."""
    from exactlens.viz.circuit import circuit_svg

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


def circuit_html(c: dict[str, Any]) -> str:
    """The ``circuit`` part: overlap tables and both circuits drawn."""
    if not c["available"]:
        return f"<h3>Circuit</h3><p>Not compared: {_e(c['reason'])}.</p>"
    e, n, check = c["edges"], c["nodes"], c["method_check"]
    j = e["between_components"]
    rows = [["edges", e["truth"], e["found"], e["shared"], e["precision"], e["recall"], e["jaccard"], e["auroc"]],
            ["edges between components", j["truth"], j["found"], j["shared"], j["precision"], j["recall"],
             j["jaccard"], j["auroc"]],
            ["nodes", n["truth"], n["found"], n["shared"], n["precision"], n["recall"], n["jaccard"], n["auroc"]]]
    trained_svg, exact_svg = circuit_svgs(c)
    return "\n".join([
        "<h3>Circuit: the trained model's, found by discovery, against the exact one</h3>",
        f"<p>{_e(c['method'])} at {_e(c['granularity'])} granularity, {_e(c.get('ablation', 'resample'))} "
        f"ablation (threshold {_n(c['threshold'], 4)}) on "
        f"{_e(c['words'])} words of lengths {_e(c['lengths'])}; trained nodes are mapped onto the exact ones "
        "through the head matching above (a layer's MLP and norms follow its heads). The exact circuit is read "
        f"off the construction's weights; its {_e(e['constant_left_out'])} constant edges are left out. "
        f"{_e(e['truth_with_counterpart'])} of its {_e(e['truth'])} scored edges have a counterpart in the "
        f"trained graph (recall over those: {_n(e['recall_of_reachable'])}); between components (each post-LN "
        "norm chain joined into an edge from the component before it to the one after, on both sides) "
        f"{_e(e['between_components']['truth_with_counterpart'])} have one.</p>",
        _table(["level", "exact circuit", "found", "shared", "precision", "recall", "Jaccard", "AUROC of scores"],
               rows),
        f"<p>The same method on the exact model, against its own circuit: edge AUROC {_n(check['edge_auroc'])}, "
        f"precision {_n(check['precision'])}, recall {_n(check['recall'])} (a low overlap above means "
        "something only where this is high).</p>",
        f'<div class="pair"><div><h4>trained (discovered)</h4><div style="overflow-x:auto">{trained_svg}</div></div>'
        f'<div><h4>exact (ground truth)</h4><div style="overflow-x:auto">{exact_svg}</div></div></div>',
    ])


def diff_html(result: dict[str, Any], views: tuple[str, str] | None = None) -> str:
    """The diff as an HTML fragment; ``views``: relative links to the trained and exact attention pages."""
    s = result["summary"]
    parts = [
        f"<p>Trained model ({_e(result['trained'].get('kind'))}: "
        f"{_e(result['trained'].get('path') or result['trained'].get('name') or result['trained']['class'])}) "
        f"against <code>{_e(result['exact']['name'])}</code> ({_e(result['exact']['paper'])}), word lengths "
        f"{_e(result['settings']['lengths'])}, {_e(result['settings']['strings'])} words per length.</p>",
        _table(["summary", "value"], [[k, v] for k, v in s.items()]),
    ]
    if "behaviour" in result:
        rows = [
            [r["length"], r["strings"], r["trained_accuracy"], r["exact_accuracy"], r["agreement"]]
            for r in result["behaviour"]["rows"]
        ]
        parts += ["<h3>Behaviour</h3>", _table(["|w|", "words", "trained acc", "exact acc", "agreement"], rows, 0)]
    if "probes" in result:
        parts += [
            "<h3>Named features: held-out R^2 of a ridge probe per trained site</h3>",
            "<p>Row: a residual label of the exact model (its value after the exact model's last layer; "
            "<em>readout</em> rows use only the readout position). Column: a hook site of the trained "
            "model. Green = the feature is a linear function of that activation on held-out words.</p>",
            probe_heatmap(result["probes"]),
        ]
    if result.get("alignment"):
        details = result.get("alignment_details", {})
        best = [[name, v["verdict"], v["site"] or "(no site claimed)", v["position"] or "–", v["dim"], v["iia"],
                 _ci(v["iia_ci"]), v["changed_pairs"], v["lift"], v["random_iia_p95"]]
                for name, v in details.get("verdicts", {}).items()]
        parts += [
            "<h3>Causal alignment (DAS): interchange-intervention accuracy per variable and site</h3>",
            "<p>Row: a causal variable of the task or a residual label of the exact model. Column: a hook site "
            "of the trained model. Cell: the accuracy with which swapping a learned k-dimensional subspace "
            "(k chosen on validation pairs) between two words makes the trained model give the answer the "
            "variable's swap predicts, on held-out pairs whose answer changes. Green where the model "
            "<em>uses</em> the variable there; compare with the probe map above, which says only where it is "
            "readable.</p>",
            iia_heatmap(result["alignment"], details.get("sites") or sorted({r["site"] for r in result["alignment"]})),
            "<p>One verdict per variable (docs/diff.md, \"How to read the alignment\"): its best site chosen on "
            "validation pairs, the IIA on held-out test pairs that the patch has to change (the counterfactual "
            "differs from the model's own decision) with its 95 % Wilson interval, the lift over not patching "
            "and the 95th percentile of 20 random subspaces of the same dimension:</p>",
            _table(["variable", "verdict", "site", "positions", "k", "IIA (changed)", "95 % interval", "changed pairs",
                    "lift", "random p95"], best, 4),
        ]
    if "circuit" in result:
        parts.append(circuit_html(result["circuit"]))
    if "attention" in result:
        a = result["attention"]
        rows = [
            [f"L{m['trained_layer']} H{m['trained_head']}", f"L{m['exact_layer']} H{m['exact_head']}", m["distance"]]
            for m in a["matching"]
        ]
        parts += [
            "<h3>Attention</h3>",
            f"<p>{_e(a['distance'])}; optimal one-to-one matching:</p>",
            _table(["trained head", "exact head", "distance"], rows, 2),
        ]
        if a.get("cls_to_first"):
            c = a["cls_to_first"]
            rows = [
                [r["length"], r["trained_summed"], r["exact_summed"], str(r["trained"]), str(r["exact"])]
                for r in c["rows"]
            ]
            parts += [
                f"<p>Attention from position {c['query_position']} (CLS) to position {c['key_position']} "
                "(the first symbol), mean over words; summed over layers (mean over heads), and per layer "
                "and head:</p>",
                _table(
                    ["|w|", "trained, summed", "exact, summed", "trained per layer/head", "exact per layer/head"],
                    rows,
                    0,
                ),
            ]
    if "weights" in result:
        rows = [
            [
                f"L{p['trained_layer']} H{p['trained_head']}",
                f"L{p['exact_layer']} H{p['exact_head']}",
                p["qk_cosine"],
                p["qk_relative_error"],
                p["ov_cosine"],
                p["ov_relative_error"],
                " ".join(f"{v:.3g}" for v in p["qk_singular_values"]["trained"][:4]),
                " ".join(f"{v:.3g}" for v in p["qk_singular_values"]["exact"][:4]),
            ]
            for p in result["weights"]["pairs"]
        ]
        parts += [
            "<h3>Weights (QK and OV in the exact label basis)</h3>",
            _table(
                [
                    "trained",
                    "exact",
                    "QK cosine",
                    "QK rel. error",
                    "OV cosine",
                    "OV rel. error",
                    "QK sing. values (trained)",
                    "QK sing. values (exact)",
                ],
                rows,
                2,
            ),
        ]
    if "interventions" in result:
        rows = [
            [
                f["label"],
                f["trained_site"],
                f["exact_site"],
                f["r2"],
                f["pairs"],
                f["iia"],
                f["exact_changed"],
                f["iia_changed"],
            ]
            for f in result["interventions"]["features"]
        ]
        parts += [
            "<h3>Interchange interventions</h3>",
            "<p>IIA: fraction of (base, counterfactual) pairs on which the trained model, patched along the "
            "probe direction, decides as the exact model patched on the label; last column: only pairs whose "
            "exact decision the patch changes.</p>",
            _table(
                ["feature", "trained site", "exact site", "R^2", "pairs", "IIA", "exact changed", "IIA (changed)"],
                rows,
                3,
            ),
        ]
    if views is not None:
        parts += [
            "<h3>Attention on one word (circuitsvis)</h3>",
            f'<div class="pair"><div><h4>trained</h4><iframe src="{_e(views[0])}"></iframe></div>'
            f'<div><h4>exact</h4><iframe src="{_e(views[1])}"></iframe></div></div>',
        ]
    return "\n".join(parts)


def attention_views(
    result: dict[str, Any], trained: Any, folder: Path, word_length: int = 8, bundle_dir: Path | None = None
) -> tuple[Path, Path] | None:
    """Write circuitsvis pages of both models on one word into ``folder``, loading circuitsvis's
    JavaScript from ``bundle_dir`` (default: ``folder``; a report passes its shared assets folder);
    None if the trained model is not an ExactTransformer (the views read cfg.vocab)."""
    from exactlens.analysis.diff import resolve_trained
    from exactlens.constructions import get
    from exactlens.model import ExactTransformer
    from exactlens.viz.attention import attention_view

    model, _ = resolve_trained(trained)
    if not isinstance(model, ExactTransformer):
        return None
    construction = get(result["exact"]["name"])
    exact = construction.make(dtype=result["settings"]["exact_dtype"], **result["exact"]["params"])
    lang = construction.lang()
    length = min(word_length, max(result["settings"]["lengths"]))
    ids = lang.sample(length, 1, torch.Generator().manual_seed(result["settings"]["seed"]))
    tokens = lang.encode(ids).tokens[0]
    word = lang.decode(ids)[0]
    folder.mkdir(parents=True, exist_ok=True)
    shared = folder if bundle_dir is None else bundle_dir
    t = attention_view(model, tokens, folder / "trained_attention.html", f"trained model on w = {word}", shared)
    e = attention_view(exact, tokens, folder / "exact_attention.html", f"{construction.name} on w = {word}", shared)
    return t, e


def write_diff_page(result: dict[str, Any], path: str | Path, trained: Any = None, *, overwrite: bool = False) -> Path:
    """A standalone page; with ``trained`` (model, checkpoint or name) also the attention views,
    written to PATH_stem_files/ next to it. Both are checked before anything is written and each
    appears in one step when complete (exactlens.outputs); existing ones are refused unless
    ``overwrite``."""
    path = Path(path)
    folder = path.parent / f"{path.stem}_files"
    check_diff_page(path, overwrite, with_views=trained is not None)
    views = written = None
    title = f"exactlens diff against {result['exact']['name']}"
    # the page and its views are written before either is moved into place: a write error in one leaves both
    # as they were (the views folder, entered last, is moved in first)
    with contextlib.ExitStack() as stack:
        page_tmp = stack.enter_context(staged(path, overwrite=overwrite, kind="file", what="diff page"))
        if trained is not None:
            tmp = stack.enter_context(staged(folder, overwrite=overwrite, what="attention views folder"))
            written = attention_views(result, trained, tmp)
            if written is not None:
                views = tuple((folder / p.relative_to(tmp)).relative_to(path.parent).as_posix() for p in written)
        page = (
            f'<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n<title>{_e(title)}</title>\n'
            f"<style>{_CSS}</style>\n</head>\n<body>\n<h1>{_e(title)}</h1>\n{diff_html(result, views)}\n"
            "</body>\n</html>\n"
        )
        with naming(path):
            page_tmp.write_text(page, encoding="utf-8")
    if trained is not None and written is None:  # not an ExactTransformer: no views (the empty folder goes again)
        folder.rmdir()
    return path


def check_diff_page(path: str | Path, overwrite: bool = False, with_views: bool = True) -> None:
    """Check, before a diff is computed, that its page (and views folder) can be written."""
    path = Path(path)
    check_output(path, overwrite=overwrite, kind="file", what="diff page")
    if with_views:
        check_output(path.parent / f"{path.stem}_files", overwrite=overwrite, what="attention views folder")

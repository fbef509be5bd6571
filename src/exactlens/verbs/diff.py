"""``exactlens diff CHECKPOINT_DIR --against NAME [--html FILE] [--json]``: a trained model against an exact
construction (:func:`exactlens.analysis.diff.diff`).

The trained side is a checkpoint directory (ExactTransformer.save) or a construction name (e.g.
``first-flawed`` against ``first``); in Python also a model or a train result. The options are
:class:`exactlens.analysis.diff.request.DiffRequest`.
"""

from __future__ import annotations

from typing import Any

from exactlens.analysis.diff.request import DiffRequest
from exactlens.errors import ExactLensError
from exactlens.results import Result, View
from exactlens.verbs import VerbSpec, register_verb, tell
from exactlens.viz.backend import pyplot

__all__ = ["DiffRequest", "format_diff_text", "run"]


def _trained(target: Any) -> Any:
    """The trained side: a train result gives its model."""
    if isinstance(target, Result):
        if not hasattr(target, "model"):
            raise ExactLensError(f"el.diff takes one trained model; this {target.kind} result has "
                                 f"{'.models (pick one: result.models[i])' if hasattr(target, 'models') else 'none'}")
        return target.model
    return target


def run(request: DiffRequest) -> Result:
    from exactlens.analysis.diff import diff

    trained = _trained(request.target)
    if request.html is not None:  # before the work: a page that cannot be written is said now, not after minutes
        from exactlens.viz.diff_page import check_diff_page

        check_diff_page(request.html, request.overwrite)
    label = request.target if isinstance(request.target, str) else type(trained).__name__
    tell(f"diff: {label} against {request.against}")
    data = diff(trained, request.against, request, progress=tell if request.quiet else None)
    return Result("diff", data, trained=trained)


def after(request: DiffRequest, result: Result, from_cli: bool) -> None:
    if request.html is not None:  # after the result is out: a failing page write cannot lose it
        from exactlens.viz.diff_page import write_diff_page

        path = write_diff_page(result.to_dict(), request.html, trained=result.trained, overwrite=request.overwrite)
        tell(f"diff: wrote {path}")


def _num(value: Any, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def format_diff_text(result: dict[str, Any]) -> str:
    """A short human-readable summary of a diff result."""
    s = result["summary"]
    lines = [f"diff against {result['exact']['name']} on lengths {result['settings']['lengths']}"]
    if "behaviour" in result:
        lines.append(
            f"  accuracy trained {_num(s['trained_accuracy'])}, exact {_num(s['exact_accuracy'])}, "
            f"agreement {_num(s['agreement'])}"
        )
    if "probes" in result:
        lines.append("  feature                  best trained site                    R^2")
        for f in result["probes"]["features"]:
            lines.append(f"  {f['label']:24s} {str(f['best_site']):36s} {_num(f['best_r2'])}")
    if "attention" in result:
        for m in result["attention"]["matching"]:
            lines.append(
                f"  head L{m['trained_layer']}H{m['trained_head']} ~ exact L{m['exact_layer']}"
                f"H{m['exact_head']}: TV distance {_num(m['distance'])}"
            )
    if "weights" in result:
        for p in result["weights"]["pairs"]:
            lines.append(
                f"  weights L{p['trained_layer']}H{p['trained_head']}: QK cosine {_num(p['qk_cosine'])}, "
                f"OV cosine {_num(p['ov_cosine'])}"
            )
    if "interventions" in result:
        for f in result["interventions"]["features"]:
            lines.append(
                f"  intervention {f['label']} at {f['trained_site']}: IIA {_num(f['iia'])}, "
                f"on changed pairs {_num(f['iia_changed'])}"
            )
    if "alignment" in result:  # one verdict line per variable (analysis/diff/alignment/verdicts.py)
        from exactlens.analysis.diff.alignment.verdicts import verdict_lines

        lines += verdict_lines(result)
    c = result.get("circuit")
    if c is not None and not c["available"]:
        lines.append(f"  circuit: not compared ({c['reason']})")
    elif c is not None:
        e, n = c["edges"], c["nodes"]
        lines.append(f"  circuit ({c['method']}, {c['granularity']}, {c.get('ablation', 'resample')} ablation): "
                     f"edges shared {e['shared']} of exact "
                     f"{e['truth']} / found {e['found']} (Jaccard {_num(e['jaccard'])}, AUROC {_num(e['auroc'])}; "
                     f"between components Jaccard {_num(e['between_components']['jaccard'])}); "
                     f"nodes shared {n['shared']} of {n['truth']} / {n['found']}; the method on the exact model: "
                     f"edge AUROC {_num(c['method_check']['edge_auroc'])}")
    return "\n".join(lines)


def headline(data: dict[str, Any]) -> list[tuple[str, Any]]:
    summary = data["summary"]
    verdicts = [(variable, v.get("verdict")) for variable, v in (summary.get("verdicts") or {}).items()]
    return ([("against", data["exact"]["name"]), ("lengths", len(data["settings"]["lengths"]))]
            + [(k, v) for k, v in summary.items() if v is not None and k != "verdicts"] + verdicts)


def plot(result: Result) -> Any:
    """DAS: the interchange-intervention accuracy on changed pairs per variable and site (a heat map)."""
    import numpy as np

    plt = pyplot()
    rows = result.get("alignment") or []
    variables = list(dict.fromkeys(f"{r['origin']}:{r['variable']}" for r in rows))
    sites = list(dict.fromkeys(f"{r['site']} ({r['position']})" for r in rows))
    fig, ax = plt.subplots(figsize=(1.2 + 0.45 * max(len(sites), 1), 1.0 + 0.4 * max(len(variables), 1)))
    grid = np.full((max(len(variables), 1), max(len(sites), 1)), np.nan)
    for r in rows:
        value = r["iia_changed"]
        i, j = variables.index(f"{r['origin']}:{r['variable']}"), sites.index(f"{r['site']} ({r['position']})")
        grid[i, j] = np.nan if value is None else max(value, np.nan_to_num(grid[i, j], nan=-1.0))
    ax.imshow(grid, vmin=0, vmax=1, cmap="viridis", aspect="auto")
    ax.set_xticks(range(len(sites)), [s.replace("blocks.", "").replace("hook_", "") for s in sites], rotation=90,
                  fontsize=7)
    ax.set_yticks(range(len(variables)), variables, fontsize=7)
    ax.set_title("DAS: IIA on changed pairs", fontsize=9)
    return fig


register_verb(VerbSpec(
    "diff", "compare a trained model with an exact construction (behaviour, probes, attention, weights, "
    "interventions, DAS alignment, circuit overlap)", DiffRequest, run, views={"diff": View(headline,
                                                                                           format_diff_text, plot)},
    description=__doc__.split("\n\n")[0], after=after, order=50))

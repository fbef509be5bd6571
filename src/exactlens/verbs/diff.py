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


def format_diff_text(result: dict[str, Any]) -> str:
    """A short human-readable summary of a diff result: a line for the settings, then each part's own text
    (its declaration's ``text``, exactlens.analysis.diff.parts) in the parts' order."""
    from exactlens.analysis.diff.parts import steps

    lines = [f"diff against {result['exact']['name']} on lengths {result['settings']['lengths']}"]
    for part in steps():
        if part.text is not None and part.shows_in(result):
            lines += part.text(result)
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

"""``exactlens diff`` (TEMPORARY: the command line's older form until its request is declared)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import exactlens.cli.diff  # noqa: F401  (registers the command-line verb)
from exactlens.errors import ExactLensError
from exactlens.results import Result, View, register_view
from exactlens.verbs.common import pyplot


def diff(trained: Any, against: str, *, lengths: str | Sequence[int] | None = None, strings: int = 64,
         html: str | Path | None = None, overwrite: bool = False, device: Any = "auto", **options: Any) -> Result:
    """``exactlens diff``: a trained model against an exact construction."""
    from exactlens.analysis.diff import diff as run
    from exactlens.requests import Lengths

    if isinstance(trained, Result):
        if not hasattr(trained, "model"):
            raise ExactLensError(f"el.diff takes one trained model; this {trained.kind} result has "
                                 f"{'.models (pick one: result.models[i])' if hasattr(trained, 'models') else 'none'}")
        trained = trained.model
    model = trained
    lengths = None if lengths is None else Lengths(1).check("lengths", lengths)
    result = run(model, against, lengths=lengths, strings=strings, device=device, **options)
    if html is not None:
        from exactlens.viz.diff_page import write_diff_page

        write_diff_page(result, html, trained=model, overwrite=overwrite)
    return Result("diff", result)


def _plot_diff(result: Result) -> Any:
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


register_view("diff", View(
    lambda d: [("against", d["exact"]["name"]), ("lengths", len(d["settings"]["lengths"]))]
    + [(k, v) for k, v in d["summary"].items() if v is not None],
    lambda d: exactlens.cli.diff.format_diff_text(d), _plot_diff))


def _register() -> None:
    from exactlens.api import register_api

    register_api("diff", diff)


_register()

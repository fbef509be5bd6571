"""Brody, Alon & Yahav (2023) figures: Fig. 1c/1d (unselectable random keys without and with layer
norm; the grid is computed by exactlens.analysis.hull.random.random_keys, Fig. 1c = "without
LayerNorm", Fig. 1d = "with LayerNorm", mean over trials) and the Tables 1-2 bars.

Brody et al.'s statement that LN makes every key selectable needs distinct normalized keys, which
for d = 2 fails (LN maps every key onto one of two points; see analysis.hull.random).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from exactlens.analysis.hull.random import DEFAULT_DS, DEFAULT_NS, random_keys
from exactlens.errors import ExactLensError
from exactlens.outputs import save_figure
from exactlens.viz.backend import pyplot

fig1_data = random_keys  # Fig. 1c/1d's grid: exactlens.analysis.hull.random (the hull verb's default)

__all__ = ["DEFAULT_DS", "DEFAULT_NS", "fig1_data", "plot_fig1", "plot_table_cells", "plot_tables"]


def plot_fig1(data: dict[str, Any], path: str | Path) -> Path:
    """Two heatmaps (without / with LN) of ``fig1_data``'s output, written as a PNG to ``path``."""
    plt = pyplot()

    try:
        ns, ds = list(data["ns"]), list(data["ds"])
        panels = [np.asarray(data["without_ln"], dtype=float), np.asarray(data["with_ln"], dtype=float)]
    except (KeyError, TypeError, ValueError) as err:
        raise ExactLensError(f"plot_fig1 needs the dict returned by fig1_data: {err}") from err
    if any(p.shape != (len(ns), len(ds)) for p in panels):
        raise ExactLensError(f"without_ln/with_ln must be [len(ns)={len(ns)}][len(ds)={len(ds)}]")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig, axes = plt.subplots(1, 2, figsize=(10, 4.2), constrained_layout=True)
    titles = ["(c) without LayerNorm", "(d) with LayerNorm"]
    image = None
    for ax, values, title in zip(axes, panels, titles, strict=True):
        image = ax.imshow(values, origin="lower", cmap="viridis_r", vmin=0.0, vmax=1.0, aspect="auto")
        ax.set_xticks(range(len(ds)), [str(d) for d in ds])
        ax.set_yticks(range(len(ns)), [str(n) for n in ns])
        ax.set_xlabel("d (dimension)")
        ax.set_ylabel("n (number of keys)")
        ax.set_title(title)
        for i in range(len(ns)):
            for j in range(len(ds)):
                v = values[i, j]
                ax.text(j, i, f"{v:.2f}", ha="center", va="center", fontsize=8, color="white" if v > 0.5 else "black")
    fig.colorbar(image, ax=axes, label=f"mean fraction of unselectable keys ({data.get('trials', '?')} trials)")
    save_figure(fig, path, dpi=120)
    plt.close(fig)
    return path


def _unselectable_bars(panels: list[tuple[str, str | None, list[tuple[str, list, Any]]]], n_layers: int,
                       paper: dict[str, Any], path: str | Path, panel_width: float) -> Path:
    """One panel per (title, variant, series): grouped bars of % unselectable keys per layer (each
    series: label, heights, error bars or None) and, for the variants the paper tabulates, its values
    (Table 1 w/o scaling, Table 2 before LN) as black ticks."""
    plt = pyplot()

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig, axes = plt.subplots(1, len(panels), figsize=(panel_width * len(panels), 3.6), sharey=True, squeeze=False,
                             constrained_layout=True)
    references = {
        "no_scale": ("paper Table 1 (w/o scaling)", paper["table1"]["no_scale_attention_input"]),
        "full": ("paper Table 2 (before LN)", paper["table2"]["before_ln"]),
    }
    x = np.arange(n_layers)
    for ax, (title, variant, series) in zip(axes[0], panels, strict=True):
        width = 0.8 / len(series)
        for j, (label, heights, err) in enumerate(series):
            ax.bar(x + (j - (len(series) - 1) / 2) * width, heights, width, yerr=err,
                   capsize=3 if err is not None else 0, label=label)
        ref = references.get(variant)
        if ref is not None and len(ref[1]) == n_layers:
            ax.plot(x, ref[1], "k_", ms=22, mew=2, label=ref[0])
        ax.set_xticks(x, [f"L{i + 1}" for i in x])
        ax.set_title(title, fontsize="small")
        ax.set_ylim(0, 100)
        ax.grid(True, axis="y", alpha=0.3)
        ax.legend(fontsize="x-small")
    axes[0][0].set_ylabel("% unselectable keys")
    save_figure(fig, path, dpi=110)
    plt.close(fig)
    return path


def plot_tables(result: dict[str, Any], path: str | Path) -> Path:
    """Bars of :func:`exactlens.analysis.brody_lm.brody_tables`: % unselectable keys per layer, per variant.

    One panel per trained run: before LN, after LN (the attention input) and each head's keys, next
    to the paper's Table 1 (w/o scaling) / Table 2 (before LN) values for that variant.
    """
    try:
        runs = list(result["runs"])
        n_layers = int(result["settings"]["n_layers"])
        paper = result["paper"]
    except (KeyError, TypeError, ValueError) as err:
        raise ExactLensError(f"plot_tables needs the dict returned by brody_tables: {err}") from err
    if not runs:
        raise ExactLensError("plot_tables: the result has no runs")
    panels = []
    for run in runs:
        p = run["percent"]
        series = [("before LN", p["before_ln"])]
        if any(v is not None for v in p["after_ln"]):
            series.append(("after LN (attn input)", p["after_ln"]))
        series += [(f"head {h} keys", [layer[h] for layer in p["per_head"]]) for h in range(len(p["per_head"][0]))]
        panels.append((f"{run['variant']} (seed {run['seed']})", run["variant"],
                       [(label, [v or 0.0 for v in values], None) for label, values in series]))
    return _unselectable_bars(panels, n_layers, paper, path, panel_width=4.2)


def plot_table_cells(result: dict[str, Any], path: str | Path) -> Path:
    """Tables 1-2 over seeds: per variant, bars of the mean % unselectable (before LN, after LN = the
    attention input) per layer with the min-max over seeds as error bars, and the paper's values."""
    try:
        cells = dict(result["cells"])
        n_layers = int(result["settings"]["n_layers"])
        paper = result["paper"]
    except (KeyError, TypeError, ValueError) as err:
        raise ExactLensError(f"plot_table_cells needs brody_tables' result with its 'cells': {err}") from err
    if not cells:
        raise ExactLensError("plot_table_cells: the result has no variants")
    panels = []
    for variant, entry in cells.items():
        measures = (("before_ln", "before LN"), ("after_ln", "after LN (attn input)"))
        series = []
        for key, label in measures:
            column = entry[key]
            if column[0] is None:
                continue
            mean = np.array([c["mean"] for c in column])
            err = np.array([[c["mean"] - c["min"] for c in column], [c["max"] - c["mean"] for c in column]])
            series.append((label, mean, err))
        panels.append((f"{variant} ({len(entry['seeds'])} seeds; bars: mean, whiskers: min-max)", variant, series))
    return _unselectable_bars(panels, n_layers, paper, path, panel_width=4.6)

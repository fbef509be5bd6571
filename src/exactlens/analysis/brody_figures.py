"""Brody, Alon & Yahav (2023) Fig. 1c/1d: unselectable random keys without and with layer norm.

For each number of keys n and dimension d, ``trials`` sets of n keys are drawn i.i.d. from the
standard normal distribution N(0, I_d). For each set, the fraction of unselectable keys (keys in
the convex hull of the others, which can never get the strictly highest score q.k; exact check of
:func:`exactlens.analysis.hull.selectable_keys`) is measured on the raw keys (Fig. 1c, "without
LayerNorm") and on the same keys after LayerNorm without gain and bias,
``layer_norm_geometric`` = sqrt(d) P x / ||P x|| (Fig. 1d, "with LayerNorm"). The figure shows
the mean over trials.

What to expect. Without LN the fraction grows with n and shrinks with d (n <= d + 1 points in
general position are all vertices of their hull). With LN the keys lie on a sphere of radius
sqrt(d) inside the (d-1)-dimensional hyperplane orthogonal to 1, and distinct points of a sphere
are all extreme points, so the fraction is 0 for every d >= 3 (with probability one). The one
exception is d = 2: the hyperplane is a line and its "sphere" is the two points ±(1, -1), so LN
maps n > 2 keys onto two points, and keys that share a point are duplicates, which can only tie:
almost every key is unselectable there. Brody et al.'s statement that LN makes every key
selectable needs distinct normalized keys, which for d = 2 fails.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from exactlens.analysis.hull import METHODS, layer_norm_geometric, selectable_keys
from exactlens.errors import ExactLensError

__all__ = ["DEFAULT_DS", "DEFAULT_NS", "fig1_data", "plot_fig1", "plot_tables"]

DEFAULT_NS = (4, 8, 16, 32, 64, 128)
DEFAULT_DS = (2, 3, 4, 6, 8, 16)


def _positive_ints(values: Sequence[int], name: str, minimum: int) -> list[int]:
    try:
        out = [int(v) for v in values]
    except (TypeError, ValueError) as err:
        raise ExactLensError(f"{name} must be a sequence of integers, got {values!r}") from err
    if not out or min(out) < minimum or any(isinstance(v, bool) or int(v) != v for v in values):
        raise ExactLensError(f"{name} must be a non-empty sequence of integers >= {minimum}, got {list(values)!r}")
    return out


def fig1_data(
    ns: Sequence[int] = DEFAULT_NS,
    ds: Sequence[int] = DEFAULT_DS,
    trials: int = 100,
    seed: int = 0,
    tol: float = 1e-9,
    method: str = "fast",
) -> dict[str, Any]:
    """Mean fraction of unselectable standard-normal keys over an (n, d) grid, without and with LN.

    Returns a JSON-ready dict: ``ns``, ``ds``, ``trials``, ``seed``, ``tolerance``, ``method``,
    ``without_ln`` and ``with_ln`` (mean fractions, ``[len(ns)][len(ds)]``: row = n, column = d),
    ``without_ln_std`` and ``with_ln_std`` (standard deviations over trials), ``elapsed_s``.
    Each trial uses the same keys for both panels (LN applied to them), so the panels are paired.
    The default grid (6 x 6, 100 trials, as in Brody et al.) takes about 35 s on one core.
    """
    ns_ = _positive_ints(ns, "ns", 1)
    ds_ = _positive_ints(ds, "ds", 2)  # layer norm of a 1-D vector is undefined (constant)
    if isinstance(trials, bool) or not isinstance(trials, int) or trials < 1:
        raise ExactLensError(f"trials must be an integer >= 1, got {trials!r}")
    if method not in METHODS:
        raise ExactLensError(f"method must be one of {METHODS}, got {method!r}")
    rng = np.random.default_rng(seed)
    start = time.perf_counter()
    raw = np.zeros((len(ns_), len(ds_), trials))
    normed = np.zeros_like(raw)
    for a, n in enumerate(ns_):
        for b, d in enumerate(ds_):
            for t in range(trials):
                keys = rng.standard_normal((n, d))
                raw[a, b, t] = selectable_keys(keys, tol=tol, method=method).fraction_unselectable
                normed[a, b, t] = selectable_keys(
                    layer_norm_geometric(keys), tol=tol, method=method
                ).fraction_unselectable
    return {
        "ns": ns_,
        "ds": ds_,
        "trials": trials,
        "seed": seed,
        "tolerance": float(tol),
        "method": method,
        "without_ln": raw.mean(axis=2).tolist(),
        "with_ln": normed.mean(axis=2).tolist(),
        "without_ln_std": raw.std(axis=2).tolist(),
        "with_ln_std": normed.std(axis=2).tolist(),
        "elapsed_s": time.perf_counter() - start,
    }


def plot_fig1(data: dict[str, Any], path: str | Path) -> Path:
    """Two heatmaps (without / with LN) of ``fig1_data``'s output, written as a PNG to ``path``."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

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
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_tables(result: dict[str, Any], path: str | Path) -> Path:
    """Bars of :func:`exactlens.analysis.brody_lm.brody_tables`: % unselectable keys per layer, per variant.

    One panel per trained run: before LN, after LN (the attention input) and each head's keys, next
    to the paper's Table 1 (w/o scaling) / Table 2 (before LN) values for that variant.
    """
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    try:
        runs = list(result["runs"])
        n_layers = int(result["settings"]["n_layers"])
        paper = result["paper"]
    except (KeyError, TypeError, ValueError) as err:
        raise ExactLensError(f"plot_tables needs the dict returned by brody_tables: {err}") from err
    if not runs:
        raise ExactLensError("plot_tables: the result has no runs")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig, axes = plt.subplots(
        1, len(runs), figsize=(4.2 * len(runs), 3.6), sharey=True, squeeze=False, constrained_layout=True
    )
    x = np.arange(n_layers)
    for ax, run in zip(axes[0], runs, strict=True):
        p = run["percent"]
        series = [("before LN", p["before_ln"])]
        if any(v is not None for v in p["after_ln"]):
            series.append(("after LN (attn input)", p["after_ln"]))
        series += [(f"head {h} keys", [layer[h] for layer in p["per_head"]]) for h in range(len(p["per_head"][0]))]
        width = 0.8 / len(series)
        for j, (label, values) in enumerate(series):
            ax.bar(x + (j - (len(series) - 1) / 2) * width, [v or 0.0 for v in values], width, label=label)
        ref = {
            "no_scale": ("paper Table 1 (w/o scaling)", paper["table1"]["no_scale_attention_input"]),
            "full": ("paper Table 2 (before LN)", paper["table2"]["before_ln"]),
        }.get(run["variant"])
        if ref is not None and len(ref[1]) == n_layers:
            ax.plot(x, ref[1], "k_", ms=22, mew=2, label=ref[0])
        ax.set_xticks(x, [f"L{i + 1}" for i in x])
        ax.set_title(f"{run['variant']} (seed {run['seed']})")
        ax.set_ylim(0, 100)
        ax.grid(True, axis="y", alpha=0.3)
        ax.legend(fontsize="x-small")
    axes[0][0].set_ylabel("% unselectable keys")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path

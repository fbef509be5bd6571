"""Brody, Alon & Yahav (2023) Fig. 2-3: MAJORITY with and without LN's projection.

§4.1 / App. E.1: a one-layer, one-head encoder with d = 8 learns MAJORITY (20 classes, |w| = 50)
about 3x faster with LayerNorm's projection than with a LayerNorm without it (numerator x instead
of x - mean x, i.e. scaling only), and with the projection the learned queries turn towards the
ones vector (all keys are orthogonal to it, so such a query attends uniformly, which is what an
exact average needs). The runs use the training helper's ``majority`` preset
(``exactlens.train.train("majority", layer_norm="full" | "scale_only" | "none", seed=...)``), whose
history records the test accuracy and ``test_query_angle_deg``: the angle between the first layer's
CLS query, mapped into the normalised residual space (W_K q), and the line through the ones vector.

:func:`majority_data` runs every (layer norm, seed) pair and reports, per run, the number of Adam
steps until the test accuracy first reaches each of ``thresholds`` (None if never) and the curves.
The paper's own schedule (batch 6000, 17K steps) is far beyond a CPU budget of minutes; the
settings here are stated in the output and much shorter.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from exactlens.errors import ExactLensError
from exactlens.outputs import save_figure
from exactlens.train import train

__all__ = ["BENCH_OPTIONS", "majority_data", "plot_majority", "report_options", "steps_to"]

BENCH_OPTIONS: dict[str, Any] = {
    "epochs": 60,
    "strings_per_epoch": 2000,
    "batch_size": 100,
    "lr": 1e-2,
    "lr_schedule": "constant",
    "test_strings": 1000,
    "eval_every": 2,
}
"""Settings of benchmarks/brody_majority.py (1200 Adam steps of 100 words)."""


def report_options(quick: bool) -> dict[str, Any]:
    """Settings for the report: tiny with quick, else the 800-step run of docs/brody.md (~10 s a seed)."""
    if quick:
        return {
            "epochs": 2,
            "strings_per_epoch": 200,
            "batch_size": 100,
            "lr": 1e-2,
            "lr_schedule": "constant",
            "test_strings": 100,
            "eval_every": 1,
        }
    return {**BENCH_OPTIONS, "epochs": 40}  # docs/brody.md's measured run (brody_majority.py --epochs 40): 800 steps


def steps_to(history: Sequence[dict[str, Any]], threshold: float) -> int | None:
    """The first step whose test accuracy is >= threshold, or None."""
    for record in history:
        acc = record.get("test_accuracy")
        if acc is not None and acc >= threshold:
            return int(record["step"])
    return None


def majority_data(
    layer_norms: Sequence[str] = ("full", "scale_only"),
    *,
    seeds: Sequence[int] = (0, 1, 2),
    thresholds: Sequence[float] = (0.5, 0.9, 0.99),
    **options: Any,
) -> dict[str, Any]:
    """Train the ``majority`` preset per (layer norm, seed); JSON-ready curves and steps-to-threshold.

    ``options`` go to ``exactlens.train.train`` (epochs, strings_per_epoch, batch_size, lr, ...).
    Returns ``{"options", "seeds", "layer_norms", "thresholds", "threshold", "runs": [{"layer_norm",
    "seed", "steps": [...], "test_accuracy": [...], "query_angle_deg": [...], "steps_to": {thr: step},
    "steps_to_threshold", "final_test_accuracy", "final_angle_deg", "wall_s"}], "elapsed_s"}``
    where ``threshold`` (used by ``steps_to_threshold``) is the largest of ``thresholds``.
    """
    if not seeds or any(isinstance(s, bool) or not isinstance(s, int) for s in seeds):
        raise ExactLensError(f"seeds must be a non-empty sequence of integers, got {seeds!r}")
    if not thresholds or not all(0 < float(t) <= 1 for t in thresholds):
        raise ExactLensError(f"thresholds must be accuracies in (0, 1], got {thresholds!r}")
    start = time.perf_counter()
    runs = []
    resolved: dict[str, Any] = {}
    for ln in layer_norms:
        for seed in seeds:
            run = train("majority", seed=seed, layer_norm=ln, **options)
            resolved = dict(run.options)
            evals = [r for r in run.history if r.get("test_accuracy") is not None]
            final = evals[-1] if evals else {}
            reached = {str(t): steps_to(evals, float(t)) for t in thresholds}
            runs.append(
                {
                    "layer_norm": ln,
                    "seed": seed,
                    "steps": [int(r["step"]) for r in evals],
                    "test_accuracy": [float(r["test_accuracy"]) for r in evals],
                    "query_angle_deg": [r.get("test_query_angle_deg") for r in evals],
                    "steps_to": reached,
                    "steps_to_threshold": reached[str(max(thresholds))],
                    "final_test_accuracy": final.get("test_accuracy"),
                    "final_angle_deg": final.get("test_query_angle_deg"),
                    "wall_s": run.wall_s,
                }
            )
    options_out = {k: v for k, v in resolved.items() if k != "layer_norm"}
    return {
        "options": options_out,
        "seeds": list(seeds),
        "layer_norms": list(layer_norms),
        "thresholds": [float(t) for t in thresholds],
        "threshold": float(max(thresholds)),
        "runs": runs,
        "elapsed_s": time.perf_counter() - start,
    }


def plot_majority(data: dict[str, Any], path: str | Path) -> Path:
    """Fig. 2b / Fig. 3 style: test accuracy and query angle vs Adam steps, one line per run."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    try:
        runs = list(data["runs"])
    except (KeyError, TypeError) as err:
        raise ExactLensError(f"plot_majority needs the dict returned by majority_data: {err}") from err
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig, (acc_ax, ang_ax) = plt.subplots(1, 2, figsize=(10, 3.6), constrained_layout=True)
    colors = {"full": "tab:blue", "scale_only": "tab:orange", "none": "tab:gray"}
    seen: set[str] = set()
    for run in runs:
        ln = run["layer_norm"]
        label = (
            None
            if ln in seen
            else {"full": "with projection (full LN)", "scale_only": "without projection", "none": "no LN"}.get(ln, ln)
        )
        seen.add(ln)
        color = colors.get(ln, "k")
        acc_ax.plot(run["steps"], run["test_accuracy"], color=color, alpha=0.7, label=label)
        angles = [np.nan if a is None else a for a in run["query_angle_deg"]]
        ang_ax.plot(run["steps"], angles, color=color, alpha=0.7, label=label)
    acc_ax.set_xlabel("Adam steps")
    acc_ax.set_ylabel("test accuracy")
    acc_ax.set_ylim(0, 1)
    acc_ax.set_title("Fig. 3: test accuracy")
    ang_ax.set_xlabel("Adam steps")
    ang_ax.set_ylabel("angle(query, ones line) [deg]")
    ang_ax.set_ylim(0, 90)
    ang_ax.set_title("Fig. 2b: query angle to the ones vector")
    for ax in (acc_ax, ang_ax):
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize="small")
    save_figure(fig, path, dpi=110)
    plt.close(fig)
    return path

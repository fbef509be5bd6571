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

Fig. 2-3 as the paper runs them: :func:`paper_variant` trains ``settings["runs"]`` seeds of the
``majority-per-position`` preset (the authors' layer and data, App. E.1's optimiser) as one stacked
computation and returns the curves of Fig. 2a (training loss), 2b (mean query angle to the ones
line, over all positions) and 3 (per-position test accuracy) with mean / std / min / max over runs;
:func:`plot_paper_majority` draws them (benchmarks/brody_majority.py runs both variants).
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
from exactlens.viz.backend import pyplot

__all__ = [
    "BENCH_OPTIONS", "PAPER_SETTINGS", "QUICK_SETTINGS", "first_step_at", "majority_data", "paper_variant",
    "merge_runs", "plot_majority", "plot_paper_majority", "report_options", "steps_to", "summarize_paper_majority",
    "trainable_parameters",
]

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


VARIANT_COLORS = {"full": "tab:blue", "scale_only": "tab:orange", "none": "tab:gray"}  # per layer_norm


def plot_majority(data: dict[str, Any], path: str | Path) -> Path:
    """Fig. 2b / Fig. 3 style: test accuracy and query angle vs Adam steps, one line per run."""
    plt = pyplot()

    try:
        runs = list(data["runs"])
    except (KeyError, TypeError) as err:
        raise ExactLensError(f"plot_majority needs the dict returned by majority_data: {err}") from err
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig, (acc_ax, ang_ax) = plt.subplots(1, 2, figsize=(10, 3.6), constrained_layout=True)
    seen: set[str] = set()
    for run in runs:
        ln = run["layer_norm"]
        label = (
            None
            if ln in seen
            else {"full": "with projection (full LN)", "scale_only": "without projection", "none": "no LN"}.get(ln, ln)
        )
        seen.add(ln)
        color = VARIANT_COLORS.get(ln, "k")
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


# ---- Fig. 2-3 at the paper's scale: 10 stacked runs per variant ----------------------------------

PAPER_SETTINGS: dict[str, Any] = {
    "steps": 17_000,  # App. E.1: 1000 epochs of 17 steps
    "batch": 6000,
    "lr": 1e-3,
    "lr_schedule": "linear",
    "runs": 10,
    "eval_every": 17,  # one of the paper's epochs
    "test_strings": 2000,
}
"""App. E.1's settings for ``paper_majority`` (the test words: 2000 fresh per evaluation, the
paper's fixed set has 20K)."""

QUICK_SETTINGS: dict[str, Any] = {
    "steps": 6, "batch": 60, "lr": 1e-3, "lr_schedule": "constant", "runs": 2, "eval_every": 3, "test_strings": 60,
}
"""Seconds: for tests and ``make report --quick``."""

VARIANT_LABELS = {"full": "with projection (LN)", "scale_only": "without projection (x / RMS(x))", "none": "no LN"}


def trainable_parameters(run: Any) -> int:
    """Parameters the optimizer updated: the model's, less the preset's frozen ones."""
    from exactlens.papers.brody.majority import FROZEN_AT_IDENTITY

    return sum(p.numel() for name, p in run.model.named_parameters()
               if p.requires_grad and name not in FROZEN_AT_IDENTITY)


def _band(values: list[list[float | None]]) -> dict[str, list[float | None]]:
    """Mean, standard deviation, min and max over runs at each point (None where a run has no value)."""
    out: dict[str, list[float | None]] = {"mean": [], "std": [], "min": [], "max": []}
    for column in zip(*values, strict=True):
        vals = [float(v) for v in column if v is not None]
        out["mean"].append(float(np.mean(vals)) if vals else None)
        out["std"].append(float(np.std(vals, ddof=1)) if len(vals) > 1 else (0.0 if vals else None))
        out["min"].append(min(vals) if vals else None)
        out["max"].append(max(vals) if vals else None)
    return out


def first_step_at(steps: Sequence[int], values: Sequence[float | None], threshold: float) -> int | None:
    """The first step whose value is >= threshold, or None."""
    for step, value in zip(steps, values, strict=True):
        if value is not None and value >= threshold:
            return int(step)
    return None


def paper_variant(layer_norm: str, settings: dict[str, Any], *, seeds: Sequence[int] | None = None,
                  progress: Any = None) -> dict[str, Any]:
    """One variant of Fig. 2-3: ``settings["runs"]`` seeds of the ``majority-per-position`` preset
    trained together (``train_many``: one stacked computation), one Adam step per record.
    Returns the per-run curves and, per curve, mean / std / min / max over runs."""
    from exactlens.train import train_many

    seeds = list(range(settings["runs"])) if seeds is None else list(seeds)
    start = time.perf_counter()
    runs = train_many(
        "majority-per-position", seeds, layer_norm=layer_norm, epochs=settings["steps"],
        strings_per_epoch=settings["batch"], batch_size=settings["batch"], lr=settings["lr"],
        lr_schedule=settings["lr_schedule"], eval_every=settings["eval_every"],
        test_strings=settings["test_strings"], progress=progress,
        **{key: settings[key] for key in ("min_margin", "counted_loss") if key in settings},
    )
    wall = time.perf_counter() - start
    history = runs[0].history
    steps = [int(r["step"]) for r in history]
    evals = [i for i, r in enumerate(history) if r["test_evaluated"]]
    train_loss = [[r["train_loss_bits"] * LN2_NATS for r in run.history] for run in runs]
    test_acc = [[run.history[i]["test_per_position_accuracy"] for i in evals] for run in runs]
    test_word_acc = [[run.history[i]["test_accuracy"] for i in evals] for run in runs]
    angle = [[run.history[i]["test_query_angle_deg"] for i in evals] for run in runs]
    eval_steps = [steps[i] for i in evals]
    return {
        "layer_norm": layer_norm,
        "label": VARIANT_LABELS.get(layer_norm, layer_norm),
        "seeds": seeds,
        "steps": steps,
        "eval_steps": eval_steps,
        "train_loss_nats": _band(train_loss),
        "test_accuracy": _band(test_acc),
        "test_word_accuracy": _band(test_word_acc),
        "query_angle_deg": _band(angle),
        "per_run": [
            {"seed": s, "train_loss_nats": tl, "test_accuracy": ta, "test_word_accuracy": wa, "query_angle_deg": an,
             "steps_to_0.9": first_step_at(eval_steps, ta, 0.9)}
            for s, tl, ta, wa, an in zip(seeds, train_loss, test_acc, test_word_acc, angle, strict=True)
        ],
        "wall_s": wall,
        "s_per_step": wall / max(len(steps), 1),
        "n_parameters": trainable_parameters(runs[0]),
        "options": {k: v for k, v in runs[0].info["options"].items() if k != "layer_norm"},
    }


def merge_runs(parts: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One variant from :func:`paper_variant` results of the same variant and settings over other seeds
    (e.g. seeds 0-2 and 3-5 trained in two sessions): runs concatenated, bands recomputed over all of
    them, wall time summed. Each run is deterministic in its seed, so this equals training them together
    up to summation order."""
    if not parts:
        raise ExactLensError("merge_runs needs at least one variant result")
    first = parts[0]
    for part in parts[1:]:
        for key in ("layer_norm", "steps", "eval_steps", "options", "n_parameters"):
            if part[key] != first[key]:
                raise ExactLensError(f"merge_runs: the results differ in {key!r}: same variant and settings only")
    seeds = [s for part in parts for s in part["seeds"]]
    if len(set(seeds)) != len(seeds):
        raise ExactLensError(f"merge_runs: a seed occurs twice ({sorted(seeds)}): each run once")
    per_run = [run for part in parts for run in part["per_run"]]
    merged = dict(first, seeds=seeds, per_run=per_run, wall_s=sum(p["wall_s"] for p in parts),
                  s_per_step=sum(p["wall_s"] for p in parts) / max(len(first["steps"]), 1))
    for key in ("train_loss_nats", "test_accuracy", "query_angle_deg", "test_word_accuracy"):
        if all(key in run for run in per_run):
            merged[key] = _band([run[key] for run in per_run])
        else:  # files written before per-run word accuracies were kept
            merged.pop(key, None)
    return merged


LN2_NATS = float(np.log(2.0))  # history losses are in bits; the paper plots nats (cross-entropy)


def plot_paper_majority(data: dict[str, Any], path: str | Path) -> Path:
    """Fig. 2a (training loss), 2b (query angle to the ones line), 3 (test accuracy): mean over runs
    with the min-max band, one colour per variant."""
    plt = pyplot()

    try:
        variants = list(data["variants"])
    except (KeyError, TypeError) as err:
        raise ExactLensError(f"plot_paper_majority needs the dict of paper_majority results: {err}") from err
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6), constrained_layout=True)
    panels = (("train_loss_nats", "steps", "training loss (nats)", "Fig. 2a: training loss"),
              ("query_angle_deg", "eval_steps", "angle(query, ones line) [deg]", "Fig. 2b: query angle to 1"),
              ("test_accuracy", "eval_steps", "test accuracy (per position)", "Fig. 3: test accuracy"))
    for ax, (key, xs, ylabel, title) in zip(axes, panels, strict=True):
        for variant in variants:
            band = variant[key]
            x = np.asarray(variant[xs], dtype=float)
            nan = lambda v: np.asarray([np.nan if a is None else a for a in v], dtype=float)  # noqa: E731
            color = VARIANT_COLORS.get(variant["layer_norm"], "k")
            label = f"{variant['label']} ({len(variant['seeds'])} runs)"
            ax.plot(x, nan(band["mean"]), color=color, label=label)
            ax.fill_between(x, nan(band["min"]), nan(band["max"]), color=color, alpha=0.2, linewidth=0)
        ax.set_xlabel("Adam steps")
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        ax.grid(True, alpha=0.3)
    axes[1].set_ylim(0, 90)
    axes[2].set_ylim(0, 1)
    axes[2].legend(fontsize="small")
    save_figure(fig, path, dpi=110)
    plt.close(fig)
    return path


def summarize_paper_majority(data: dict[str, Any]) -> list[dict[str, Any]]:
    """Per variant: final mean (std) training loss, test accuracy and angle, the first step where
    the mean test accuracy reaches 0.5 / 0.9, and each run's first step at 0.9."""
    rows = []
    for v in data["variants"]:
        acc, ang, loss = v["test_accuracy"], v["query_angle_deg"], v["train_loss_nats"]
        rows.append({
            "layer_norm": v["layer_norm"],
            "label": v["label"],
            "runs": len(v["seeds"]),
            "steps": v["steps"][-1] if v["steps"] else 0,
            "final_train_loss": loss["mean"][-1], "final_train_loss_std": loss["std"][-1],
            "final_test_accuracy": acc["mean"][-1], "final_test_accuracy_std": acc["std"][-1],
            "final_angle_deg": ang["mean"][-1], "final_angle_deg_std": ang["std"][-1],
            "first_angle_deg": ang["mean"][0],
            "mean_steps_to_0.5": first_step_at(v["eval_steps"], acc["mean"], 0.5),
            "mean_steps_to_0.9": first_step_at(v["eval_steps"], acc["mean"], 0.9),
            "run_steps_to_0.9": [run["steps_to_0.9"] for run in v["per_run"]],  # per run (None: never)
            "s_per_step": v["s_per_step"],
        })
    return rows

"""Behaviour part of the circuit diff: how each model answers the task, and how often they agree.

Per length, for every task kind: each model's accuracy (a word is right when every one of its
targets is), and the agreement of the two models' decisions (per word; each model decided by its
own reader). Prediction tasks add per-position accuracies and agreement; regression tasks add
each model's mean squared error and R^2 against the targets and the mean squared difference
between the two models (exactness and agreement there mean: within the exact construction's
rounding tolerance).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from exactlens.analysis.diff.runs import LengthRun, Side, same_decisions
from exactlens.tasks import kinds


def _tolerance(exact: Side, truth: torch.Tensor) -> float:
    cfg = exact.model.cfg
    return kinds.regression_tolerance(cfg.torch_dtype, truth, cfg.metadata.get("value_scale", 1.0))


def behaviour_table(runs: list[LengthRun], trained: Side, exact: Side) -> dict[str, Any]:
    task = exact.reader.task
    rows = []
    sums: dict[str, float] = {}
    weights: dict[str, int] = {}  # words of the lengths that have the value
    for run in runs:
        n_pos = run.n_positions
        e = exact.reader.decide(run.exact_outputs, n_pos)
        t = trained.reader.decide(run.trained_outputs, n_pos)
        tol = _tolerance(exact, run.truth) if task.kind == "regression" else None
        e_score = task.score(e, run.truth, n_pos, tol)
        t_score = task.score(t, run.truth, n_pos, tol)
        agree = same_decisions(task, e, t, n_pos, tol or 0.0, run.truth)
        row: dict[str, Any] = {
            "length": run.length,
            "strings": len(run.truth),
            "exhaustive": run.exhaustive,
            "exact_accuracy": e_score.accuracy,
            "trained_accuracy": t_score.accuracy,
            "agreement": float(agree.double().mean()),
        }
        if task.kind == "prediction":
            valid = e_score.valid
            same = (e[:, : valid.shape[1]] == t[:, : valid.shape[1]]) & valid
            row.update(
                exact_per_position_accuracy=e_score.per_position_accuracy,
                trained_per_position_accuracy=t_score.per_position_accuracy,
                # a length without target positions has no agreement (left out of the mean)
                per_position_agreement=float(same.sum()) / int(valid.sum()) if valid.any() else None,
            )
        if task.kind == "regression" and e_score.valid.any():  # a length without targets has no error
            valid = e_score.valid
            width = valid.shape[1]
            diff = (e[:, :width].double() - t[:, :width].double()).pow(2)[valid]
            row.update(
                exact_mse=float(e_score.squared_error[valid].mean()),
                trained_mse=float(t_score.squared_error[valid].mean()),
                exact_r2=kinds.r2(e[:, :width], run.truth[:, :width], valid),
                trained_r2=kinds.r2(t[:, :width], run.truth[:, :width], valid),
                mse_between=float(diff.mean()),
            )
        for key, value in row.items():
            if key not in ("length", "strings", "exhaustive") and isinstance(value, float):
                sums[key] = sums.get(key, 0.0) + value * row["strings"]
                weights[key] = weights.get(key, 0) + row["strings"]
        rows.append(row)
    out: dict[str, Any] = {"task": task.spec(), "rows": rows}
    out.update({key: value / weights[key] for key, value in sums.items()})
    for key in ("exact_accuracy", "trained_accuracy", "agreement"):
        out.setdefault(key, float(np.nan))
    return out

"""Test metrics of a model on a batch of words: what the training loop records at each evaluation and
checkpoint (``exactlens.train.loop`` re-exports ``evaluate``)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from exactlens import tasks
from exactlens.model import ExactTransformer
from exactlens.tasks import kinds
from exactlens.train.budget import EVAL_SCORE_BUDGET
from exactlens.train.data import Batch, split
from exactlens.train.metrics import Metric

LN2 = math.log(2.0)


@torch.no_grad()
def evaluate(
    model: ExactTransformer, batch: Batch, task: tasks.Task | None = None, metrics: tuple[Metric, ...] = ()
) -> dict[str, Any]:
    """Test metrics of a model on a batch, in eval mode: loss (bits per word; per position for
    prediction), accuracy (per word), per-position accuracy, MSE and R^2 (regression), and each
    metric's fields (means per word)."""
    task = task if task is not None else tasks.of_model(model)
    reader = tasks.reader(model, task)
    readout_only = readout_only_for(model, metrics)
    width = batch.tokens.shape[1]
    chunk = max(1, EVAL_SCORE_BUDGET // (model.cfg.n_heads * width * width))
    sums = {"loss": 0.0, "correct": 0.0, "pos_right": 0.0, "pos_count": 0.0}
    extra: dict[str, float] = {f: 0.0 for m in metrics for f in m.fields}
    values, targets, valids = [], [], []
    was_training = model.training
    model.eval()
    try:
        for part in split(batch, chunk):
            part = part.to(model.device)  # words are drawn on the CPU; the model reads them where it is
            n_positions = part.n_positions if part.padded else None
            cache: dict[str, torch.Tensor] = {}
            hooks = [(m.hooks_for(model), _keep(cache)) for m in metrics]
            with model.hooks(fwd_hooks=hooks):
                outputs = model.readout(part.tokens, n_positions, readout_only=readout_only)
            loss = kinds.loss(task, outputs.double(), part.targets, part.n_positions)
            predictions = reader.decide(outputs, part.n_positions)
            scores = task.score(predictions, part.targets, part.n_positions)
            sums["loss"] += float(loss.sum())
            sums["correct"] += float(scores.correct.sum())
            if scores.valid is not None:
                sums["pos_right"] += float((scores.position_correct & scores.valid).sum())
                sums["pos_count"] += float(scores.valid.sum())
            if task.kind == "regression":
                values.append(predictions.double())
                targets.append(part.targets.double())
                valids.append(scores.valid)
            for metric in metrics:
                for name, value in metric.compute(model, part, cache).items():
                    extra[name] += float(value)
    finally:
        model.train(was_training)
    count = len(batch)
    out: dict[str, Any] = {
        "loss_bits": sums["loss"] / count / LN2,
        "accuracy": sums["correct"] / count,
        "per_position_accuracy": sums["pos_right"] / sums["pos_count"] if sums["pos_count"] else None,
    }
    if task.kind == "regression":
        width = max(v.shape[1] for v in values)
        pad = torch.nn.functional.pad
        stacked = [torch.cat([pad(t, (0, width - t.shape[1])) for t in ts]) for ts in (values, targets, valids)]
        out.update(loss_bits=None, accuracy=None, per_position_accuracy=None, mse=sums["loss"] / count,
                   r2=kinds.r2(*stacked))
    out.update({name: value / count for name, value in extra.items()})
    return out


def readout_only_for(model: ExactTransformer, metrics: tuple[Metric, ...]) -> bool:
    """Whether an evaluation may compute the last layer at the readout position only (what the test reads, the
    same function at a fraction of the cost, as training does): a readout at one fixed position, and every
    metric reading that position's queries alone (Metric.query_positions). Not in float64, whose evaluations keep
    the bits they had (the last layer's products at one row round differently in the last bit)."""
    cfg = model.cfg
    if cfg.readout == "per_position" or cfg.dtype == "float64":
        return False
    if cfg.readout_position < 0:  # a position counted from each word's end: no metric names it
        return not metrics
    return all(m.query_positions is not None and set(m.query_positions) <= {cfg.readout_position} for m in metrics)


def _keep(cache: dict[str, torch.Tensor]) -> Callable[[torch.Tensor, Any], None]:
    def keep(tensor: torch.Tensor, hook: Any) -> None:
        cache[hook.name] = tensor

    return keep

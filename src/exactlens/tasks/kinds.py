"""The four task kinds: what a model's outputs mean, how they are decided and scored.

A model's *outputs* are what ``ExactTransformer.readout`` returns:

============== ===================================== ==================================
kind           outputs                               targets (``Task.targets``)
============== ===================================== ==================================
membership     logit [B] (sigmoid) or logits [B, 2]  bool [B]
classification logits [B, k] at one position         class index [B]
prediction     logits [B, pos, k] at every position  class index [B, L] per symbol
regression     values [B, pos, 1] or [B, pos]        float [B, L] per symbol
============== ===================================== ==================================

Per-position outputs cover every token position; the symbols of a word sit at positions
``task.symbol_offset`` onward (after [CLS]), and ``task.target_mask`` says which symbol
positions carry a target (e.g. not the first one of a pair task; given the targets, not where
they are undefined: ``UNDEFINED`` classes, NaN values). A word counts as correct
when every one of its targets is predicted (within ``tolerance`` for regression).

Every function here takes ``n_positions`` (real positions per row, padding excluded), so one
signature serves every kind and every decision rule (:mod:`exactlens.tasks.decisions`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Protocol

import torch
import torch.nn.functional as F

from exactlens.errors import ExactLensError


class TaskLike(Protocol):
    """What this module reads of a task (exactlens.tasks.base.Task, which imports this module: the protocol keeps
    the import one way)."""

    name: str
    kind: str
    n_specials: int
    symbol_offset: int

    @property
    def classes(self) -> Any: ...

    def target_mask(self, *args: Any, **kwargs: Any) -> Any: ...


KINDS = ("membership", "classification", "prediction", "regression")
READOUTS = {
    "membership": "sigmoid",
    "classification": "logits",
    "prediction": "per_position",
    "regression": "per_position",
}
"""The readout a standard model of each kind has (ExactConfig.readout)."""
LN2 = math.log(2.0)


def check_kind(kind: str) -> str:
    if kind not in KINDS:
        raise ExactLensError(f"task kind {kind!r} is unknown; the kinds are {', '.join(KINDS)}")
    return kind


def _shape(outputs: torch.Tensor) -> str:
    return str(tuple(outputs.shape))


# ---- per-position layout ---------------------------------------------------------------------


def symbol_outputs(task: TaskLike, outputs: torch.Tensor) -> torch.Tensor:
    """Per-position outputs [B, pos, ...] -> the outputs at the symbol positions [B, L, ...]
    (L = pos - specials; rows shorter than the widest are masked by ``valid_targets``)."""
    if outputs.ndim < 2:
        raise ExactLensError(
            f"task {task.name!r} ({task.kind}) reads one output per position, [batch, pos, ...]; "
            f"got outputs of shape {_shape(outputs)}"
        )
    width = outputs.shape[1] - task.n_specials
    return outputs[:, task.symbol_offset : task.symbol_offset + width]


def valid_targets(task: TaskLike, n_positions: torch.Tensor, width: int,
                  truth: torch.Tensor | None = None) -> torch.Tensor:
    """bool [B, width]: which symbol positions of each row carry a target (``truth``: the targets,
    whose undefined entries carry none)."""
    return task.target_mask(n_positions - task.n_specials, width, truth)


# ---- deciding ----------------------------------------------------------------------------------


def decide(task: TaskLike, outputs: torch.Tensor, n_positions: torch.Tensor) -> torch.Tensor:
    """The standard decision of the task's kind: membership bits, class indices (one per word or
    one per symbol position) or values."""
    kind = task.kind
    if kind == "membership":
        logit = _membership_logit(task, outputs)
        return logit > 0
    if kind == "classification":
        _check_classes(task, outputs, 2)
        return outputs.argmax(-1)
    per_position = symbol_outputs(task, outputs)
    if kind == "prediction":
        _check_classes(task, per_position, 3)
        return per_position.argmax(-1)
    return _regression_values(task, per_position)


def margin(task: TaskLike, outputs: torch.Tensor, n_positions: torch.Tensor,
           truth: torch.Tensor | None = None) -> torch.Tensor | None:
    """Per word, the distance of the outputs from the decision boundary (|logit|, or the gap
    between the two largest logits, the smallest over a word's target positions, ``truth``
    leaving out undefined ones); None for regression."""
    kind = task.kind
    if kind == "regression":
        return None
    if kind == "membership":
        return _membership_logit(task, outputs).abs()
    if kind == "classification":
        return _top_gap(outputs)
    per_position = symbol_outputs(task, outputs)
    gaps = _top_gap(per_position)
    valid = valid_targets(task, n_positions, gaps.shape[1], truth)
    return torch.where(valid, gaps, torch.full_like(gaps, math.inf)).amin(1)


def _top_gap(logits: torch.Tensor) -> torch.Tensor:
    if logits.shape[-1] < 2:
        return logits[..., 0].abs()
    top = logits.topk(2, dim=-1).values
    return top[..., 0] - top[..., 1]


def _membership_logit(task: TaskLike, outputs: torch.Tensor) -> torch.Tensor:
    """A membership model's evidence for "accept": its logit, or logit(1) - logit(0) of two classes."""
    if outputs.ndim == 2 and outputs.shape[1] == 1:
        outputs = outputs[:, 0]
    if outputs.ndim == 1:
        return outputs
    if outputs.ndim == 2 and outputs.shape[1] == 2:
        return outputs[:, 1] - outputs[:, 0]
    raise ExactLensError(
        f"task {task.name!r} (membership) reads one logit per word [batch] or two class logits [batch, 2] "
        f"(0 = reject, 1 = accept); got outputs of shape {_shape(outputs)}"
    )


def _check_classes(task: TaskLike, logits: torch.Tensor, ndim: int) -> None:
    if logits.ndim != ndim or logits.shape[-1] != len(task.classes):
        layout = "[batch, classes]" if ndim == 2 else "[batch, pos, classes]"
        raise ExactLensError(
            f"task {task.name!r} ({task.kind}) reads {len(task.classes)} class logits {layout}; "
            f"got outputs of shape {_shape(logits)}"
        )


def _regression_values(task: TaskLike, per_position: torch.Tensor) -> torch.Tensor:
    if per_position.ndim == 3 and per_position.shape[-1] == 1:
        return per_position[..., 0]
    if per_position.ndim == 2:
        return per_position
    raise ExactLensError(
        f"task {task.name!r} (regression) reads one value per position [batch, pos] or [batch, pos, 1]; "
        f"got per-position outputs of shape {_shape(per_position)}"
    )


# ---- losses and scores -------------------------------------------------------------------------


def loss(task: TaskLike, outputs: torch.Tensor, targets: torch.Tensor, n_positions: torch.Tensor) -> torch.Tensor:
    """Per-word training loss [B]: cross-entropy in nats (membership, classification; prediction:
    mean over the word's target positions) or the mean squared error (regression)."""
    kind = task.kind
    if kind == "membership":
        logit = _membership_logit(task, outputs)
        return F.binary_cross_entropy_with_logits(logit, targets.to(logit.dtype), reduction="none")
    if kind == "classification":
        _check_classes(task, outputs, 2)
        return F.cross_entropy(outputs, targets.long(), reduction="none")
    per_position = symbol_outputs(task, outputs)
    valid = valid_targets(task, n_positions, per_position.shape[1], targets)
    if kind == "prediction":
        _check_classes(task, per_position, 3)
        safe = torch.where(valid, targets.long(), 0)
        each = F.cross_entropy(per_position.transpose(1, 2), safe, reduction="none")
    else:
        values = _regression_values(task, per_position)
        safe = torch.where(valid, targets.to(values.dtype), 0.0)  # an undefined (NaN) target: no gradient of NaN
        each = (values - safe).pow(2)
    return _masked_mean(each, valid)


def mean_loss_gradient(task: TaskLike, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor | None:
    """d mean(loss(task, outputs, ...)) / d outputs in closed form where there is one, else None (the caller runs
    autograd): a membership task's binary cross-entropy of one logit per word, outputs [B]. Written with the
    operations of autograd's own backward in their order (the mean's 1 / B, then (sigmoid(z) - y) times it), so
    the values are what ``backward()`` gives, bit for bit (tests/train/test_hand_step.py)."""
    if task.kind != "membership" or outputs.ndim != 1:
        return None
    scale = torch.ones((), dtype=outputs.dtype, device=outputs.device) / outputs.shape[0]
    return (torch.sigmoid(outputs) - targets.to(outputs.dtype)) * scale


def _masked_mean(values: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    weights = valid.to(values.dtype)
    return (values * weights).sum(1) / weights.sum(1).clamp(min=1)


def cross_entropy_bits(
    task: TaskLike, outputs: torch.Tensor, targets: torch.Tensor, n_positions: torch.Tensor
) -> torch.Tensor | None:
    """Cross-entropy in bits per word (membership, classification; Chiang & Cholak's measure) or per
    predicted position, averaged over the word (prediction), computed in float64 from the outputs;
    None for regression."""
    if task.kind == "regression":
        return None
    return loss(task, outputs.double(), targets, n_positions) / LN2


@dataclass
class Scores:
    """What one batch of words scored: per word, and per target position for per-position kinds."""

    correct: torch.Tensor  # bool [B]: every target of the word right
    position_correct: torch.Tensor | None  # bool [B, L] (per-position kinds), with `valid`
    valid: torch.Tensor | None  # bool [B, L]
    squared_error: torch.Tensor | None  # [B, L] (regression)

    @property
    def accuracy(self) -> float:
        return float(self.correct.double().mean())

    @property
    def per_position_accuracy(self) -> float | None:
        if self.position_correct is None:
            return None
        count = int(self.valid.sum())
        return float((self.position_correct & self.valid).sum()) / count if count else None


def score(
    task: TaskLike,
    predictions: torch.Tensor,
    targets: torch.Tensor,
    n_positions: torch.Tensor,
    tolerance: float | None = None,
) -> Scores:
    """Compare decisions with targets. Regression predictions are right within ``tolerance``
    (default: :func:`regression_tolerance` of float64 and the targets)."""
    kind = task.kind
    if kind in ("membership", "classification"):
        if predictions.shape != targets.shape:
            raise ExactLensError(
                f"task {task.name!r}: predictions of shape {_shape(predictions)} do not match targets "
                f"of shape {_shape(targets)}"
            )
        return Scores(predictions == targets.to(predictions.dtype), None, None, None)
    if predictions.ndim != 2 or targets.ndim != 2 or predictions.shape[0] != targets.shape[0]:
        raise ExactLensError(
            f"task {task.name!r}: per-position predictions and targets must be [batch, positions] of one "
            f"batch, got {_shape(predictions)} and {_shape(targets)}"
        )
    width = targets.shape[1]
    valid = valid_targets(task, n_positions, width, targets)
    if predictions.shape[1] < width:  # narrower predictions: only padding may be missing
        if valid[:, predictions.shape[1]:].any():
            raise ExactLensError(
                f"task {task.name!r}: predictions cover {predictions.shape[1]} positions but the targets "
                f"have answers at up to {width}"
            )
        width = predictions.shape[1]
        targets, valid = targets[:, :width], valid[:, :width]
    predictions = predictions[:, :width]
    if kind == "prediction":
        right = predictions == targets.long()
        squared = None
    else:
        squared = (predictions.double() - targets.double()).pow(2)
        tol = regression_tolerance(torch.float64, targets) if tolerance is None else tolerance
        right = squared.sqrt() <= tol
    return Scores((right | ~valid).all(1), right, valid, squared)


def regression_tolerance(dtype: torch.dtype, targets: torch.Tensor, scale: float = 1.0) -> float:
    """16 units of rounding of ``dtype`` at the size of the largest target (or ``scale``, the size of
    the largest value a construction computes on the way, when larger): an exact regression
    construction is right within this."""
    size = max(1.0, float(targets.double().nan_to_num(0.0).abs().max()) if targets.numel() else 0.0, float(scale))
    return 16 * torch.finfo(dtype).eps * size


def r2(values: torch.Tensor, targets: torch.Tensor, valid: torch.Tensor) -> float | None:
    """Coefficient of determination over the valid entries (None when the targets are constant)."""
    y = targets.double()[valid]
    residual = float((values.double()[valid] - y).pow(2).sum())
    total = float((y - y.mean()).pow(2).sum()) if y.numel() else 0.0
    return 1.0 - residual / total if total > 0 else None

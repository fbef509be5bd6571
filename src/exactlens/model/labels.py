"""Names of residual dimensions (``ExactConfig.residual_labels``) and the directions they stand for.

A model whose residual is doubled to [x; -x] so that post-LN only rescales (Chiang & Cholak §4.1, the
Cookbook's §6.3) holds each label L twice: L and its negated copy "-(L)". Moving one of the two alone
moves the mean and the norm that layer norm divides by, and changes no decision, so the variable L is the
one direction (e_L - e_-(L)) / sqrt(2), along which x_L is still the coordinate (times sqrt(2)).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch


def negated_label(label: str) -> str:
    """The label of the negated copy of ``label`` in a [x; -x] residual."""
    return f"-({label})"


def negated_copy(labels: Sequence[str], label: str) -> int | None:
    """The index of ``label``'s negated copy where ``labels`` holds it (and ``label`` is no negated copy
    itself), else None."""
    name = negated_label(label)
    if label.startswith("-(") or list(labels).count(name) != 1:
        return None
    return list(labels).index(name)


def is_negated_copy(labels: Sequence[str], label: str) -> bool:
    """True for "-(L)" where L is also a label: the second half of a doubled residual."""
    return label.startswith("-(") and label.endswith(")") and label[2:-1] in labels


def label_direction(labels: Sequence[str], label: str, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """The unit residual direction of a label: its dimension, or (e_L - e_-(L)) / sqrt(2) where the residual
    also holds its negated copy."""
    labels = list(labels)
    direction = torch.zeros(len(labels), dtype=dtype)
    index = labels.index(label)
    partner = negated_copy(labels, label)
    if partner is None:
        direction[index] = 1.0
    else:
        direction[index], direction[partner] = 1.0 / math.sqrt(2.0), -1.0 / math.sqrt(2.0)
    return direction

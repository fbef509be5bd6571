"""Evaluation metrics a preset adds to its history records.

A metric names the history fields it fills (``fields``, each "test_<name>") and the hooks it
needs (``hooks``: a TransformerLens names filter); during each evaluation the loop runs the
model on the test words in chunks, caches those hooks, and calls ``compute(model, batch,
cache)``, which returns, per field, the *sum* over the chunk's words. The loop divides by the
number of test words, so a field is a mean per word. In epochs without an evaluation the
fields are null, like the loop's own test fields.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

NamesFilter = Callable[[str], bool]


@dataclass(frozen=True)
class Metric:
    fields: tuple[str, ...]  # history keys, e.g. ("test_attn_first",)
    hooks: NamesFilter
    compute: Callable[[Any, Any, dict[str, torch.Tensor]], dict[str, float]]  # (model, batch, cache) -> sums
    description: str = ""

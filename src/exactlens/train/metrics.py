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


def _attention_to_first(model: Any, batch: Any, cache: dict[str, torch.Tensor]) -> dict[str, float]:
    """Attention weight of the query at position 0 ([CLS]) on position 1 (the first symbol), summed
    over layers and averaged over heads; summed over the words of the batch."""
    if batch.tokens.shape[1] < 2:
        return {"test_attn_first": 0.0}
    total = sum(float(p[:, :, 0, 1].mean(1).sum()) for name, p in cache.items() if name.endswith("hook_pattern"))
    return {"test_attn_first": total}


ATTENTION_TO_FIRST = Metric(
    ("test_attn_first",),
    lambda name: name.endswith("attn.hook_pattern"),
    _attention_to_first,
    "[CLS]'s attention to the first symbol, summed over layers, mean over heads (Chiang & Cholak Fig. 4)",
)

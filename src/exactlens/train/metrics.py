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

from exactlens.errors import ExactLensError
from exactlens.model.components import visible_keys

NamesFilter = Callable[[str], bool]


@dataclass(frozen=True)
class Metric:
    fields: tuple[str, ...]  # history keys, e.g. ("test_attn_first",)
    hooks: NamesFilter
    compute: Callable[[Any, Any, dict[str, torch.Tensor]], dict[str, float]]  # (model, batch, cache) -> sums
    description: str = ""
    # the query positions whose activations ``compute`` reads, or None (any): when every metric of an evaluation
    # names only the model's readout position, the last layer is computed at that position alone
    # (``readout_only``, as in training), and its hooks see that row only
    query_positions: tuple[int, ...] | None = None
    # hooks for float64 models instead of ``hooks`` (None: the same): float64 evaluations keep the arithmetic they
    # had bit for bit (tests/train/test_bit_identical.py), where a cheaper path rounds differently
    float64_hooks: NamesFilter | None = None

    def hooks_for(self, model: Any) -> NamesFilter:
        """The hooks to cache for ``model``."""
        if self.float64_hooks is not None and model.cfg.dtype == "float64":
            return self.float64_hooks
        return self.hooks


def _attention_to_first(model: Any, batch: Any, cache: dict[str, torch.Tensor]) -> dict[str, float]:
    """Attention weight of the query at position 0 ([CLS]) on position 1 (the first symbol), summed
    over layers and averaged over heads; summed over the words of the batch. Computed from each layer's
    queries and keys (Attention.pattern_rows: the pattern's row 0 only), so the forward pass keeps torch's
    fused attention and no [query, key] tensor is made; float64 models hook the whole patterns, whose row 0
    is the same function and keeps the bits float64 histories had."""
    n_pos = batch.tokens.shape[1]
    if n_pos < 2:
        return {"test_attn_first": 0.0}
    patterns = [p for name, p in cache.items() if name.endswith("hook_pattern")]
    if patterns:  # float64: from the whole patterns, as before (the same bits)
        return {"test_attn_first": sum(float(p[:, :, 0, 1].mean(1).sum()) for p in patterns)}
    total = 0.0
    for layer, block in enumerate(model.blocks):
        q, k = cache[f"blocks.{layer}.attn.hook_q"], cache[f"blocks.{layer}.attn.hook_k"]
        if q.shape[1] != n_pos and model.cfg.readout_position != 0:  # a readout-only last layer at another row
            raise ExactLensError("test_attn_first reads query position 0; this forward computed the last layer "
                                 f"at the readout position {model.cfg.readout_position} only")
        allowed = visible_keys(block.attn.mask, n_pos, batch.n_positions, batch.padded)
        row0 = None if allowed is None else allowed[:, :, :1]
        pattern = block.attn.pattern_rows(q[:, :1], k, batch.n_positions, row0)
        total += float(pattern[:, :, 0, 1].mean(1).sum())
    return {"test_attn_first": total}


ATTENTION_TO_FIRST = Metric(
    ("test_attn_first",),
    lambda name: name.endswith(("attn.hook_q", "attn.hook_k")),
    _attention_to_first,
    "[CLS]'s attention to the first symbol, summed over layers, mean over heads (Chiang & Cholak Fig. 4)",
    query_positions=(0,),
    float64_hooks=lambda name: name.endswith("attn.hook_pattern"),
)

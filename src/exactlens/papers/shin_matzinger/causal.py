"""The causal side of the pair-logic verdict: interchange interventions at the attention output.

High-level model of the task at position i: P = X_(i-1) (the previous category, which only
attention can bring to position i) and V = q_true(P, X_i) (the pair's value, the answer). For a
base and a source word of the same length we replace the attention output at every position by
the source's (``blocks.0.hook_attn_out``: the whole component, i.e. DAS at full dimension, so no
fit is involved) and ask which high-level interchange the model's new answer follows:

* ``iia_previous``: the answer becomes q_true(P_source, X_i_base), what setting P would give: the
  attention output carries the previous category and the pair is put together after it (FFN);
* ``iia_value``: the answer becomes the source's own value q_true(P_source, X_i_source): the
  attention output already carries the pair's value, so the pair is put together in attention.

Both are counted on the positions where that counterfactual answer differs from the base answer,
an answer being "right" when the nearest entry of q_true to the patched output is the
counterfactual entry. ``iia_value_at_ffn`` repeats the value interchange at the FFN output (the
reference: the prediction is read from there).

Causal verdict (CAUSAL_RULE): "attention" if iia_value >= 0.9; "ffn" if iia_previous >= 0.9 and
iia_value < 0.5; "unlearned" if neither interchange moves the answer (both < 0.1); else "mixed".

What it can and cannot see: an interchange tests what information a component carries, not which
weights hold q_true. Shin & Matzinger's solution 3 stores q_true in the value map (v = A_2^T): its
attention output at i is the row q_true(X_(i-1), .), a re-encoding of P from which the FFN picks
entry X_i; causally that is the same flow as solution 1 (attention moves P, the FFN combines), so
the causal verdict says "ffn" where the weight-based verdict says "attention". The two verdicts
answer different questions; docs/shin_matzinger.md reports both on the exact solutions.
"""

from __future__ import annotations

from typing import Any

import torch

from exactlens.model import ExactTransformer
from exactlens.papers.shin_matzinger.task import PairBatch

CAUSAL_RULE = {"value": 0.9, "previous": 0.9, "not_value": 0.5, "moved": 0.1}
ATTN_OUT = "blocks.0.hook_attn_out"
MLP_OUT = "blocks.0.hook_mlp_out"


@torch.no_grad()
def _patched(model: ExactTransformer, base: PairBatch, source: PairBatch, site: str) -> torch.Tensor:
    _, cache = model.run_with_cache(source.categories, names_filter=[site])
    donor = cache[site]

    def swap(act: torch.Tensor, hook: Any) -> torch.Tensor:
        return donor.to(act.dtype)

    return model.run_with_hooks(base.categories, fwd_hooks=[(site, swap)])[..., 0].double().cpu()


def _nearest_entry(values: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Index (into q.flatten()) of the entry of q nearest to each value."""
    return (values.unsqueeze(-1) - q.flatten().to(values.dtype)).abs().argmin(-1)


def _accuracy(patched: torch.Tensor, expected: torch.Tensor, base_index: torch.Tensor, mask: torch.Tensor,
              q: torch.Tensor) -> float | None:
    changed = (expected != base_index) & mask
    if not bool(changed.any()):
        return None
    return float((_nearest_entry(patched, q) == expected)[changed].double().mean())


def interchanges(model: ExactTransformer, q_true: torch.Tensor, base: PairBatch, source: PairBatch) -> dict[str, Any]:
    """The three interchange accuracies of the module docstring on one (base, source) batch pair."""
    q = q_true.double()
    n = q.shape[0]
    xb, xs = base.categories, source.categories
    mask = base.mask.unsqueeze(0).expand(xb.shape)
    prev_b = torch.zeros_like(xb)
    prev_b[:, 1:] = xb[:, :-1]
    prev_s = torch.zeros_like(xs)
    prev_s[:, 1:] = xs[:, :-1]
    base_index = prev_b * n + xb  # q entry of the base answer
    set_previous = prev_s * n + xb  # q(P_source, X_base)
    source_value = prev_s * n + xs  # q(P_source, X_source)
    at_attention = _patched(model, base, source, ATTN_OUT)
    at_ffn = _patched(model, base, source, MLP_OUT)
    return {
        "iia_previous": _accuracy(at_attention, set_previous, base_index, mask, q),
        "iia_value": _accuracy(at_attention, source_value, base_index, mask, q),
        "iia_value_at_ffn": _accuracy(at_ffn, source_value, base_index, mask, q),
        "positions": int(mask.sum()),
    }


def causal_verdict(result: dict[str, Any]) -> str:
    rule = CAUSAL_RULE
    value, previous = result["iia_value"] or 0.0, result["iia_previous"] or 0.0
    if value >= rule["value"]:
        return "attention"
    if previous >= rule["previous"] and value < rule["not_value"]:
        return "ffn"
    if max(value, previous) < rule["moved"]:
        return "unlearned"
    return "mixed"

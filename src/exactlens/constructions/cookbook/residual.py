"""Running a compiled model on chosen values of its residual labels (:func:`run_on_residual`) and reading
one label back (:func:`read`). Overview: :mod:`exactlens.constructions.cookbook.program`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from exactlens.errors import ExactLensError
from exactlens.model import ExactTransformer


def residual_tensor(model: ExactTransformer, values: Mapping[str, Any]) -> torch.Tensor:
    """[batch, pos, d_model] with the given labels set (others 0); values broadcast to [batch, pos]."""
    labels = model.cfg.residual_labels
    if labels is None:
        raise ExactLensError("the model has no residual labels")
    unknown = sorted(set(values) - set(labels))
    if unknown:
        raise ExactLensError(f"no residual dimensions named {unknown}; have {list(labels)}")
    dt = model.cfg.torch_dtype
    tensors = {k: torch.as_tensor(v, dtype=dt) for k, v in values.items()}
    if not tensors:
        raise ExactLensError("give at least one label's values")
    shape = torch.broadcast_shapes(*(t.shape for t in tensors.values()))
    if len(shape) != 2:
        raise ExactLensError(f"values must broadcast to [batch, pos], got shape {tuple(shape)}")
    x = torch.zeros(*shape, len(labels), dtype=dt)
    for label, t in tensors.items():
        x[..., labels.index(label)] = t.expand(shape)
    return x


def run_on_residual(
    model: ExactTransformer, values: Mapping[str, Any], n_positions: torch.Tensor | None = None, **cache_kwargs: Any
) -> tuple[torch.Tensor, Any]:
    """Run the real forward with the token embedding replaced by ``values`` (through the
    hook_embed hook; positional features are still added). Returns (output, ActivationCache)."""
    x = residual_tensor(model, values)
    tokens = torch.zeros(x.shape[:2], dtype=torch.long)

    def put(_act: torch.Tensor, hook: Any) -> torch.Tensor:
        return x

    with model.hooks(fwd_hooks=[("hook_embed", put)]):
        return model.run_with_cache(tokens, n_positions=n_positions, **cache_kwargs)


def read(cache: Any, model: ExactTransformer, hook: str, label: str) -> torch.Tensor:
    """cache[hook][..., dimension named label], e.g. read(cache, model, "blocks.0.hook_resid_post", "y")."""
    labels = model.cfg.residual_labels
    if label not in labels:
        raise ExactLensError(f"no residual dimension named {label!r}; have {list(labels)}")
    return cache[hook][..., labels.index(label)]

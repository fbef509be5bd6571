"""An exact model without its idle FFN units: the same function in less work.

A hidden unit whose output weights (its row of ``W_out``) are all zero adds exactly 0 to the residual stream,
whatever its input. Compiled RASP programs leave most of their FFN units so: tracr sizes every layer's FFN for
the widest MLP it compiles, and ``tracr-shuffle_dyck`` keeps 3-16 of its 146 units busy per layer,
``tracr-shuffle_dyck2`` 1-16 of 132. Every forward pass still multiplies through all of them (half of a
``tracr-shuffle_dyck`` forward). :func:`without_idle_units` gives a copy whose FFNs are as wide as the busiest
layer's live units: every residual-stream activation and output is the same (each dropped term was an exact
zero), only the FFNs' own hidden activations (``hook_pre``, ``hook_post``) are narrower. Hooks attached to the
model are not carried over: the copy is for code that attaches its own (the diff's alignment).
"""

from __future__ import annotations

import torch

from exactlens.model.config import ExactConfig
from exactlens.model.transformer import ExactTransformer


def idle_units(model: ExactTransformer) -> list[list[int]]:
    """Per layer, the FFN units whose row of W_out is all zero and whose input weights and bias are finite (an
    empty list for a layer without an FFN): their term is an exact zero wherever their hidden value is finite (a
    non-finite input weight would make it NaN, and such a unit is kept)."""
    out = []
    for block in model.blocks:
        if block.mlp is None:
            out.append([])
            continue
        mlp = block.mlp
        idle = mlp.W_out.detach().eq(0).all(1) & torch.isfinite(mlp.W_in.detach()).all(0) & \
            torch.isfinite(mlp.b_in.detach())
        out.append(torch.nonzero(idle).flatten().tolist())
    return out


def without_idle_units(model: ExactTransformer) -> ExactTransformer:
    """A copy of ``model`` with d_mlp = the most busy units of any layer (each layer's busy units in their order,
    then idle ones to fill), on the model's device and in its mode; the model itself where that drops nothing."""
    idle = idle_units(model)
    d_mlp = model.cfg.d_mlp
    width = max([d_mlp - len(units) for units in idle] + [1])
    if d_mlp == 0 or width >= d_mlp:
        return model
    keep = []
    for units in idle:
        idle_set = set(units)
        busy = [u for u in range(d_mlp) if u not in idle_set]
        keep.append(torch.tensor(busy + units[:width - len(busy)]))
    first = next(model.parameters())  # its dtype and device, which a cast model may hold apart from its config's
    copy = ExactTransformer(ExactConfig.from_dict({**model.cfg.to_dict(), "d_mlp": width})).to(first.device,
                                                                                                first.dtype)
    state = dict(model.state_dict())
    for layer, units in enumerate(keep):
        prefix = f"blocks.{layer}.mlp."
        if prefix + "W_in" in state:
            state[prefix + "W_in"] = state[prefix + "W_in"][:, units]
            state[prefix + "b_in"] = state[prefix + "b_in"][units]
            state[prefix + "W_out"] = state[prefix + "W_out"][units]
    copy.load_state_dict(state)
    copy.cfg.metadata["idle_units_dropped_from_d_mlp"] = d_mlp
    for mine, theirs in zip(model.modules(), copy.modules(), strict=True):  # fused kernels as the model has them
        if hasattr(mine, "fused"):
            theirs.fused = mine.fused
    return copy.train(model.training)

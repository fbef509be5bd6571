"""Shared helpers for the cookbook tests: run pieces through the real ExactTransformer."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from exactlens.constructions.cookbook import FFN, Head, Layer, Program, Readout, compile, read, run_on_residual


def single_layer_model(ffns: Sequence[FFN] = (), heads: Sequence[Head] = (), dtype: str = "float64", **layer_kwargs):
    layer = Layer(heads=tuple(heads), ffns=tuple(ffns), **layer_kwargs)
    labels = layer.labels()
    program = Program(
        vocab=("x",), embedding={}, layers=(layer,), readout=Readout({"out": {labels[0]: 1.0}}), name="test"
    )
    return compile(program, dtype=dtype)


def run_ffn(piece: FFN, values: Mapping[str, torch.Tensor], dtype: str = "float64") -> dict[str, torch.Tensor]:
    """Residual after the layer, per label, for inputs given as [batch, pos] (or broadcastable) tensors."""
    model = single_layer_model(ffns=[piece], dtype=dtype)
    _, cache = run_on_residual(model, values)
    return {label: read(cache, model, "blocks.0.hook_resid_post", label) for label in model.cfg.residual_labels}


def grid(*axes: torch.Tensor) -> list[torch.Tensor]:
    """Cartesian product of 1-d tensors, each as a [1, N] tensor (batch 1, N positions)."""
    mesh = torch.meshgrid(*axes, indexing="ij")
    return [m.reshape(1, -1) for m in mesh]

"""The Transformer Cookbook (Yang et al. 2025) as composable, tested recipes.

``program``: pieces over named residual labels (FFN, Head), layers, programs, compile,
serial/parallel composition and routing. ``ffn``, ``attention``, ``layer_norm``: the
recipes of §4, §5, §6, each returning pieces (or layers) over labels the caller names.
"""

from exactlens.constructions.cookbook import attention, ffn, layer_norm, layer_norm_hash
from exactlens.constructions.cookbook.program import (
    FFN,
    Head,
    Layer,
    Program,
    Readout,
    Selector,
    compile,
    parallel,
    read,
    rename,
    residual_tensor,
    run_on_residual,
    serial,
)

__all__ = [
    "attention",
    "ffn",
    "layer_norm",
    "layer_norm_hash",
    "FFN",
    "Head",
    "Layer",
    "Program",
    "Readout",
    "Selector",
    "compile",
    "parallel",
    "read",
    "rename",
    "residual_tensor",
    "run_on_residual",
    "serial",
]

"""The Transformer Cookbook (Yang et al. 2025) as composable, tested recipes.

``program``: pieces over named residual labels (FFN, Head), layers, programs, compile,
serial/parallel composition and routing. ``ffn``, ``attention``, ``layer_norm``: the
recipes of §4, §5, §6, each returning pieces (or layers) over labels the caller names.
``predecessor``: §5.4, both constructions. ``rounding``, ``error_bounds``: §7.1 and §7.2.
"""

from exactlens.constructions.cookbook import (
    attention,
    error_bounds,
    ffn,
    layer_norm,
    layer_norm_hash,
    predecessor,
    rounding,
)
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
    "error_bounds",
    "ffn",
    "layer_norm",
    "layer_norm_hash",
    "predecessor",
    "rounding",
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

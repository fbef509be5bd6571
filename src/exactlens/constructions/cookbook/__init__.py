"""The Transformer Cookbook (Yang et al. 2025) as composable, tested recipes.

The compiler, one module per pass (``program`` is its overview and exports them all): ``pieces``
(FFN, Head, Selector over named residual labels, routing), ``layers`` (Layer, Program), ``assemble``
(compile), ``compose`` (serial/parallel composition, rename), ``residual`` (run_on_residual, read).
``ffn``, ``attention``, ``layer_norm``: the recipes of §4, §5, §6, each returning pieces (or layers) over
labels the caller names.
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

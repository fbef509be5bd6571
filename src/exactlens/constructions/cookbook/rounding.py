"""Rounding as a mechanism (Transformer Cookbook §7.1): fixed-precision activations.

A fixed-point transformer with p fractional bits holds every activation on the grid
delta Z, delta = 2^-p (a power of two, so grid values are exact binary floats). §7.1.1:
the §4.7 step FFN

    step(x) = (relu(x) - relu(x - delta)) / delta

is wrong only for 0 < x < delta (its gray region); on the grid no value lies there, so it
is exactly [x > 0]: for x <= 0 both units give 0 (or cancel), for x >= delta the
difference is delta. Scaled up to comparisons of two grid values by routing x - y into
it (§8.2): [x > y] = step(x - y), [x >= y] = step(x - y + delta), [x = y] = the §4.7 hat
with tolerance delta, all exact on the grid.

``fixed_point_hooks`` makes a model *be* fixed-point: forward hooks round the activations
(embeddings, sublayer outputs, the residual stream, FFN pre-activations and activations)
to the grid, with round-to-nearest or rounding toward zero (the cookbook's "values smaller
than delta rounded down to 0"). Then the step/compare FFNs are exact for *every* real
input, judged on the rounded input (tests: against ``quantize``).

In floating point the grid is exact only while |x| / delta < 2^24 (float32) or 2^53
(float64): beyond, x - delta is not representable and the step FFN returns 2 (measured in
the tests: first failure at x = (2^24 + 2) delta in float32).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from exactlens.constructions.cookbook import ffn
from exactlens.constructions.cookbook.pieces import FFN
from exactlens.errors import ExactLensError

MODES = ("nearest", "toward_zero")
RELATIONS = (">", ">=", "<", "<=", "=")

FIXED_POINT_HOOKS = (
    "hook_embed",
    "hook_pos_embed",
    "hook_attn_out",
    "hook_resid_mid",
    "mlp.hook_pre",
    "mlp.hook_post",
    "hook_mlp_out",
    "hook_resid_post",
)
"""Hook points rounded by ``fixed_point_hooks`` (name endings): everything the residual
stream and an FFN hold. Attention internals (scores, pattern) stay real-valued: the
cookbook's §7.1 is about comparisons in FFNs; §5.7 treats rounding inside attention."""


def resolution(fraction_bits: int) -> float:
    """delta = 2^-fraction_bits. At least 0 bits, so that the grid holds the integers (the
    comparisons output 0 and 1); at most 60."""
    if isinstance(fraction_bits, bool) or not isinstance(fraction_bits, int) or not 0 <= fraction_bits <= 60:
        raise ExactLensError(f"fraction_bits must be an integer in [0, 60] (delta = 2^-bits), got {fraction_bits!r}")
    return 2.0**-fraction_bits


def quantize(x: torch.Tensor, fraction_bits: int, mode: str = "nearest") -> torch.Tensor:
    """x rounded to the grid 2^-fraction_bits Z: to the nearest point (ties to even) or toward 0."""
    delta = resolution(fraction_bits)
    if mode not in MODES:
        raise ExactLensError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
    scaled = x / delta  # exact: delta is a power of two
    return (torch.round(scaled) if mode == "nearest" else torch.trunc(scaled)) * delta


def fixed_point_hooks(model, fraction_bits: int, mode: str = "nearest") -> list[tuple[str, Callable]]:
    """Forward hooks [(name, fn)] that round every FIXED_POINT_HOOKS activation of ``model`` to
    the grid; use ``with model.hooks(fwd_hooks=...)`` or ``model.run_with_hooks``."""
    quantize(torch.zeros(1), fraction_bits, mode)  # checks the arguments

    def round_activation(act: torch.Tensor, hook) -> torch.Tensor:
        return quantize(act, fraction_bits, mode)

    names = [name for name in model.hook_dict if name.endswith(FIXED_POINT_HOOKS)]
    return [(name, round_activation) for name in names]


def step(x: str, out: str, fraction_bits: int, name: str = "step") -> FFN:
    """§7.1.1: out += [x > 0], exact for x on the grid 2^-fraction_bits Z (the §4.7
    comparator with tolerance delta: (relu(x) - relu(x - delta)) / delta)."""
    return ffn.greater_than(x, out, resolution(fraction_bits), name=name)


def compare(x: str, y: str, out: str, relation: str, fraction_bits: int, name: str = "compare") -> FFN:
    """out += [x relation y] for x, y on the grid 2^-fraction_bits Z, exact: the §4.7
    comparators with tolerance delta, fed d = x - y (or y - x) by the routing lemma."""
    delta = resolution(fraction_bits)
    if relation not in RELATIONS:
        raise ExactLensError(f"relation must be one of {' '.join(RELATIONS)}, got {relation!r}")
    if x == y:
        raise ExactLensError(f"compare needs two different labels, got {x!r} twice")
    difference = {"d": {x: 1.0, y: -1.0}} if relation in (">", ">=", "=") else {"d": {y: 1.0, x: -1.0}}
    if relation in (">", "<"):
        piece = ffn.greater_than("d", out, delta, name=name)
    elif relation in (">=", "<="):
        piece = ffn.greater_equal("d", out, delta, name=name)
    else:
        piece = ffn.equal_zero("d", out, delta, name=name)
    return piece.route(inputs=difference)

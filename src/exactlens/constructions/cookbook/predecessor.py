"""Predecessor (Transformer Cookbook §5.4): position i receives the value held at position i - 1.

Position 0 has no predecessor; both constructions write 0 there (the cookbook's "return a
special value": 0 is the value no one-hot symbol has). Formulas re-derived from the text
(the displays were lost in our copy); tests check them against plain Python indexing.

``strict`` (strict future masking, keys j < i): score = j, so the maximum over the visible
keys is at j = i - 1 (gap 1 for integer positions); position 0 sees no key and the model
writes 0. ``strict_successor`` is the mirror (strict past masking, score -j).

``non_strict`` (non-strict future masking, keys j <= i; rightmost unique-hard attention;
positional encoding P_i = (-1)^i and F_i = I[i = 0]). Two heads with constant queries:

    even head: score (+1) * P_j, maximal at even j: rightmost even j <= i is i - 1 when i is odd
    odd head:  score (-1) * P_j, maximal at odd j:  rightmost odd j <= i is i - 1 when i is even > 0

(at i = 0 there is no odd key, every score ties and the rightmost key is 0 itself). With
values |v| <= B, one FFN selects the right head (the §4.9 conditional, extended to write 0
at i = 0), per output:

    y = relu(e - B P) + relu(d + B P - 2 B F) - relu(B - B F)

i odd (P = -1, F = 0): (e + B) + 0 - B = e;  i even > 0 (P = 1, F = 0): 0 + (d + B) - B = d;
i = 0 (P = 1, F = 1): relu(e - B) + relu(d - B) - 0 = 0. Values beyond B leak (tested).
The heads may share one layer or sit in two layers (the cookbook's "two future-masked
attention layers, or one layer with two heads").
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from exactlens.constructions.cookbook.layers import Layer
from exactlens.constructions.cookbook.pieces import FFN, Head
from exactlens.errors import ExactLensError

ValueMap = Mapping[str, str]
"""output label -> input label (copied with weight 1)."""

PARITY_FEATURE = "cos(i*pi)"
"""The positional feature that holds (-1)^i exactly (exactlens.model.positional)."""

FIRST_FEATURE = "I[i=0]"

LAYOUTS = ("one_layer", "two_layers")


def _value(values: ValueMap) -> dict[tuple[str, str], float]:
    if not values:
        raise ExactLensError("give at least one value (output label -> input label)")
    return {(out, src): 1.0 for out, src in values.items()}


# ----------------------------------------------------------------------------- strict masking


def strict(
    pos: str, values: ValueMap, weighting: str = "unique_hard_right", scale: float = 1.0, name: str = "predecessor"
) -> Layer:
    """§5.4 with strict future masking: score = scale * j (label pos holds the position j)
    over keys j < i, maximal at j = i - 1 (gap = scale for integer positions). Position 0
    sees no key and gets 0. Also ``attention.predecessor``."""
    head = Head.build(query={}, key={pos: [1.0]}, value=_value(values), q_bias=[1.0], name=name).scaled(scale)
    return Layer(heads=(head,), mask="strict_causal", weighting=weighting)


def strict_successor(
    pos: str, values: ValueMap, weighting: str = "unique_hard_left", scale: float = 1.0, name: str = "successor"
) -> Layer:
    """Mirror of ``strict``: score = -scale * j over keys j > i (strict past masking); the
    last position gets 0. Also ``attention.successor``."""
    head = Head.build(query={}, key={pos: [-1.0]}, value=_value(values), q_bias=[1.0], name=name).scaled(scale)
    return Layer(heads=(head,), mask="strict_past", weighting=weighting)


# ----------------------------------------------------------------------------- non-strict masking


def parity_positions(parity: str = "(-1)^i", first: str = "I[i=0]") -> dict[str, dict[str, float]]:
    """Program.positions entries that write (-1)^i to label ``parity`` and I[i=0] to ``first``.
    (``first`` may instead come from §5.2's ``attention.first_position`` on a bos marker.)"""
    return {PARITY_FEATURE: {parity: 1.0}, FIRST_FEATURE: {first: 1.0}}


def scratch_labels(out: str) -> tuple[str, str]:
    """The labels the even and the odd head write for output ``out`` (c_even, c_odd)."""
    return f"c_even[{out}]", f"c_odd[{out}]"


def parity_heads(values: ValueMap, parity: str = "(-1)^i", name: str = "predecessor") -> tuple[Head, Head]:
    """The two heads: score +P_j (even keys win) and -P_j (odd keys win); each copies the
    values of its rightmost maximal key into its scratch labels (``scratch_labels``)."""
    _value(values)
    heads = []
    for side, sign in (("even", 1.0), ("odd", -1.0)):
        column = 0 if side == "even" else 1
        copies = {scratch_labels(out)[column]: src for out, src in values.items()}
        heads.append(
            Head.build(query={}, key={parity: [1.0]}, value=_value(copies), q_bias=[sign], name=f"{name}-{side}")
        )
    return heads[0], heads[1]


def parity_select(
    outputs: Sequence[str],
    parity: str = "(-1)^i",
    first: str = "I[i=0]",
    bound: float = 1.0,
    name: str = "predecessor-select",
) -> FFN:
    """y = relu(e - B P) + relu(d + B P - 2 B F) - relu(B - B F) for every output (2 ReLUs
    each plus one shared): e at odd i, d at even i > 0, 0 at i = 0, for |e|, |d| <= B."""
    B = _check_bound(bound)
    hidden: list[dict[str, float]] = []
    out: dict[str, list[float]] = {label: [] for label in outputs}
    for label in outputs:
        even, odd = scratch_labels(label)
        hidden += [{even: 1.0, parity: -B}, {odd: 1.0, parity: B, first: -2.0 * B}]
        for other in outputs:
            out[other] += [1.0, 1.0] if other == label else [0.0, 0.0]
    hidden.append({first: -B})
    b_in = [0.0] * (len(hidden) - 1) + [B]
    for label in outputs:
        out[label].append(-1.0)
    return FFN.build(hidden, out, b_in=b_in, name=name)


def non_strict(
    values: ValueMap,
    parity: str = "(-1)^i",
    first: str = "I[i=0]",
    bound: float = 1.0,
    layout: str = "one_layer",
    name: str = "predecessor",
) -> tuple[Layer, ...]:
    """§5.4 under non-strict future masking (see the module docstring): out = value at i - 1,
    0 at i = 0, for values in [-bound, bound]. Labels ``parity`` and ``first`` must hold
    (-1)^i and I[i=0] (``parity_positions``). layout "one_layer": both heads and the FFN in
    one layer; "two_layers": the even head alone, then the odd head and the FFN."""
    if layout not in LAYOUTS:
        raise ExactLensError(f"layout must be one of {', '.join(LAYOUTS)}, got {layout!r}")
    even, odd = parity_heads(values, parity, name)
    select = parity_select(tuple(values), parity, first, bound, name=f"{name}-select")
    attend = {"mask": "causal", "weighting": "unique_hard_right"}
    if layout == "one_layer":
        return (Layer(heads=(even, odd), ffns=(select,), **attend),)
    return (Layer(heads=(even,), **attend), Layer(heads=(odd,), ffns=(select,), **attend))


def _check_bound(bound: float) -> float:
    if isinstance(bound, bool) or not (isinstance(bound, (int, float)) and math.isfinite(bound) and bound > 0):
        raise ExactLensError(f"bound (the largest |value| copied) must be a finite number > 0, got {bound!r}")
    return float(bound)

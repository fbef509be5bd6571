"""Self-attention recipes (Transformer Cookbook §5), as Head pieces or Layers over named labels.

Scores are exactly q . k (compile uses attn_scale = 1). Recipes that need a particular
mask or weighting return a Layer (or say so in their docstring); heads from
``lookup_*`` are exact under average-hard / unique-hard weighting and approximate under
softmax until scaled by ``softmax_scale_for_hard`` (§5.7).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import replace

import torch

from exactlens.constructions.cookbook.layers import Layer
from exactlens.constructions.cookbook.pieces import FFN, Head
from exactlens.constructions.cookbook.predecessor import strict as strict_predecessor
from exactlens.constructions.cookbook.predecessor import strict_successor
from exactlens.errors import ExactLensError

ValueMap = Mapping[str, str]
"""output label -> input label (copied with weight 1)."""


def _value(values: ValueMap) -> dict[tuple[str, str], float]:
    if not values:
        raise ExactLensError("give at least one value (output label -> input label)")
    return {(out, src): 1.0 for out, src in values.items()}


def identity(name: str = "attn-identity") -> Head:
    """§5.1.1: a head with zero values; the residual passes the input through."""
    return Head.build(query={}, key={}, value={}, name=name)


def uniform_average(values: ValueMap, name: str = "average") -> Head:
    """§5.1.2: q = k = 0, every visible key gets the same weight (softmax or average-hard):
    the mean over all positions (mask "none") or the prefix mean (mask "causal")."""
    return Head.build(query={}, key={}, value=_value(values), name=name)


def first_position(bos: str, out: str, scratch: str | None = None, name: str = "first") -> Layer:
    """§5.2: with bos = 1 at position 0 only, causal uniform attention gives
    scratch = 1/(i+1) (1 at i = 0, <= 1/2 after); the FFN writes out = [scratch > 1/2]
    = 2 relu(scratch - 1/2) - 2 relu(scratch - 1), exact since scratch never lies in (1/2, 1)."""
    scratch = scratch or f"1/(i+1)[{bos}]"
    head = uniform_average({scratch: bos}, name=f"{name}-average")
    compare = FFN.build([{scratch: 1.0}, {scratch: 1.0}], {out: [2.0, -2.0]}, b_in=[-0.5, -1.0], name=f"{name}-compare")
    return Layer(heads=(head,), ffns=(compare,), mask="causal")


def match(query: Sequence[str], key: Sequence[str], values: ValueMap, name: str = "match") -> Head:
    """score(i, j) = sum_c x_i[query[c]] x_j[key[c]]: the one-hot (§5.3.1) and the almost-
    orthogonal (§5.3.2) lookups, and the induction-head matching of §9.1."""
    if len(query) != len(key) or not query:
        raise ExactLensError(f"match needs equally many (>= 1) query and key labels, got {len(query)}, {len(key)}")
    d = len(query)
    eye = [[1.0 if r == c else 0.0 for c in range(d)] for r in range(d)]
    return Head.build(
        query=dict(zip(query, eye, strict=False)),
        key=dict(zip(key, eye, strict=False)),
        value=_value(values),
        name=name,
    )


def lookup_one_hot(query: Sequence[str], key: Sequence[str], values: ValueMap, name: str = "lookup-one-hot") -> Head:
    """§5.3.1: query[k] holds [q_i = k], key[k] holds [j = k]; score = [q_i = j], gap 1."""
    return match(query, key, values, name=name)


def almost_orthogonal_dimension(n_vectors: int, eps: float, failure: float) -> int:
    """§5.3.2 sizing (eq. 36, derived here with Hoeffding + a union bound): for d i.i.d.
    random signs per vector scaled by 1/sqrt(d), P(|<u_a, u_b>| >= eps) <= 2 exp(-d eps^2 / 2)
    per pair, so d = ceil(2 / eps^2 * ln(n (n - 1) / failure)) makes all pairs eps-orthogonal
    with probability >= 1 - failure."""
    if not (isinstance(n_vectors, int) and n_vectors >= 2):
        raise ExactLensError(f"n_vectors must be an integer >= 2, got {n_vectors!r}")
    if not (0 < eps < 1) or not (0 < failure < 1):
        raise ExactLensError(f"eps and failure must lie in (0, 1), got {eps!r}, {failure!r}")
    return math.ceil(2.0 / eps**2 * math.log(n_vectors * (n_vectors - 1) / failure))


def almost_orthogonal_vectors(n_vectors: int, dim: int, seed: int = 0) -> torch.Tensor:
    """[n_vectors, dim] unit vectors with entries +-1/sqrt(dim), i.i.d. signs (float64)."""
    gen = torch.Generator().manual_seed(seed)
    signs = torch.randint(0, 2, (n_vectors, dim), generator=gen).to(torch.float64) * 2 - 1
    return signs / math.sqrt(dim)


def lookup_quadratic(query: str, pos: str, pos_sq: str, values: ValueMap, name: str = "lookup-quadratic") -> Head:
    """§5.3.4 (Barcelo et al.): q = [2 q_i, -1], k = [j, j^2] (labels pos, pos_sq), so
    score = 2 q_i j - j^2 = q_i^2 - (j - q_i)^2, uniquely maximal at j = q_i with gap >= 1
    for integers. Positions may be scaled (i/n with (i/n)^2): the gap becomes 1/n^2."""
    return Head.build(
        query={query: [2.0, 0.0]},
        key={pos: [1.0, 0.0], pos_sq: [0.0, 1.0]},
        value=_value(values),
        q_bias=[0.0, -1.0],
        name=name,
    )


# §5.4 predecessor / successor (strict masks) live in ``predecessor`` with the non-strict
# two-head variant; these names stay here as before.
predecessor = strict_predecessor
successor = strict_successor


def split_heads(layer: Layer) -> tuple[Layer, ...]:
    """§5.5: an H-head layer as H single-head layers (outputs summed by the residual),
    the FFN after the last. Exact when no head reads a label another head of the layer writes."""
    written: set[str] = set()
    for h in layer.heads:
        reads = set(h.q_inputs) | set(h.k_inputs) | set(h.v_inputs)
        clash = reads & written
        if clash:
            raise ExactLensError(
                f"head {h.name} reads {sorted(clash)}, written by an earlier head of the layer: "
                "run one after the other it would see their output"
            )
        written |= set(h.outputs)
    if not layer.heads:
        return (layer,)
    singles = [replace(layer, heads=(h,), ffns=()) for h in layer.heads]
    singles[-1] = replace(singles[-1], ffns=layer.ffns)
    return tuple(singles)


def break_ties(head: Head, position: str, gap: float, side: str) -> Head:
    """§5.6: add +-(gap / 2) * p_j to every score, with p_j in [0, 1) strictly increasing in j
    (label ``position``, e.g. the feature i/n). If every non-maximal score is at least ``gap``
    below the maximum, the argmax set shrinks to its leftmost (side="left") or rightmost
    element, so average-hard attention emulates unique-hard attention."""
    if side not in ("left", "right"):
        raise ExactLensError(f"side must be 'left' or 'right', got {side!r}")
    if not (math.isfinite(gap) and gap > 0):
        raise ExactLensError(f"gap must be finite and > 0, got {gap!r}")
    sign = -1.0 if side == "left" else 1.0
    d = head.d_qk
    W_Q = torch.cat([head.W_Q, torch.zeros(len(head.q_inputs), 1, dtype=torch.float64)], 1)
    b_Q = torch.cat([head.b_Q, torch.tensor([sign * gap / 2], dtype=torch.float64)])
    k_inputs = list(head.k_inputs)
    W_K = torch.cat([head.W_K, torch.zeros(len(k_inputs), 1, dtype=torch.float64)], 1)
    if position not in k_inputs:
        k_inputs.append(position)
        W_K = torch.cat([W_K, torch.zeros(1, d + 1, dtype=torch.float64)], 0)
    W_K[k_inputs.index(position), d] = 1.0
    b_K = torch.cat([head.b_K, torch.zeros(1, dtype=torch.float64)])
    return replace(head, W_Q=W_Q, b_Q=b_Q, k_inputs=tuple(k_inputs), W_K=W_K, b_K=b_K, name=f"{head.name}-{side}")


# ----------------------------------------------------------------------------- §5.7


def lemma_5_3_bound(n_keys: int, gap: float) -> float:
    """L1 distance between softmax and average-hard weights when every non-maximal score is
    >= gap below the maximum (Edelman et al. 2022, Lemma B.7; derived: with m maxima and
    R = sum over the others of e^{s_j - s_max} <= (n - m) e^{-gap}, the distance is
    2R / (m + R) <= 2 (n - 1) e^{-gap})."""
    if n_keys < 1:
        raise ExactLensError(f"n_keys must be >= 1, got {n_keys!r}")
    return 2.0 * (n_keys - 1) * math.exp(-gap)


def softmax_scale_for_hard(gap: float, max_length: int, tolerance: float = 0.25) -> float:
    """§5.7: the factor tau for scores (``head.scaled(tau)``) such that with values in [0, 1]
    the soft output is within ``tolerance`` of the average-hard output for every length
    <= max_length: the error is <= R/(m+R) <= (N - 1) e^{-tau gap}, so tau = ln((N-1)/tol)/gap."""
    if not (math.isfinite(gap) and gap > 0):
        raise ExactLensError(f"gap must be finite and > 0, got {gap!r}")
    if not (isinstance(max_length, int) and max_length >= 1):
        raise ExactLensError(f"max_length must be an integer >= 1, got {max_length!r}")
    if not (0 < tolerance < 0.5):
        raise ExactLensError(f"tolerance must lie in (0, 1/2) so that rounding can separate 0 and 1, got {tolerance!r}")
    return max(math.log(max(max_length - 1, 1) / tolerance), 0.0) / gap + 1e-12


def round_to_bit(x: str, out: str, tolerance: float = 0.25, name: str = "round") -> FFN:
    """Values within ``tolerance`` of 0 or 1 -> exactly 0 or 1:
    (relu(x - tol) - relu(x - 1 + tol)) / (1 - 2 tol)."""
    if not (0 < tolerance < 0.5):
        raise ExactLensError(f"tolerance must lie in (0, 1/2), got {tolerance!r}")
    w = 1.0 / (1.0 - 2 * tolerance)
    return FFN.build([{x: 1.0}, {x: 1.0}], {out: [w, -w]}, b_in=[-tolerance, -(1.0 - tolerance)], name=name)

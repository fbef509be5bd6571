"""Index lookup by layer-norm hash (Transformer Cookbook §5.3.3; Merrill & Sabharwal 2024a).

Formulas (re-derived here; the displays were lost in our copy, the tests check them):

- Hash. phi(x, y) = LN([x, y, -x, -y]) with gain 1, bias 0, eps 0. The 4-vector has mean 0
  and mean square (x^2 + y^2) / 2, so phi(x, y) = sqrt(2) [x, y, -x, -y] / sqrt(x^2 + y^2),
  and the hash of an integer t is phi(t) := phi(t, 1).
- Scale invariance. phi(c x, c y) = phi(x, y) for every c > 0 (c < 0 flips the sign), so
  values computed by uniform attention suffice: phi(i + 1) = phi(1, 1/(i+1)) and
  phi(i) = phi(1 - 1/(i+1), 1/(i+1)).
- Score. phi(q) . phi(k) = 4 (q k + 1) / (sqrt(q^2 + 1) sqrt(k^2 + 1)) = 4 cos angle((q, 1), (k, 1)),
  maximal (= 4) exactly at k = q.
- Gap. Over integer keys k >= 0 the runner-up of target t is k = t + 1 (arctan is concave on
  [0, inf)); with a = t^2 + t + 1 = (t, 1) . (t + 1, 1) and |(t,1)| |(t+1,1)| = sqrt(a^2 + 1),
      gap(t) = 4 (1 - a / sqrt(a^2 + 1)) = 4 / (sqrt(a^2 + 1) (sqrt(a^2 + 1) + a)) ~ 2 / t^4,
  (the second form has no cancellation). If t + 1 is not among the keys, the runner-up is
  t - 1, with a = t^2 - t + 1.

Selective layer norm (§5.3.3): ``hash_layer`` is one pre-LN layer whose ln2 selects the four
components [x, y, -x, -y] (``Layer(ln2=...)``) and whose FFN copies the LN output into four
fresh labels; the rest of the stream does not enter the hash. Lookups are then LN-free
layers with ``lookup`` (score = phi(target) . phi(key)), exact under average-hard attention
and within Lemma 5.3's bound under softmax scaled by ``lookup_scale``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import torch

from exactlens.constructions.cookbook import attention
from exactlens.constructions.cookbook.layers import Layer, Program, Readout
from exactlens.constructions.cookbook.pieces import FFN, Head
from exactlens.errors import ExactLensError

F64 = torch.float64


# ----------------------------------------------------------------------------- closed forms


def phi(x: torch.Tensor | float, y: torch.Tensor | float = 1.0) -> torch.Tensor:
    """The layer-norm hash LN([x, y, -x, -y]) in float64, last axis of size 4."""
    x, y = torch.broadcast_tensors(torch.as_tensor(x, dtype=F64), torch.as_tensor(y, dtype=F64))
    norm = torch.sqrt(x * x + y * y)
    if (norm == 0).any():
        raise ExactLensError("phi(0, 0) is undefined (LN of the zero vector with eps = 0)")
    return math.sqrt(2.0) * torch.stack([x, y, -x, -y], -1) / norm.unsqueeze(-1)


def score(query: torch.Tensor | float, key: torch.Tensor | float) -> torch.Tensor:
    """phi(q) . phi(k) = 4 (q k + 1) / (sqrt(q^2 + 1) sqrt(k^2 + 1))."""
    q, k = torch.as_tensor(query, dtype=F64), torch.as_tensor(key, dtype=F64)
    return 4.0 * (q * k + 1.0) / (torch.sqrt(q * q + 1.0) * torch.sqrt(k * k + 1.0))


def gap(target: int | torch.Tensor, neighbour: str = "next") -> torch.Tensor:
    """Score of the target minus the score of key target + 1 ("next", the runner-up among
    integer keys >= 0) or target - 1 ("previous"): 4 / (r (r + a)), r = sqrt(a^2 + 1)."""
    t = torch.as_tensor(target, dtype=F64)
    if neighbour not in ("next", "previous"):
        raise ExactLensError(f"neighbour must be 'next' or 'previous', got {neighbour!r}")
    a = t * t + t + 1.0 if neighbour == "next" else t * t - t + 1.0
    r = torch.sqrt(a * a + 1.0)
    return 4.0 / (r * (r + a))


# ----------------------------------------------------------------------------- recipes


def hash_labels(name: str) -> tuple[str, str, str, str]:
    """Four residual labels for one hash: name[0] .. name[3]."""
    return tuple(f"{name}[{k}]" for k in range(4))  # type: ignore[return-value]


def hash_layer(x: Mapping[str, float], y: Mapping[str, float], out: Sequence[str], name: str = "hash") -> Layer:
    """One selective pre-LN layer writing phi(x, y) into the four (fresh, zero) labels ``out``,
    x and y linear combinations of residual labels ({label: weight}); y > 0 keeps the sign.
    ln2 selects [x, y, -x, -y] into the slots ``out``; an identity FFN copies them out."""
    out = tuple(out)
    if len(out) != 4 or len(set(out)) != 4:
        raise ExactLensError(f"hash_layer writes 4 distinct labels, got {list(out)}")
    if not x or not y:
        raise ExactLensError("hash_layer needs x and y as non-empty {label: weight} maps")
    clash = sorted((set(x) | set(y)) & set(out))
    if clash:
        raise ExactLensError(f"hash_layer: the output labels {clash} are also inputs; write to fresh labels")
    neg = {label: -float(w) for label, w in x.items()}, {label: -float(w) for label, w in y.items()}
    selector = dict(zip(out, (dict(x), dict(y), neg[0], neg[1]), strict=True))
    copy = FFN.build(
        [{label: 1.0} for label in out],
        {label: [1.0 if u == k else 0.0 for u in range(4)] for k, label in enumerate(out)},
        activation="identity",
        name=f"{name}-copy",
    )
    return Layer(ffns=(copy,), ln2=selector)


def lookup(query: Sequence[str], key: Sequence[str], values: Mapping[str, str], name: str = "lookup-hash") -> Head:
    """score(i, j) = phi(t(i)) . phi(k(j)) (labels from two ``hash_layer``s), maximal exactly
    where k(j) = t(i); copies values (output label -> input label) from there."""
    if len(query) != 4 or len(key) != 4:
        raise ExactLensError(f"a hash lookup matches 4 query with 4 key labels, got {list(query)}, {list(key)}")
    return attention.match(query, key, values, name=name)


def lookup_scale(max_target: int, max_keys: int, tolerance: float = 0.25) -> float:
    """§5.7 factor tau for softmax: with gap(t) decreasing in t the smallest gap up to
    max_target is gap(max_target), so tau = ln((N - 1) / tol) / gap(max_target) keeps the
    soft output of values in [0, 1] within tol of the hard one for N <= max_keys keys."""
    if not (isinstance(max_target, int) and max_target >= 0):
        raise ExactLensError(f"max_target must be an integer >= 0, got {max_target!r}")
    return attention.softmax_scale_for_hard(float(gap(max_target)), max_keys, tolerance)


# ----------------------------------------------------------------------------- worked example


def predecessor_program(
    symbols: Sequence[str], weighting: str = "average_hard", scale: float = 1.0, bos: str = "[CLS]"
) -> Program:
    """No positional encoding, only a BOS token at position 0. Layer 0: causal uniform
    attention gives inv = 1/(i+1). Layer 1: key hash phi(1, inv) = phi(i + 1). Layer 2:
    query hash phi(1 - inv, inv) = phi(i). Layer 3 (LN-free, causal): lookup; position
    i >= 1 attends to j = i - 1 (phi(j + 1) = phi(i)) and copies its symbol one-hot into
    prev_s (read per position); position 0 sees only itself (no symbol: all 0)."""
    symbols = tuple(symbols)
    if not symbols or bos in symbols:
        raise ExactLensError(f"give >= 1 symbols other than the BOS token {bos!r}, got {list(symbols)}")
    embedding = {bos: {"bos": 1.0, "one": 1.0}}
    embedding.update({s: {"one": 1.0, f"sym_{s}": 1.0} for s in symbols})
    key, query = hash_labels("phi(j+1)"), hash_labels("phi(i)")
    head = lookup(query, key, {f"prev_{s}": f"sym_{s}" for s in symbols}, name="predecessor-hash")
    layers = (
        Layer(
            heads=(attention.uniform_average({"inv": "bos"}, name="count"),), mask="causal", weighting="average_hard"
        ),
        hash_layer({"one": 1.0}, {"inv": 1.0}, key, name="hash-key"),
        hash_layer({"one": 1.0, "inv": -1.0}, {"inv": 1.0}, query, name="hash-query"),
        Layer(heads=(head.scaled(scale),), mask="causal", weighting=weighting),
    )
    return Program(
        vocab=(*symbols, bos),
        embedding=embedding,
        layers=layers,
        readout=Readout({s: {f"prev_{s}": 1.0} for s in symbols}, kind="per_position"),
        name="predecessor-hash",
    )

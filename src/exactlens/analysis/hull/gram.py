"""Every key along its own centred direction: the first screen of the fast unselectable-keys check.

Key i is selectable with the query q = y_i (its centred, rescaled vector) when
``y_i.y_i - max_{j != i} y_i.y_j > tol * ||y_i||_1``. For keys on a sphere about their centroid
this holds for every key, and for standard-normal keys in d = 64 for nearly every key, so one pass
over the Gram matrix Y Y^T decides most of a large key set. That pass is the whole cost of such
sets (n^2 d / 2 multiply-adds: n = 10^5, d = 64 is 3.2e11), so it is done at float32 speed with a
rigorous error bound, and only the decisive score of each key is recomputed in float64:

* float32 products (Higham, *Accuracy and Stability of Numerical Algorithms*, 2nd ed., §3.1,
  eq. 3.4 and Lemma 3.1): with u = 2^-24 and yh = fl32(y), |yh - y| <= u |y| componentwise, and
  any float32 evaluation of the d-term dot product (any order, with or without FMA) is within
  gamma_d |yh_i|.|yh_j| of yh_i.yh_j, gamma_d = d u / (1 - d u). Altogether
  |S32_ij - y_i.y_j| <= ((1 + u)^2 gamma_d + 2u + u^2) ||y_i|| ||y_j||, plus d 2^-124 for
  underflow (entries of Y are at most 1). :func:`error_bound` doubles this for safety.
* per key, the tiles keep the largest float32 score over each block of TILE other keys, and of
  those block maxima the largest (b1, from block B*) and the second largest (b2). If
  ``b1 - b2 > 2 E_i`` (E_i the bound with ||y_j|| <= the largest norm), every key outside B* has
  a lower exact score than the best key of B*, so ``max_{j != i} y_i.y_j`` is the maximum over
  B* alone, which is recomputed in float64: the lead ``y_i.y_i - max_{j in B*} y_i.y_j`` is the
  float64 lead over all keys, as a full float64 row would give it. Keys without such a gap (near
  ties across blocks) get their whole row recomputed in float64.

Y Y^T is symmetric, so only its upper triangle is computed, in cache-sized tiles: a tile's rows
update its row keys and its columns its column keys.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from exactlens.analysis.hull.products import product_t
from exactlens.progress import bar

TILE = 512  # side of one tile of the Gram matrix (1 MiB of float32: stays in cache)
UNIT_ROUNDOFF = 2.0**-24  # float32
SAFETY = 2.0  # the bound of the module docstring, doubled


def error_bound(d: int) -> float:
    """c with |fl32(yh_i . yh_j) - y_i . y_j| <= c ||y_i|| ||y_j|| (+ d 2^-124), safety factor included."""
    u = UNIT_ROUNDOFF
    gamma = d * u / (1.0 - d * u)
    return SAFETY * ((1.0 + u) ** 2 * gamma + 2.0 * u + u * u)


def _tiles(n: int) -> Iterator[tuple[slice, slice]]:
    """Tiles (rows, cols) of the upper triangle of an n x n matrix, diagonal tiles included."""
    for a in range(0, n, TILE):
        for b in range(a, n, TILE):
            yield slice(a, min(a + TILE, n)), slice(b, min(b + TILE, n))


def _merge(top1: np.ndarray, block1: np.ndarray, top2: np.ndarray, keys: slice, maxima: np.ndarray,
           block: int) -> None:
    """Fold one tile's maxima of ``keys`` (over the keys of ``block``) into their two best block maxima."""
    old1 = top1[keys]
    top2[keys] = np.maximum(np.minimum(old1, maxima), top2[keys])
    block1[keys] = np.where(maxima > old1, block, block1[keys])
    top1[keys] = np.maximum(old1, maxima)


def top_two_blocks(Y: np.ndarray, show: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For each key i: the largest float32 score y_i.y_j (j != i), the block of TILE keys holding it, and
    the largest score over all other blocks."""
    n = Y.shape[0]
    y32 = Y.astype(np.float32)
    top1 = np.full(n, -np.inf, dtype=np.float32)
    top2 = np.full(n, -np.inf, dtype=np.float32)
    block1 = np.full(n, -1, dtype=np.int64)
    with bar(total=n * (n + 1) // 2, desc="hull: scores of key pairs", unit="pair", unit_scale=True,
             min_items=1 if show else n * n + 1) as progress:
        for rows, cols in _tiles(n):
            scores = product_t(y32[rows], y32[cols])
            if rows == cols:
                np.fill_diagonal(scores, -np.inf)
            _merge(top1, block1, top2, rows, scores.max(axis=1), cols.start // TILE)
            if rows != cols:
                _merge(top1, block1, top2, cols, scores.max(axis=0), rows.start // TILE)
            side = scores.shape[0]
            progress.update(scores.size if rows != cols else side * (side + 1) // 2)
    return top1, block1, top2


def own_direction_leads(Y: np.ndarray, show: bool) -> np.ndarray:
    """lead_i = y_i.y_i - max_{j != i} y_i.y_j in float64 for every key (NaN where not settled).

    NaN marks near ties across blocks, whose row the caller recomputes in float64 (see the module
    docstring).
    """
    n, d = Y.shape
    lead = np.full(n, np.nan)
    if d * UNIT_ROUNDOFF > 1e-3:  # float32 too coarse for the bound to settle anything
        return lead
    top1, block1, top2 = top_two_blocks(Y, show)
    norms = np.linalg.norm(Y, axis=1)
    bound = error_bound(d) * norms * norms.max() + d * 2.0**-124
    settled = (top1.astype(np.float64) - top2.astype(np.float64) > 2.0 * bound) & (block1 >= 0)
    own = np.einsum("ij,ij->i", Y, Y)
    for block in np.unique(block1[settled]).tolist():
        keys = np.flatnonzero(settled & (block1 == block))
        start = block * TILE
        scores = product_t(Y[keys], Y[start : start + TILE])  # float64
        inside = (keys >= start) & (keys < start + TILE)
        scores[np.flatnonzero(inside), keys[inside] - start] = -np.inf
        lead[keys] = own[keys] - scores.max(axis=1)
    return lead

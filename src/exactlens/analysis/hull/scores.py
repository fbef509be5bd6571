"""Scoring candidate queries against all keys, in float64: the certificates of the fast hull check.

A direction q certifies key i as selectable when ``q.y_i - max_{j != i} q.y_j > tol * ||q||_1``
with the maximum over *every* other key; these helpers compute that lead for many (key, query)
pairs at once, in blocks of one matrix product each, and record the keys it certifies. They work
on a :class:`~exactlens.analysis.hull.solver.HullSolver` ``s`` (internal keys ``s.Y``, centred and
rescaled; tolerance ``s.tol``).
"""

from __future__ import annotations

import numpy as np
import scipy.spatial

from exactlens.analysis.hull.products import product_t
from exactlens.analysis.hull.solver import UNDECIDED, UNSELECTABLE, HullSolver

BLOCK_ENTRIES = 1 << 18  # entries of one block of scores (2 MiB of float64: stays in cache)
KDTREE_MAX_DIM = 16  # nearest neighbours by a k-d tree up to this dimension, by all-pairs distances above


def block_rows(n: int) -> int:
    """Rows of one block of scores against n keys."""
    return max(1, BLOCK_ENTRIES // n)


def project(s: HullSolver, q: np.ndarray) -> np.ndarray:
    """Directions (rows) projected on the span of the centred keys (a no-op for full-rank keys).

    Score differences q.(y_i - y_j) do not change, and queries stay in the keys' span (e.g.
    orthogonal to 1 for keys after layer norm).
    """
    if s.basis.shape[0] == s.d:
        return q
    return (q @ s.basis.T) @ s.basis


def leads(s: HullSolver, rows: np.ndarray, queries: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For key rows[k] and query queries[k]: q.y_i - max_{j != i} q.y_j, and that argmax j."""
    lead = np.empty(rows.size)
    winner = np.empty(rows.size, dtype=np.int64)
    step = block_rows(s.n)
    for a in range(0, rows.size, step):
        r = rows[a : a + step]
        scores = product_t(queries[a : a + step], s.Y)
        at = np.arange(r.size)
        own = scores[at, r]
        scores[at, r] = -np.inf
        top = scores.argmax(axis=1)
        winner[a : a + step] = top
        lead[a : a + step] = own - scores[at, top]
    return lead, winner


def certify_by_leads(s: HullSolver, rows: np.ndarray, queries: np.ndarray, lead: np.ndarray, stage: str) -> np.ndarray:
    """Record the undecided rows whose lead beats tol * ||q||_1; return the mask of those certified."""
    l1 = np.abs(queries).sum(axis=1)
    ok = (l1 > 0) & np.isfinite(lead) & (lead > s.tol * l1) & (s.state[rows] == UNDECIDED)
    if np.any(ok):
        s.set_selectable_many(rows[ok], queries[ok], lead[ok], stage)
    return ok


def nearest(s: HullSolver, rows: np.ndarray, k: int) -> np.ndarray:
    """The k nearest other keys of each key in rows (Euclidean; k <= n - 1), the nearest one first."""
    Y = s.Y
    if s.d <= KDTREE_MAX_DIM:  # a k-d tree beats the all-pairs distances in low dimension
        _, idx = scipy.spatial.cKDTree(Y).query(Y[rows], k=k + 1)
        idx = idx.reshape(rows.size, k + 1)
        self_hit = idx == rows[:, None]
        self_hit[~self_hit.any(axis=1), -1] = True  # twins at distance 0 may push a key out of its own list
        return idx[~self_hit].reshape(rows.size, k)
    sq = np.einsum("ij,ij->i", Y, Y)
    out = np.empty((rows.size, k), dtype=np.int64)
    step = block_rows(s.n)
    for a in range(0, rows.size, step):
        r = rows[a : a + step]
        dist = sq[None, :] - 2.0 * product_t(Y[r], Y)
        dist[np.arange(r.size), r] = np.inf
        part = np.argpartition(dist, k - 1, axis=1)[:, :k]
        order = np.argsort(np.take_along_axis(dist, part, axis=1), axis=1)
        out[a : a + r.size] = np.take_along_axis(part, order, axis=1)
    return out


def score_directions(s: HullSolver, rows: np.ndarray, q: np.ndarray, stage: str,
                     grow: tuple[np.ndarray, dict[int, np.ndarray], int] | None = None) -> np.ndarray:
    """Score direction q[k] of key rows[k] (undecided keys); certify the keys that win by more than tol.

    The search runs over the candidate keys only, those not certified unselectable and the
    duplicates: a linear function is largest at a vertex of the hull, and a vertex is certified
    unselectable only when it has a twin (or lies within tol of the others' hull, where the
    fallbacks, which search all keys, take over), so the winner along q among the candidates is
    a winner among all keys. Certificates are not searched but checked, against every key
    (:func:`leads`). Key rows[k] is certified if it wins along q[k]; otherwise the key that wins
    along q[k] is certified if it beats every other key (rows[k] included) by more than tol (it
    is a hull vertex too). Returns, per row, the winner among the other candidates (-1 if there
    is none). With ``grow = (r_w, work, n_new)`` (column generation, q = the NNLS residual r_y):
    the up to n_new candidates outside work[i] with the largest positive NNLS gradient
    r_y.y_j + r_w join work[i]; the winner of a key with none is returned as -1 (its working set
    cannot grow).
    """
    cols = np.flatnonzero((s.state != UNSELECTABLE) | s.duplicate)
    every = cols.size == s.n  # then the scores below are already the check against all keys
    pos = np.full(s.n, -1, dtype=np.int64)
    pos[cols] = np.arange(cols.size)
    y_cols = s.Y[cols]
    winner = np.empty(rows.size, dtype=np.int64)
    step = block_rows(cols.size)
    for a in range(0, rows.size, step):
        r, qb = rows[a : a + step], q[a : a + step]
        at = np.arange(r.size)
        scores = product_t(qb, y_cols)
        own = np.einsum("ij,ij->i", qb, s.Y[r])
        scores[at, pos[r]] = -np.inf  # rows are undecided keys, hence candidates
        top = scores.argmax(axis=1)
        best = scores[at, top].copy()
        winner[a : a + step] = np.where(np.isfinite(best), cols[top], -1)  # -1: no other candidate
        l1 = np.abs(qb).sum(axis=1)
        won = (own - best > s.tol * l1) & np.isfinite(best)
        _certify_checked(s, r[won], qb[won], own[won] - best[won], every, stage)
        scores[at, top] = -np.inf
        second = np.maximum(own, scores.max(axis=1))
        scores[at, top] = best
        clear = np.flatnonzero(~won & (best - second > s.tol * l1) & (s.state[cols[top]] == UNDECIDED))
        if clear.size:
            _, first = np.unique(top[clear], return_index=True)  # one direction per winning key
            pick = clear[first]
            _certify_checked(s, cols[top[pick]], qb[pick], best[pick] - second[pick], every, stage)
        if grow is not None:
            _grow(s, r, scores, grow[0][a : a + step], grow[1], grow[2], winner[a : a + step], cols, pos)
    return winner


def _certify_checked(s: HullSolver, rows: np.ndarray, queries: np.ndarray, lead: np.ndarray, every: bool,
                     stage: str) -> None:
    """Certify rows with their lead over the candidates, recomputed over all keys unless those were all."""
    if rows.size:
        certify_by_leads(s, rows, queries, lead if every else leads(s, rows, queries)[0], stage)


def _grow(s: HullSolver, rows: np.ndarray, scores: np.ndarray, r_w: np.ndarray, work: dict[int, np.ndarray],
          n_new: int, winner: np.ndarray, cols: np.ndarray, pos: np.ndarray) -> None:
    """Add to work[i] the n_new candidates with the largest positive NNLS gradient (scores: r_y.y_j over cols)."""
    k = np.flatnonzero(s.state[rows] == UNDECIDED)
    if k.size == 0:
        return
    grad = scores[k] + r_w[k, None]
    sizes = [work[int(i)].size for i in rows[k]]
    members = pos[np.concatenate([work[int(i)] for i in rows[k]])]
    in_work = members >= 0  # working-set keys certified unselectable since are no candidates any more
    grad[np.repeat(np.arange(k.size), sizes)[in_work], members[in_work]] = -np.inf
    n_top = min(n_new, grad.shape[1])
    top = np.empty((k.size, n_top), dtype=np.int64)
    positive = np.empty((k.size, n_top), dtype=bool)
    at = np.arange(k.size)
    for t in range(n_top):  # n_new passes of argmax beat one argpartition per row
        top[:, t] = grad.argmax(axis=1)
        positive[:, t] = grad[at, top[:, t]] > 0
        grad[at, top[:, t]] = -np.inf
    for row, (kk, i) in enumerate(zip(k.tolist(), rows[k].tolist(), strict=True)):
        cand = cols[top[row][positive[row]]]
        if cand.size == 0:
            winner[kk] = -1
        else:
            work[i] = np.concatenate([work[i], cand])

"""The keys the screens of the fast hull check leave: Gilbert rounds, NNLS column generation, small LPs.

All keys left are worked on in lock-step, so each round scores every candidate query against all
keys in one matrix product (``scores.score_directions``) instead of one product per key.
Functions take a :class:`~exactlens.analysis.hull.solver.HullSolver` ``s`` (internal keys ``s.Y``,
tolerance ``s.tol``).

1. Gilbert's algorithm (Frank-Wolfe for the point p_i of conv(others) nearest y_i; Gilbert 1966,
   "An iterative procedure for computing the minimum of a quadratic form on a convex set"): p_i
   starts at the nearest neighbour; each round the key w that wins along q = y_i - p_i (the
   support point of conv(others) in direction q) is found, key i is certified if it beats w, and
   p_i moves to the point of segment [p_i, w] nearest y_i. A vertex with a clear margin is
   certified within a few rounds. Interior keys get no certificate here, but the winners surround
   them and seed their working sets.
2. Column generation with non-negative least squares (Lawson-Hanson, ``HullSolver.affine_nnls``):
   per key, [y_i; 1] by the columns [y_j; 1] over a small working set W_i. A zero residual means
   y_i in conv(W_i): the weights certify it unselectable. Otherwise the residual r = (r_y, r_w)
   separates y_i from conv(W_i) (KKT: r_y.y_j + r_w <= 0 on W_i and r_y.y_i + r_w = ||r||^2), so
   r_y is a candidate query; the keys with positive gradient r_y.y_j + r_w (those that beat y_i
   along r_y) join W_i for the next round. Finitely many rounds reach the exact answer; rounds are
   capped, and what is left goes on.
3. One LP per key over its working set (HiGHS, as the naive method, on ~3d columns instead of n);
   weights over a subset are a certificate for the whole set, the dual query is checked against
   all keys, and the keys violating it join the set (cutting planes). Last, the naive full LP.
"""

from __future__ import annotations

import math

import numpy as np

from exactlens.analysis.hull.products import scores_along
from exactlens.analysis.hull.scores import score_directions
from exactlens.analysis.hull.solver import UNDECIDED, HullSolver
from exactlens.progress import bar

GILBERT_ROUNDS = 40  # at most; 3 (d + 1) in low dimension
STALE_ROUNDS = 2  # a key leaves the Gilbert rounds after this many rounds without a new winner
PRUNE_ABOVE = 2  # working sets above this many times d + 1 keys keep only the NNLS support
NEW_COLUMNS = 0.5  # keys joining a working set per round, times d + 1
LP_ROUNDS = 8  # cutting-plane rounds of the working-set LP before the full LP


def gilbert(s: HullSolver, rows: np.ndarray, nb: np.ndarray, rounds: int) -> np.ndarray:
    """Gilbert rounds for all rows at once; returns the winners met (rows x rounds, -1 = none)."""
    Y = s.Y
    p = Y[nb[:, 0]].copy()
    support = np.full((rows.size, rounds), -1, dtype=np.int64)
    live = np.arange(rows.size)
    stale = np.zeros(rows.size, dtype=np.int64)  # rounds in a row whose winner was met before
    for t in range(rounds):
        live = live[(s.state[rows[live]] == UNDECIDED) & (stale[live] < STALE_ROUNDS)]
        if live.size == 0:
            break
        q = Y[rows[live]] - p[live]
        top = score_directions(s, rows[live], q, "working_set")
        seen = (support[live, :t] == top[:, None]).any(axis=1)
        stale[live] = np.where(seen, stale[live] + 1, 0)
        stale[live[top < 0]] = STALE_ROUNDS  # no other candidate key: nothing to move towards
        live, q, top = live[top >= 0], q[top >= 0], top[top >= 0]
        support[live, t] = top
        step = Y[top] - p[live]
        sq = np.einsum("ij,ij->i", step, step)
        gamma = np.clip(np.einsum("ij,ij->i", q, step) / np.where(sq > 0, sq, 1.0), 0.0, 1.0)
        p[live] += gamma[:, None] * step
    return support


def _nnls_round(s: HullSolver, rows: list[int],
                work: dict[int, np.ndarray]) -> tuple[list[int], np.ndarray, np.ndarray]:
    """One NNLS per key; certify the keys their working set rebuilds, return the others' residuals."""
    Y, d = s.Y, s.d
    keep, resid, r_w = [], [], []
    accept = 2.0 * math.sqrt(d + 1) * s.tol + 1e-13  # weights within tol (l-inf) give a residual below this
    for i in rows:
        w = work[i]
        try:
            lam, rnorm = s.affine_nnls(i, w, maxiter=50 * (w.size + d + 1))
        except RuntimeError:
            continue  # left to the LP
        total = float(lam.sum())
        if total > 0 and rnorm <= accept:
            idx, lw, res = s.convex_weights(i, w, lam)
            if res <= s.tol:
                s.set_unselectable(i, idx, lw, res, "working_set")
                continue
        r_y = Y[i] - lam @ Y[w]
        if np.any(r_y):
            if w.size > PRUNE_ABOVE * (d + 1):
                work[i] = w[lam > 0]  # columns off the support do not change the optimum; new ones join below
            keep.append(i)
            resid.append(r_y)
            r_w.append(1.0 - total)
    return keep, np.asarray(resid).reshape(len(keep), d), np.asarray(r_w)


def working_sets(s: HullSolver, rows: np.ndarray, nb: np.ndarray, show: bool) -> dict[int, np.ndarray]:
    """Gilbert rounds, then NNLS column generation, all keys in lock-step; returns the working sets."""
    d = s.d
    support = gilbert(s, rows, nb, min(GILBERT_ROUNDS, 3 * (d + 1)))
    work = {}
    for a, i in enumerate(rows.tolist()):
        if s.state[i] == UNDECIDED:
            work[i] = np.unique(np.concatenate([nb[a], support[a][support[a] >= 0]]))
    n_new = max(2, int(NEW_COLUMNS * (d + 1)))
    active = list(work)
    with bar(total=len(active), desc="hull: keys left after screening", unit="key",
             min_items=1 if show else len(active) + 1) as progress:
        for _ in range(3 * (d + 1) + 10):
            keep, resid, r_w = _nnls_round(s, active, work)
            if keep:
                rows_k = np.asarray(keep)
                winner = score_directions(s, rows_k, resid, "working_set", (r_w, work, n_new))
                keep = rows_k[(winner >= 0) & (s.state[rows_k] == UNDECIDED)].tolist()
            progress.update(len(active) - len(keep))  # decided, or left to the LP
            active = keep
            if not active:
                break
    return work


def decide_by_small_lps(s: HullSolver, i: int, work: np.ndarray) -> None:
    """The LP over a working set, grown by the keys that violate its dual query; the full LP last."""
    Y = s.Y
    for _ in range(LP_ROUNDS):
        q = s.decide_on_subset(i, work)
        if q is None:
            return
        if not np.any(q):
            break
        scores = scores_along(Y, q)
        level = scores[i] - s.tol * float(np.abs(q).sum())
        scores[work] = -np.inf
        scores[i] = -np.inf
        cand = np.flatnonzero(scores >= level)
        if cand.size == 0:
            break
        if cand.size > 2 * (s.d + 1):
            cand = cand[np.argpartition(scores[cand], -2 * (s.d + 1))[-2 * (s.d + 1) :]]
        work = np.concatenate([work, cand])
    s.decide_by_lp(i)

"""The state of one unselectable-keys check and the operations every method shares (``hull``).

:class:`HullSolver` holds the keys in the solver's internal units and, per key, its decision and
certificate. The fast method's stages (``fast``, ``scores``, ``columns``) read its
public attributes and record decisions only through its ``set_*`` methods; the naive method is
:meth:`HullSolver.decide_by_lp` for every key.
"""

from __future__ import annotations

import math

import numpy as np
import scipy.optimize
import torch

from exactlens.analysis.hull.products import scores_along

__all__ = ["SELECTABLE", "UNDECIDED", "UNSELECTABLE", "HullSolver"]

UNSELECTABLE, SELECTABLE, UNDECIDED = 0, 1, -1  # values of HullSolver.state

_HIGHS_OPTIONS = {"primal_feasibility_tolerance": 1e-10, "dual_feasibility_tolerance": 1e-10}
_RANK_RTOL = 1e-10  # singular values below this fraction of the largest span no key difference


class HullSolver:
    """Keys in internal units and the decision and certificate of each (the state of one check).

    Internally the keys are centred and divided by their spread u (max abs entry after centring),
    so every LP and NNLS sees entries in [-1, 1]; the user's tolerance tol * s (s = max |k_ij|)
    becomes ``tol = rel_tol * scale / unit`` in these units. Margins and residuals are recorded in
    the keys' own units (times u).

    Keys (set once): ``n``, ``d``; ``Y`` (n, d) the internal keys; ``raw`` the keys as given;
    ``center`` their mean; ``unit`` = u; ``scale`` = s; ``rel_tol``; ``tol``; ``basis`` (r, d)
    orthonormal rows spanning the centred keys (r = d for full rank).

    Decisions (read freely, write only through the ``set_*`` methods): ``state`` (n,) int8, one
    of UNSELECTABLE, SELECTABLE, UNDECIDED; ``duplicate`` (n,) keys equal to another key;
    ``queries`` (n, d) unit queries and ``margins`` (n,) of selectable keys; ``support`` key ->
    (indices, convex weights) and ``residuals`` (n,) of unselectable keys; ``stats`` keys decided
    per stage (duplicates, directions, working_set, lp; boundary: lp decisions by the optimum alone).
    """

    n: int
    d: int
    Y: np.ndarray
    raw: np.ndarray
    center: np.ndarray
    unit: float
    scale: float
    rel_tol: float
    tol: float
    basis: np.ndarray
    state: np.ndarray
    duplicate: np.ndarray
    queries: np.ndarray
    margins: np.ndarray
    residuals: np.ndarray
    support: dict[int, tuple[np.ndarray, np.ndarray]]
    stats: dict[str, int]

    def __init__(self, keys: np.ndarray, tol: float):
        self.n, self.d = keys.shape
        self.rel_tol = tol
        self.scale = float(np.abs(keys).max())
        self.center = keys.mean(axis=0)
        centred = keys - self.center
        self.unit = float(np.abs(centred).max())
        if self.unit > 0:
            self.tol = tol * self.scale / self.unit
            self.Y = centred / self.unit
            # The singular values and right singular vectors of Y are those of R in Y = QR (d x d at most).
            r = torch.linalg.qr(torch.from_numpy(self.Y), mode="r").R.numpy()  # torch: its threads can be set
            _, sv, vt = np.linalg.svd(r, full_matrices=False)
            self.basis = vt[: int(np.count_nonzero(sv > sv[0] * _RANK_RTOL))]
        else:  # all keys equal
            self.tol = math.inf
            self.Y = centred
            self.basis = np.zeros((0, self.d))
        self.raw = keys  # directions from the origin (only their direction matters)
        self.state = np.full(self.n, UNDECIDED, dtype=np.int8)
        self.duplicate = np.zeros(self.n, dtype=bool)
        self.queries = np.zeros((self.n, self.d))
        self.margins = np.full(self.n, np.nan)
        self.residuals = np.full(self.n, np.nan)
        self.support = {}
        self.stats = {"duplicates": 0, "directions": 0, "working_set": 0, "lp": 0, "boundary": 0}

    # --------------------------------------------------------------- recording

    def set_selectable(self, i: int, q: np.ndarray, stage: str) -> None:
        """Record q (any norm) as key i's query; margin in the keys' units for the unit query."""
        norm = float(np.linalg.norm(q))
        self.state[i] = SELECTABLE
        self.queries[i] = q / norm
        self.margins[i] = self._lead(i, q) / norm * self.unit
        self.stats[stage] += 1

    def set_selectable_many(self, rows: np.ndarray, queries: np.ndarray, leads: np.ndarray, stage: str) -> None:
        """Record queries[k] (any norm) for key rows[k] with its lead q.y_i - max_{j != i} q.y_j (internal units)."""
        norms = np.linalg.norm(queries, axis=1)
        self.state[rows] = SELECTABLE
        self.queries[rows] = queries / norms[:, None]
        self.margins[rows] = leads / norms * self.unit
        self.stats[stage] += int(rows.size)

    def set_unselectable(self, i: int, idx: np.ndarray, lam: np.ndarray, res: float, stage: str) -> None:
        """Record convex weights lam over keys idx rebuilding key i to within res (internal units)."""
        self.state[i] = UNSELECTABLE
        self.support[i] = (idx, lam)
        self.residuals[i] = res * self.unit
        self.stats[stage] += 1

    def set_duplicates(self, dup: np.ndarray, twins: np.ndarray) -> None:
        """Record keys dup[k] as exact duplicates of keys twins[k] (weight 1, residual 0)."""
        self.state[dup] = UNSELECTABLE
        self.duplicate[dup] = True
        self.residuals[dup] = 0.0
        for i, twin in zip(dup.tolist(), twins.tolist(), strict=True):
            self.support[i] = (np.array([twin]), np.ones(1))
        self.stats["duplicates"] += int(dup.size)

    # --------------------------------------------------------------- certificates

    def _lead(self, i: int, q: np.ndarray) -> float:
        """q.y_i - max_{j != i} q.y_j in internal units."""
        scores = scores_along(self.Y, q)
        own = scores[i]
        scores[i] = -np.inf
        return float(own - scores.max())

    def _try_direction(self, i: int, q: np.ndarray) -> bool:
        """Certify key i with q or its projection on the keys' span, if the l1-normalised lead > tol."""
        candidates = [self.basis.T @ (self.basis @ q), q] if self.basis.shape[0] < self.d else [q]
        for cand in candidates:
            l1 = float(np.abs(cand).sum())
            if l1 > 0 and np.isfinite(l1) and self._lead(i, cand) > self.tol * l1:
                self.set_selectable(i, cand, "lp")
                return True
        return False

    def _try_weights(self, i: int, others: np.ndarray, lam: np.ndarray) -> tuple[np.ndarray, np.ndarray, float] | None:
        """Certify key i with LP or NNLS weights over ``others`` if they rebuild it to within tol.

        Returns None if certified, else the polished weights (support, weights, residual).
        """
        idx, lam, r = self.convex_weights(i, others, lam)
        if r <= self.tol:
            self.set_unselectable(i, idx, lam, r, "lp")
            return None
        return idx, lam, r

    def convex_weights(self, i: int, idx: np.ndarray, lam: np.ndarray) -> tuple[np.ndarray, np.ndarray, float]:
        """Clip, renormalise and (if needed) polish weights lam over keys idx for key i.

        Returns the support kept, its convex weights and their residual (max abs entry of
        sum_j lam_j y_j - y_i, internal units; inf if no weight is positive).
        """
        lam = np.clip(np.asarray(lam, dtype=np.float64), 0.0, None)
        total = lam.sum()
        if not total > 0:
            return idx[:0], lam[:0], math.inf
        keep = lam > 0
        idx, lam = idx[keep], lam[keep] / total
        res = float(np.abs(lam @ self.Y[idx] - self.Y[i]).max())
        if res > 1e-3 * self.tol and idx.size <= 4 * (self.d + 1):
            # Re-solve on the support: NNLS of [y_i; 1] by [y_j; 1] is exact to rounding there.
            try:
                mu, _ = self.affine_nnls(i, idx)
            except RuntimeError:
                mu = np.zeros(0)
            if mu.size and mu.sum() > 0:
                mu = mu / mu.sum()
                res2 = float(np.abs(mu @ self.Y[idx] - self.Y[i]).max())
                if res2 < res:
                    keep = mu > 0
                    idx, lam, res = idx[keep], mu[keep], res2
        return idx, lam, res

    def affine_nnls(self, i: int, cols: np.ndarray, maxiter: int | None = None) -> tuple[np.ndarray, float]:
        """Lawson-Hanson NNLS of [y_i; 1] by the columns [y_j; 1], j in ``cols``: weights >= 0, residual norm.

        A zero residual puts y_i in conv(cols) with these weights (they then sum to 1). Raises
        RuntimeError where NNLS does not converge within ``maxiter`` iterations (scipy's default: None).
        """
        a = np.empty((self.d + 1, cols.size))
        a[: self.d] = self.Y[cols].T
        a[self.d] = 1.0
        return scipy.optimize.nnls(a, np.append(self.Y[i], 1.0), maxiter=maxiter)

    # --------------------------------------------------------------- trivial cases

    def trivial(self) -> bool:
        """Decide n == 1 and all-equal keys; True if everything is decided."""
        if self.n == 1:
            self.state[0] = SELECTABLE
            self.queries[0, 0] = 1.0
            self.margins[0] = math.inf
            return True
        if self.unit == 0:  # every key equals every other key: all duplicates
            for i in range(self.n):
                self.set_unselectable(i, np.array([1 if i == 0 else 0]), np.ones(1), 0.0, "duplicates")
            return True
        return False

    # --------------------------------------------------------------- linear programs

    def membership_lp(self, i: int, others: np.ndarray) -> tuple[float, np.ndarray, np.ndarray]:
        """min t s.t. |sum_j lambda_j y_j - y_i| <= t per coordinate, lambda in the simplex over ``others``.

        Returns t* (the l-infinity distance from y_i to conv(others)), the weights and the dual query.
        """
        d, Y = self.d, self.Y
        m = others.size
        yo_t = Y[others].T
        cost = np.zeros(m + 1)
        cost[-1] = 1.0
        a_ub = np.block([[yo_t, -np.ones((d, 1))], [-yo_t, -np.ones((d, 1))]])
        b_ub = np.concatenate([Y[i], -Y[i]])
        a_eq = np.append(np.ones(m), 0.0)[None, :]
        res = _linprog(cost, a_ub, b_ub, a_eq, np.ones(1), (0, None))
        marg = np.asarray(res.ineqlin.marginals)
        return float(res.fun), res.x[:m], marg[:d] - marg[d:]

    def separation_lp(self, i: int, others: np.ndarray) -> np.ndarray | None:
        """max m s.t. q.(y_i - y_j) >= m for all j in ``others``, ||q||_1 <= 1 (q = q+ - q-); None if unsolved."""
        d = self.d
        diff = self.Y[others] - self.Y[i]
        m_rows = diff.shape[0]
        cost = np.zeros(2 * d + 1)
        cost[-1] = -1.0
        a_ub = np.vstack(
            [
                np.hstack([diff, -diff, np.ones((m_rows, 1))]),
                np.append(np.ones(2 * d), 0.0)[None, :],
            ]
        )
        b_ub = np.append(np.zeros(m_rows), 1.0)
        bounds = [(0, None)] * (2 * d) + [(None, None)]
        try:
            res = _linprog(cost, a_ub, b_ub, None, None, bounds)
        except RuntimeError:
            return None
        return res.x[:d] - res.x[d : 2 * d]

    def decide_on_subset(self, i: int, others: np.ndarray) -> np.ndarray | None:
        """The LP over some other keys only; certify key i if its answer holds for all keys.

        Weights over a subset are a certificate for the whole set; the dual query is checked against
        every key. Returns None if decided, else the dual query (oriented to favour key i over
        ``others``; all zeros if the LP failed), whose violators the caller adds to the subset.
        """
        try:
            _, lam, q = self.membership_lp(i, others)
        except RuntimeError:
            return np.zeros(self.d)
        if self._try_weights(i, others, lam) is None or self._try_direction(i, q) or self._try_direction(i, -q):
            return None
        scores = self.Y[others] @ q
        return q if q @ self.Y[i] - scores.max() >= -q @ self.Y[i] + scores.min() else -q

    def decide_by_lp(self, i: int) -> None:
        """Decide key i by the LP over all other keys (the naive method; the fast method's last resort)."""
        others = np.delete(np.arange(self.n), i)
        t_star, lam, q = self.membership_lp(i, others)
        weights = self._try_weights(i, others, lam)
        if weights is None or self._try_direction(i, q) or self._try_direction(i, -q):
            return
        # The dual query failed its check (and so did the weights): solve for the query directly. Also
        # when t* <= tol: HiGHS's t* is only as accurate as its tolerances, and a verified query wins.
        q2 = self.separation_lp(i, others)
        if q2 is not None and self._try_direction(i, q2):
            return
        # And the weights directly: Lawson-Hanson NNLS of [y_i; 1] by [y_j; 1] is exact on its support.
        try:
            mu, _ = self.affine_nnls(i, others, maxiter=50 * (others.size + self.d + 1))
        except RuntimeError:
            mu = np.zeros(others.size)
        if self._try_weights(i, others, mu) is None:
            return
        # Within solver precision of the tolerance boundary: decide by the LP optimum.
        self.stats["boundary"] += 1
        if t_star <= self.tol or not np.any(q):
            self.set_unselectable(i, *weights, "lp")
        else:
            if self._lead(i, -q) > self._lead(i, q):
                q = -q
            self.set_selectable(i, q, "lp")


_LP_ATTEMPTS = (  # tried in turn until one solves; every answer is verified afterwards anyway
    ("highs", _HIGHS_OPTIONS),
    ("highs", dict(_HIGHS_OPTIONS, presolve=False)),
    ("highs-ipm", _HIGHS_OPTIONS),  # the dual simplex can stall at these tolerances on near-duplicate keys
    ("highs", {}),
)


def _linprog(cost, a_ub, b_ub, a_eq, b_eq, bounds):
    for method, options in _LP_ATTEMPTS:
        res = scipy.optimize.linprog(
            cost, A_ub=a_ub, b_ub=b_ub, A_eq=a_eq, b_eq=b_eq, bounds=bounds, method=method, options=options
        )
        if res.status == 0:
            return res
    raise RuntimeError(f"HiGHS failed on a hull-membership LP: {res.message}")

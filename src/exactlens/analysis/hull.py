"""Unselectable keys: which keys can win the attention argmax (Brody, Alon & Yahav 2023, §3.2).

A key k_i in a set of keys K = {k_1, ..., k_n} (rows of an n x d array) is *selectable* if some
query q gives it a strictly higher score than every other key::

    q . k_i  >  max_{j != i} q . k_j .

By the separating-hyperplane theorem this holds exactly when k_i is *not* in the convex hull of
the other keys, i.e. when k_i is a strict vertex (extreme point) of conv(K) and has no twin.
Brody et al.'s Theorem 1 is the "only if" half: a key inside the hull of the others can never
get the top score. The converse is the separation theorem, so the check below is exact.

Degenerate inputs, all handled by the same definition:

* duplicates: a key equal to another key is in the hull of the others (weight 1 on its twin);
  it can only ever tie, so both copies are unselectable;
* rank-deficient sets (e.g. keys after layer norm, which all lie in the hyperplane orthogonal to
  the ones vector), collinear sets, a single repeated point: hull membership is still well
  defined; none of the linear programs below assumes full rank (they never invert anything),
  and query certificates are projected onto the span of the centred keys, where they do not
  waste norm on directions that every key shares;
* a single key is selectable (any query; there is no other key, the margin is +inf).

Tolerance semantics. Let ``s = max |k_ij|`` be the scale of the keys (their largest absolute
entry: the magnitude at which float rounding of the keys and of the scores q.k happens) and
``eps = tol * s``. The tolerance is thus relative: the answer is invariant under scaling the keys
(and under permuting them); a translation changes it only through s. With that:

* key i is *unselectable* iff some convex combination of the other keys reproduces it to within
  ``eps`` in every coordinate: lambda >= 0, sum lambda = 1, max_c |sum_j lambda_j k_j - k_i|_c <= eps
  (the l-infinity distance from k_i to conv(others) is at most eps);
* equivalently (LP duality: the l1 norm is the dual of the l-infinity norm), key i is
  *selectable* iff some query q gives it a lead ``q.k_i - max_{j!=i} q.k_j > eps * ||q||_1``.

So a key within eps of the hull of the others (e.g. a point 1e-12 outside a facet) counts as
unselectable, and a selectable key's lead must exceed the tolerance. Certificates are reported
with unit l2-norm queries; because ``||q||_1 >= ||q||_2`` the reported ``margin`` is at least the
l1-normalised lead, so every verified margin is > eps. Unselectable certificates are the convex
weights, with their reconstruction residual (max abs entry, original units) <= eps.
Every certificate is recomputed in float64 from the keys before it is accepted; LP answers are
not trusted on their own. Only keys within the LP solver's precision (about 1e-10 relative) of
the tolerance boundary can end without a verified certificate: they are then decided by the LP
optimum and counted in ``stats["boundary"]``.

Methods:

* ``"naive"``: for every key one LP over all the other keys (scipy ``linprog``, HiGHS): the
  hull-membership feasibility problem k_i = sum_j lambda_j k_j, lambda in the simplex, relaxed by
  a slack t in each coordinate, minimising t. The optimum t* is the l-infinity distance to the
  hull; the primal gives the weights, the dual (``res.ineqlin.marginals``) the query. It is the
  reference.
* ``"fast"`` (default): the same decisions with far fewer and far smaller solves.
  (1) Exact duplicates are unselectable with weight 1 on their twin.
  (2) Cheap certification of selectable keys: scores of all keys along many directions at once
  (every centred key, every raw key, random Gaussian directions) in blocked matrix products; a key
  that is the strict argmax along a direction with l1-normalised lead > eps is certified with
  that direction.
  (3) Each remaining key gets an output-sensitive working-set solve: non-negative least squares
  (Lawson-Hanson, ``scipy.optimize.nnls``) of [k_i; 1] by [k_j; 1] over a small working set W of
  other keys (first its nearest neighbours). A zero residual means k_i is in conv(W), hence
  unselectable, with the weights as certificate. Otherwise the residual r of the NNLS optimum
  separates k_i from conv(W) (KKT: r_k . (k_i - k_j) >= ||r||^2 for all j in W, where r_k is the
  key part of r; keys centred and divided by their spread, as all solves here see them), so it is a
  candidate query; it is checked against all keys: if k_i wins with lead > eps it is certified
  selectable, otherwise the keys that beat it along r (those with positive NNLS gradient) join W
  and the solve repeats (column generation, i.e. a Clarkson-style scheme where the points that
  win along a separating direction are the new hull points). Keys that win along such a
  direction with a clear lead are certified selectable on the way.
  (4) Anything still undecided falls back to the naive per-key LP.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import scipy.optimize
import scipy.sparse
import torch

from exactlens.errors import ExactLensError
from exactlens.progress import bar
from exactlens.resources import check_work

__all__ = [
    "METHODS",
    "KeyCertificate",
    "SelectabilityResult",
    "layer_norm_geometric",
    "layer_norm_projection",
    "selectable_keys",
]

METHODS = ("fast", "naive")

_HIGHS_OPTIONS = {"primal_feasibility_tolerance": 1e-10, "dual_feasibility_tolerance": 1e-10}
_RANK_RTOL = 1e-10  # singular values below this fraction of the largest span no key difference
_BLOCK_ENTRIES = 1 << 22  # entries of one block of scores (32 MiB of float64)
_UNSELECTABLE, _SELECTABLE, _UNDECIDED = 0, 1, -1


# ----------------------------------------------------------------------------- results


@dataclass(frozen=True, eq=False)
class KeyCertificate:
    """Why one key is (un)selectable.

    For a selectable key: ``query`` is a unit (l2) query and ``margin`` = q.k_i - max_{j!=i} q.k_j
    in the keys' units. For an unselectable key: ``support`` are indices of other keys and
    ``weights`` their convex weights (>= 0, sum 1), with ``residual`` = max abs entry of
    sum_j weights_j k_j - k_i in the keys' units.
    """

    index: int
    selectable: bool
    query: np.ndarray | None
    margin: float
    support: np.ndarray
    weights: np.ndarray
    residual: float


@dataclass(frozen=True, eq=False)
class SelectabilityResult:
    """Selectable mask of n keys with a certificate per key.

    ``queries`` (n, d): unit query of each selectable key (zero rows for unselectable keys).
    ``margins`` (n,): q.k_i - max_{j!=i} q.k_j for those queries, NaN for unselectable keys.
    ``weights`` (n, n) sparse: row i holds the convex weights over the other keys certifying that
    key i is unselectable (empty rows for selectable keys). ``residuals`` (n,): reconstruction
    error (max abs entry) of those weights, NaN for selectable keys. ``tolerance`` is the relative
    tolerance asked for, ``scale`` the keys' scale s, so the absolute tolerance is tolerance*scale.
    ``stats`` counts how many keys each stage decided.
    """

    selectable: np.ndarray
    queries: np.ndarray
    margins: np.ndarray
    weights: scipy.sparse.csr_array
    residuals: np.ndarray
    tolerance: float
    scale: float
    method: str
    stats: dict[str, int] = field(default_factory=dict)

    @property
    def n_keys(self) -> int:
        return int(self.selectable.shape[0])

    @property
    def dim(self) -> int:
        return int(self.queries.shape[1])

    @property
    def n_unselectable(self) -> int:
        return int(self.n_keys - np.count_nonzero(self.selectable))

    @property
    def fraction_unselectable(self) -> float:
        return self.n_unselectable / self.n_keys

    @property
    def abs_tolerance(self) -> float:
        return self.tolerance * self.scale

    @property
    def unselectable_indices(self) -> np.ndarray:
        return np.flatnonzero(~self.selectable)

    def certificate(self, i: int) -> KeyCertificate:
        """The certificate of key ``i``."""
        if not -self.n_keys <= i < self.n_keys:
            raise ExactLensError(f"key index {i} out of range: there are {self.n_keys} keys")
        i = int(i) % self.n_keys
        lo, hi = self.weights.indptr[i], self.weights.indptr[i + 1]
        return KeyCertificate(
            index=i,
            selectable=bool(self.selectable[i]),
            query=self.queries[i].copy() if self.selectable[i] else None,
            margin=float(self.margins[i]),
            support=self.weights.indices[lo:hi].astype(np.int64),
            weights=self.weights.data[lo:hi].astype(np.float64),
            residual=float(self.residuals[i]),
        )

    def to_json(self) -> dict[str, Any]:
        """Summary with stable field names (JSON-serialisable)."""
        return {
            "n_keys": self.n_keys,
            "dim": self.dim,
            "n_unselectable": self.n_unselectable,
            "fraction_unselectable": float(self.fraction_unselectable),
            "tolerance": float(self.tolerance),
            "method": self.method,
        }


# ----------------------------------------------------------------------------- input


def _as_float_array(x: Any, name: str, ndims: tuple[int, ...]) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        if x.is_complex():
            raise ExactLensError(f"{name} must be real, got a complex tensor of dtype {x.dtype}")
        x = x.detach().cpu().to(torch.float64).numpy()
    try:
        arr = np.asarray(x)
    except Exception as exc:  # ragged lists and the like
        raise ExactLensError(f"{name} must be a numeric array or torch tensor: {exc}") from exc
    if arr.dtype.kind not in "biuf":
        raise ExactLensError(f"{name} must be a real numeric array (bool, int or float), got dtype {arr.dtype}")
    if arr.ndim not in ndims:
        allowed = " or ".join(f"{k}-D" for k in ndims)
        raise ExactLensError(f"{name} must be {allowed}, got shape {arr.shape}")
    arr = arr.astype(np.float64)
    if arr.size == 0 or arr.shape[-1] == 0:
        raise ExactLensError(f"{name} is empty (shape {arr.shape}); at least one vector of dimension >= 1 is needed")
    if not np.all(np.isfinite(arr)):
        bad = np.argwhere(~np.isfinite(arr))[0]
        raise ExactLensError(f"{name} must be finite, found {arr[tuple(bad)]} at index {tuple(int(b) for b in bad)}")
    return arr


# ----------------------------------------------------------------------------- solver


class _Solver:
    """State shared by both methods.

    Internally the keys are centred and divided by their spread u (max abs entry after centring),
    so every LP and NNLS sees entries in [-1, 1]; the user's tolerance tol * s (s = max |k_ij|)
    becomes ``self.tol = tol * s / u`` in these units. Margins and residuals are reported in the
    keys' own units (times u).
    """

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
            _, sv, vt = np.linalg.svd(self.Y, full_matrices=False)
            self.basis = vt[: int(np.count_nonzero(sv > sv[0] * _RANK_RTOL))]
        else:  # all keys equal
            self.tol = math.inf
            self.Y = centred
            self.basis = np.zeros((0, self.d))
        self.raw = keys  # directions from the origin (only their direction matters)
        self.state = np.full(self.n, _UNDECIDED, dtype=np.int8)
        self.queries = np.zeros((self.n, self.d))
        self.margins = np.full(self.n, np.nan)
        self.residuals = np.full(self.n, np.nan)
        self.support: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self.stats = {"duplicates": 0, "directions": 0, "working_set": 0, "lp": 0, "boundary": 0}
        self._stage = "lp"

    # --------------------------------------------------------------- recording

    def _set_selectable(self, i: int, q: np.ndarray, stage: str) -> None:
        """Record q (any norm) as key i's query; margin in the keys' units for the unit query."""
        norm = float(np.linalg.norm(q))
        self.state[i] = _SELECTABLE
        self.queries[i] = q / norm
        self.margins[i] = self._lead(i, q) / norm * self.unit
        self.stats[stage] += 1

    def _set_unselectable(self, i: int, idx: np.ndarray, lam: np.ndarray, res: float, stage: str) -> None:
        self.state[i] = _UNSELECTABLE
        self.support[i] = (idx, lam)
        self.residuals[i] = res * self.unit
        self.stats[stage] += 1

    # --------------------------------------------------------------- certificates

    def _lead(self, i: int, q: np.ndarray) -> float:
        """q.y_i - max_{j != i} q.y_j in internal units."""
        scores = self.Y @ q
        own = scores[i]
        scores[i] = -np.inf
        return float(own - scores.max())

    def _try_direction(self, i: int, q: np.ndarray) -> bool:
        """Certify key i with q or its projection on the keys' span, if the l1-normalised lead > tol."""
        candidates = [self.basis.T @ (self.basis @ q), q] if self.basis.shape[0] < self.d else [q]
        for cand in candidates:
            l1 = float(np.abs(cand).sum())
            if l1 > 0 and np.isfinite(l1) and self._lead(i, cand) > self.tol * l1:
                self._set_selectable(i, cand, self._stage)
                return True
        return False

    def _weights(self, i: int, idx: np.ndarray, lam: np.ndarray) -> tuple[np.ndarray, np.ndarray, float]:
        """Clip, renormalise and (if needed) polish convex weights; return them with their residual."""
        lam = np.clip(np.asarray(lam, dtype=np.float64), 0.0, None)
        total = lam.sum()
        if not total > 0:
            return idx[:0], lam[:0], math.inf
        keep = lam > 0
        idx, lam = idx[keep], lam[keep] / total
        res = float(np.abs(lam @ self.Y[idx] - self.Y[i]).max())
        if res > 1e-3 * self.tol and idx.size <= 4 * (self.d + 1):
            # Re-solve on the support: NNLS of [y_i; 1] by [y_j; 1] is exact to rounding there.
            a = np.vstack([self.Y[idx].T, np.ones(idx.size)])
            try:
                mu, _ = scipy.optimize.nnls(a, np.append(self.Y[i], 1.0))
            except RuntimeError:
                mu = np.zeros(0)
            if mu.size and mu.sum() > 0:
                mu = mu / mu.sum()
                res2 = float(np.abs(mu @ self.Y[idx] - self.Y[i]).max())
                if res2 < res:
                    keep = mu > 0
                    idx, lam, res = idx[keep], mu[keep], res2
        return idx, lam, res

    # --------------------------------------------------------------- trivial cases

    def trivial(self) -> bool:
        """Handle n == 1 and all-equal keys; True if everything is decided."""
        if self.n == 1:
            self.state[0] = _SELECTABLE
            self.queries[0, 0] = 1.0
            self.margins[0] = math.inf
            return True
        if self.unit == 0:  # every key equals every other key: all duplicates
            for i in range(self.n):
                self._set_unselectable(i, np.array([1 if i == 0 else 0]), np.ones(1), 0.0, "duplicates")
            return True
        return False

    # --------------------------------------------------------------- naive: one LP per key

    def decide_by_lp(self, i: int) -> None:
        self._stage = "lp"
        n, d, Y = self.n, self.d, self.Y
        others = np.delete(np.arange(n), i)
        m = n - 1
        yo_t = Y[others].T
        cost = np.zeros(m + 1)
        cost[-1] = 1.0
        a_ub = np.block([[yo_t, -np.ones((d, 1))], [-yo_t, -np.ones((d, 1))]])
        b_ub = np.concatenate([Y[i], -Y[i]])
        a_eq = np.append(np.ones(m), 0.0)[None, :]
        res = _linprog(cost, a_ub, b_ub, a_eq, np.ones(1), (0, None))
        t_star = float(res.fun)
        idx, lam, r = self._weights(i, others, res.x[:m])
        if r <= self.tol:
            self._set_unselectable(i, idx, lam, r, "lp")
            return
        marg = np.asarray(res.ineqlin.marginals)
        q = marg[:d] - marg[d:]
        if self._try_direction(i, q) or self._try_direction(i, -q):
            return
        if t_star > self.tol:
            q2 = self._separation_lp(i, others)
            if q2 is not None and self._try_direction(i, q2):
                return
        # Within solver precision of the tolerance boundary: decide by the LP optimum.
        self.stats["boundary"] += 1
        if t_star <= self.tol or not np.any(q):
            self._set_unselectable(i, idx, lam, r, "lp")
        else:
            if self._lead(i, -q) > self._lead(i, q):
                q = -q
            self._set_selectable(i, q, "lp")

    def _separation_lp(self, i: int, others: np.ndarray) -> np.ndarray | None:
        """max m s.t. q.(y_i - y_j) >= m for all j != i, ||q||_1 <= 1 (q = q+ - q-)."""
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

    def run_naive(self) -> None:
        for i in range(self.n):
            self.decide_by_lp(i)

    # --------------------------------------------------------------- fast

    def run_fast(self) -> None:
        self._mark_duplicates()
        self._screen_directions()
        undecided = np.flatnonzero(self.state == _UNDECIDED)
        if undecided.size:
            k = min(self.n - 1, self.d + 2)
            neighbours = self._nearest(undecided, k)
            pairs = zip(undecided.tolist(), neighbours, strict=True)
            for i, nb in bar(pairs, total=undecided.size, desc="hull: keys left after screening", unit="key",
                             min_items=PROGRESS_FROM):
                if self.state[i] == _UNDECIDED and not self._working_set(i, nb):
                    self.decide_by_lp(i)

    def _mark_duplicates(self) -> None:
        """Exact duplicates: weight 1 on a twin (the group's first copy; the first copy gets the second)."""
        _, inverse, counts = np.unique(self.Y, axis=0, return_inverse=True, return_counts=True)
        inverse = inverse.reshape(-1)
        order = np.argsort(inverse, kind="stable")  # members of each group, in index order
        starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
        first, second = order[starts], order[np.minimum(starts + 1, self.n - 1)]
        for i in np.flatnonzero(counts[inverse] > 1).tolist():
            g = inverse[i]
            twin = first[g] if first[g] != i else second[g]
            self._set_unselectable(i, np.array([twin]), np.ones(1), 0.0, "duplicates")

    def _screen_directions(self) -> None:
        """Scores along many directions at once; certify every strict argmax with lead > tol."""
        self._stage = "directions"
        n, d, Y = self.n, self.d, self.Y
        rng = np.random.default_rng(0)
        n_random = int(min(max(2 * n, 64), 20000))
        dirs = np.vstack([Y, self.raw, rng.standard_normal((n_random, d))])
        l1 = np.abs(dirs).sum(axis=1)
        dirs, l1 = dirs[l1 > 0], l1[l1 > 0]
        best = np.full(n, -np.inf)
        best_dir = np.zeros((n, d))
        block = max(1, _BLOCK_ENTRIES // n)
        for start in range(0, dirs.shape[0], block):
            dblock = dirs[start : start + block]
            scores = dblock @ Y.T  # one row of scores per direction
            rows = np.arange(scores.shape[0])
            top = scores.argmax(axis=1)
            v1 = scores[rows, top]
            scores[rows, top] = -np.inf
            lead = (v1 - scores.max(axis=1)) / l1[start : start + block]
            ok = (lead > self.tol) & (self.state[top] == _UNDECIDED)
            for j in np.flatnonzero(ok).tolist():  # at most one entry per direction
                if lead[j] > best[top[j]]:
                    best[top[j]] = lead[j]
                    best_dir[top[j]] = dblock[j]
        for i in np.flatnonzero(np.isfinite(best)).tolist():
            # Re-verified one key at a time (and projected on the keys' span); a key whose lead is
            # within rounding of tol stays undecided and goes on to the working-set stage.
            self._try_direction(i, best_dir[i])

    def _nearest(self, rows: np.ndarray, k: int) -> np.ndarray:
        """Indices of the k nearest other keys of each key in rows (Euclidean)."""
        Y = self.Y
        sq = np.einsum("ij,ij->i", Y, Y)
        out = np.empty((rows.size, k), dtype=np.int64)
        block = max(1, _BLOCK_ENTRIES // self.n)
        for start in range(0, rows.size, block):
            r = rows[start : start + block]
            dist = sq[None, :] - 2.0 * (Y[r] @ Y.T)
            dist[np.arange(r.size), r] = np.inf
            out[start : start + r.size] = np.argpartition(dist, k - 1, axis=1)[:, :k]  # k <= n - 1
        return out

    def _working_set(self, i: int, initial: np.ndarray) -> bool:
        """Column generation with NNLS over a growing working set; False if undecided."""
        self._stage = "working_set"
        Y, d = self.Y, self.d
        work = [int(j) for j in initial if j != i]
        in_work = np.zeros(self.n, dtype=bool)
        in_work[work] = True
        target = np.append(Y[i], 1.0)
        n_new = max(2, (d + 1) // 2)
        for _ in range(3 * (d + 1) + 10):
            w_idx = np.asarray(work, dtype=np.int64)
            a = np.vstack([Y[w_idx].T, np.ones(w_idx.size)])
            try:
                lam, rnorm = scipy.optimize.nnls(a, target, maxiter=50 * (w_idx.size + d + 1))
            except RuntimeError:
                return False
            total = float(lam.sum())
            # Weights within tol of y_i (l-inf) would give an NNLS residual <= sqrt(d+1) * tol.
            if total > 0 and rnorm <= 2.0 * math.sqrt(d + 1) * self.tol + 1e-13:
                idx, lw, res = self._weights(i, w_idx, lam)
                if res <= self.tol:
                    self._set_unselectable(i, idx, lw, res, "working_set")
                    return True
            r_y = Y[i] - lam @ Y[w_idx]
            r_w = 1.0 - total
            if not np.any(r_y):
                return False
            scores = Y @ r_y
            own = scores[i]
            scores[i] = -np.inf
            first = int(scores.argmax())
            best = float(scores[first])
            l1 = float(np.abs(r_y).sum())
            if own - best > self.tol * l1:
                if self._try_direction(i, r_y):
                    return True
            elif self.state[first] == _UNDECIDED:
                # The key that wins along r: certify it too if it wins clearly (a new hull vertex).
                scores[first] = -np.inf
                second = max(own, float(scores.max()))
                scores[first] = best
                if best - second > self.tol * l1:
                    self._try_direction(first, r_y)
            grad = scores + r_w  # NNLS gradient of the columns [y_j; 1]: positive lowers the residual
            grad[in_work] = -np.inf
            cand = np.flatnonzero(grad > 0)
            if cand.size == 0:
                return False
            if cand.size > n_new:
                cand = cand[np.argpartition(grad[cand], -n_new)[-n_new:]]
            work.extend(cand.tolist())
            in_work[cand] = True
        return False

    # --------------------------------------------------------------- result

    def result(self, method: str) -> SelectabilityResult:
        assert np.all(self.state != _UNDECIDED)
        rows: list[np.ndarray] = []
        cols: list[np.ndarray] = []
        vals: list[np.ndarray] = []
        for i, (idx, lam) in self.support.items():
            rows.append(np.full(idx.size, i, dtype=np.int64))
            cols.append(idx.astype(np.int64))
            vals.append(lam)
        if rows:
            weights = scipy.sparse.csr_array(
                (np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))), shape=(self.n, self.n)
            )
            weights.sum_duplicates()  # canonical: sorted column indices per row
        else:
            weights = scipy.sparse.csr_array((self.n, self.n), dtype=np.float64)
        return SelectabilityResult(
            selectable=self.state == _SELECTABLE,
            queries=self.queries,
            margins=self.margins,
            weights=weights,
            residuals=self.residuals,
            tolerance=self.rel_tol,
            scale=self.scale,
            method=method,
            stats=dict(self.stats),
        )


def _linprog(cost, a_ub, b_ub, a_eq, b_eq, bounds):
    res = scipy.optimize.linprog(
        cost, A_ub=a_ub, b_ub=b_ub, A_eq=a_eq, b_eq=b_eq, bounds=bounds, method="highs", options=_HIGHS_OPTIONS
    )
    if res.status != 0:
        res = scipy.optimize.linprog(
            cost,
            A_ub=a_ub,
            b_ub=b_ub,
            A_eq=a_eq,
            b_eq=b_eq,
            bounds=bounds,
            method="highs",
            options=dict(_HIGHS_OPTIONS, presolve=False),
        )
    if res.status != 0:
        raise RuntimeError(f"HiGHS failed on a hull-membership LP: {res.message}")
    return res


# ----------------------------------------------------------------------------- public API


HULL_OPERATIONS_PER_PAIR = 10
"""Work estimate of the fast method: about this many operations per (key, key, dimension), LP overhead
included (measured: n = 10^4, d = 16 takes ~5 s); beyond the work limit a call is refused up front."""
PROGRESS_FROM = 500  # keys left for LPs from which a progress bar shows


def selectable_keys(keys: np.ndarray | torch.Tensor, *, tol: float = 1e-9, method: str = "fast") -> SelectabilityResult:
    """Which keys can get the strict top attention score q.k, with a certificate for each.

    ``keys`` is an n x d array or tensor (n >= 1, d >= 1, finite). ``tol`` is relative to the
    keys' scale s (their max abs entry): a key within tol*s (per coordinate) of the hull
    of the other keys is unselectable, and a selectable key's l1-normalised lead must exceed
    tol*s. ``method`` is "fast" (default) or "naive" (one LP per key); both give the same mask.
    See the module docstring for the algorithm and the exact semantics.
    """
    arr = _as_float_array(keys, "keys", (2,))
    n, d = arr.shape
    check_work(HULL_OPERATIONS_PER_PAIR * n * n * d, f"selectable_keys on {n} keys in {d} dimensions",
               "use fewer keys (a sample, or one layer at a time)")
    if isinstance(tol, bool) or not isinstance(tol, (int, float, np.floating, np.integer)):
        raise ExactLensError(f"tol must be a float in (0, 1), got {tol!r}")
    tol = float(tol)
    if not (0.0 < tol < 1.0):
        raise ExactLensError(f"tol must be a float in (0, 1) (relative to the keys' scale), got {tol!r}")
    if method not in METHODS:
        raise ExactLensError(f"method must be one of {METHODS}, got {method!r}")
    # Selectability does not change when every key is multiplied by the same positive number, so the
    # solver sees the keys times 2^-e (exact in binary floating point) with their largest entry in
    # [0.5, 1): keys near 1e308 cannot overflow and keys near 1e-320 cannot underflow inside it.
    # Margins and residuals come back in the keys' own units.
    top = float(np.abs(arr).max())
    exponent = int(np.frexp(top)[1]) if top > 0 else 0
    solver = _Solver(np.ldexp(arr, -exponent), tol)
    if not solver.trivial():
        if method == "naive":
            solver.run_naive()
        else:
            solver.run_fast()
    result = solver.result(method)
    return dataclasses.replace(result, margins=np.ldexp(result.margins, exponent),
                               residuals=np.ldexp(result.residuals, exponent), scale=top)


def layer_norm_projection(d: int) -> np.ndarray:
    """P = I - (1/d) 1 1^T, the projection of LayerNorm onto the hyperplane orthogonal to 1 (Brody App. C)."""
    if isinstance(d, bool) or not isinstance(d, (int, np.integer)) or d < 1:
        raise ExactLensError(f"d must be a positive integer, got {d!r}")
    d = int(d)
    return np.eye(d) - np.full((d, d), 1.0 / d)


def layer_norm_geometric(x: np.ndarray | torch.Tensor) -> np.ndarray:
    """LayerNorm without gain/bias as geometry: sqrt(d) P x / ||P x||, row-wise (Brody §2).

    Equal to (x - mean) / std with the population std. ``x`` is a d-vector or an n x d array;
    a constant row (P x = 0 up to rounding) raises, since LayerNorm is undefined there
    (Brody footnote 4).
    """
    arr = _as_float_array(x, "x", (1, 2))
    d = arr.shape[-1]
    px = arr @ layer_norm_projection(d)  # P is symmetric: rows of x P are (P x)^T
    norms = np.linalg.norm(px, axis=-1, keepdims=True)
    floor = 8 * d * np.finfo(np.float64).eps * np.linalg.norm(arr, axis=-1, keepdims=True)
    bad = norms <= floor
    if np.any(bad):
        row = int(np.argwhere(bad)[0][0]) if arr.ndim == 2 else 0
        raise ExactLensError(
            f"layer norm is undefined for a constant vector (P x = 0); row {row} of x is constant: "
            "every row must have two different entries"
        )
    return math.sqrt(d) * px / norms

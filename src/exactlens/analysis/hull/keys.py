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
Every certificate is recomputed in float64 from the keys before it is accepted (in the first
screen of the fast method, float32 scores with a rigorous rounding-error bound rule out all but one
block of competing keys, and that block is recomputed in float64; see ``gram``); LP answers
are not trusted on their own. Only keys near the tolerance boundary can end without a verified
certificate: they are then decided by the LP optimum and counted in ``stats["boundary"]``. In
practice these are near-duplicates a few eps apart, where HiGHS's answers (and NNLS's) are
accurate only to a few eps; elsewhere (lattices, normal keys, spheres) none was ever seen.

Methods:

* ``"naive"``: for every key one LP over all the other keys (scipy ``linprog``, HiGHS): the
  hull-membership feasibility problem k_i = sum_j lambda_j k_j, lambda in the simplex, relaxed by
  a slack t in each coordinate, minimising t. The optimum t* is the l-infinity distance to the
  hull; the primal gives the weights, the dual (``res.ineqlin.marginals``) the query. Where
  neither passes its check (keys within ~1e-9 of the tolerance, near-duplicates), a separation LP
  for the query and NNLS over all other keys for the weights are tried before the LP optimum
  decides; HiGHS's dual simplex, which can stall at these tolerances, is backed by its
  interior-point method. It is the reference (``solver.HullSolver.decide_by_lp``).
* ``"fast"`` (default): the same decisions with far fewer and far smaller solves, every key
  certified against all keys (module ``fast``, which lists the stages). In short: exact
  duplicates; every key along its own centred vector, in one symmetric Gram matrix computed in
  float32 tiles with a rigorous rounding-error bound and the decisive score recomputed in float64
  (``gram``); then raw vectors, local outward normals and random directions; then, for all
  keys left at once, Gilbert (Frank-Wolfe) rounds and column generation with non-negative least
  squares over small working sets, each round scoring every candidate query against all keys in
  one matrix product (``scores``, ``columns``); then LPs over working sets (cutting
  planes), and the naive LP for anything still undecided.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import scipy.sparse
import torch

from exactlens.analysis.hull import fast as hull_fast
from exactlens.analysis.hull.products import threads_for_products
from exactlens.analysis.hull.request import HullRequest
from exactlens.analysis.hull.solver import SELECTABLE, UNDECIDED, HullSolver
from exactlens.errors import ExactLensError
from exactlens.progress import bar
from exactlens.resources import check_work

# the public names are the package's __all__ (exactlens.analysis.hull)

METHODS = ("fast", "naive")


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


# ----------------------------------------------------------------------------- running


def _run_naive(solver: HullSolver) -> None:
    """The naive method: one LP over all other keys per key."""
    for i in bar(range(solver.n), desc="hull: one LP per key", unit="key", min_items=PROGRESS_FROM):
        solver.decide_by_lp(i)


def _result(solver: HullSolver, method: str) -> SelectabilityResult:
    """The solver's decisions (every key decided) as a result, weights as a sparse n x n matrix."""
    assert np.all(solver.state != UNDECIDED)
    n = solver.n
    rows: list[np.ndarray] = []
    cols: list[np.ndarray] = []
    vals: list[np.ndarray] = []
    for i, (idx, lam) in solver.support.items():
        rows.append(np.full(idx.size, i, dtype=np.int64))
        cols.append(idx.astype(np.int64))
        vals.append(lam)
    if rows:
        weights = scipy.sparse.csr_array((np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))),
                                         shape=(n, n))
        weights.sum_duplicates()  # canonical: sorted column indices per row
    else:
        weights = scipy.sparse.csr_array((n, n), dtype=np.float64)
    return SelectabilityResult(
        selectable=solver.state == SELECTABLE,
        queries=solver.queries,
        margins=solver.margins,
        weights=weights,
        residuals=solver.residuals,
        tolerance=solver.rel_tol,
        scale=solver.scale,
        method=method,
        stats=dict(solver.stats),
    )


# ----------------------------------------------------------------------------- public API


HULL_OPERATIONS_PER_PAIR = 10
"""Work estimate of the fast method: at most about this many operations per (key, key, dimension) for
key sets whose keys are mostly hull vertices (measured: n = 10^5 standard-normal keys in d = 64 take
~12 s of CPU, the float32 Gram matrix being 90 % of it); beyond the work limit a call is refused up
front. Sets with most keys inside the hull in high dimension cost more (docs/brody.md)."""
PROGRESS_FROM = hull_fast.PROGRESS_FROM  # key sets from this size show progress bars


def selectable_keys(keys: np.ndarray | torch.Tensor, *, tol: float = HullRequest.tol,
                    method: str = "fast") -> SelectabilityResult:
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
    with threads_for_products():
        solver = HullSolver(np.ldexp(arr, -exponent), tol)
        if not solver.trivial():
            if method == "naive":
                _run_naive(solver)
            else:
                hull_fast.run(solver)
    result = _result(solver, method)
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

"""Tests for exactlens.analysis.hull: the exact unselectable-keys check (Brody et al. 2023, §3.2).

Every result is checked twice: the fast method against the naive one-LP-per-key reference, and
each certificate independently (a query must give its key the strict top score with the stated
margin; convex weights must rebuild the key). Where the answer is known in closed form (lattices,
spheres, collinear points, qhull in 2-D/3-D) it is compared with that too.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from scipy.spatial import ConvexHull

from exactlens.analysis.hull import (
    SelectabilityResult,
    layer_norm_geometric,
    layer_norm_projection,
    selectable_keys,
)
from exactlens.analysis.hull import fast as hull_fast
from exactlens.analysis.hull.solver import HullSolver
from exactlens.errors import ExactLensError

EPS64 = np.finfo(np.float64).eps
HYP = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# ----------------------------------------------------------------------------- helpers


def assert_certificates(keys, res: SelectabilityResult) -> None:
    """Check every certificate from scratch against the keys, in the keys' own units."""
    keys = np.asarray(keys, dtype=np.float64)
    n, d = keys.shape
    assert res.selectable.shape == (n,) and res.selectable.dtype == np.bool_
    assert res.queries.shape == (n, d) and res.margins.shape == (n,) and res.residuals.shape == (n,)
    scale = float(np.abs(keys).max())
    assert res.scale == scale
    eps = res.tolerance * scale
    assert res.abs_tolerance == pytest.approx(eps)
    slack = 16 * d * EPS64 * max(scale, 1e-300)  # rounding of a dot product with a unit query
    for i in range(n):
        c = res.certificate(i)
        assert c.index == i and c.selectable == bool(res.selectable[i])
        if c.selectable:
            q = c.query
            assert q is not None and np.linalg.norm(q) == pytest.approx(1.0, abs=1e-12)
            assert c.support.size == 0 and math.isnan(c.residual)
            if n == 1:
                assert c.margin == math.inf
                continue
            scores = keys @ q
            others = np.delete(scores, i)
            assert np.all(scores[i] > others), f"key {i}: its query does not give it the strict top score"
            margin = scores[i] - others.max()
            assert c.margin > eps, f"key {i}: margin {c.margin} not above the tolerance {eps}"
            assert margin == pytest.approx(c.margin, rel=1e-6, abs=slack)
        else:
            assert c.query is None and math.isnan(c.margin)
            assert c.support.size >= 1 and i not in c.support.tolist()
            assert np.all(c.support >= 0) and np.all(c.support < n)
            assert np.all(c.weights >= 0)
            assert c.weights.sum() == pytest.approx(1.0, abs=1e-12)
            err = np.abs(c.weights @ keys[c.support] - keys[i]).max()
            assert err <= eps + slack, f"key {i}: weights rebuild it only to {err} > {eps}"
            assert c.residual <= eps + slack
            assert c.residual == pytest.approx(err, abs=slack + 1e-3 * eps)
    assert res.n_unselectable == int(np.count_nonzero(~res.selectable))
    assert res.fraction_unselectable == pytest.approx(res.n_unselectable / n)
    decided = sum(v for k, v in res.stats.items() if k != "boundary")
    assert decided == n or n == 1
    assert res.stats.get("boundary", 0) == 0


def check_both(keys, expected=None, tol: float = 1e-9) -> SelectabilityResult:
    """fast == naive, both certified, and equal to ``expected`` when given."""
    fast = selectable_keys(keys, tol=tol)
    naive = selectable_keys(keys, tol=tol, method="naive")
    assert fast.method == "fast" and naive.method == "naive"
    np.testing.assert_array_equal(fast.selectable, naive.selectable)
    assert_certificates(keys, fast)
    assert_certificates(keys, naive)
    if expected is not None:
        np.testing.assert_array_equal(fast.selectable, np.asarray(expected, dtype=bool))
    return fast


def qhull_selectable(points: np.ndarray) -> np.ndarray:
    """Selectable mask from qhull: hull vertices that have no duplicate."""
    _, inverse, counts = np.unique(points, axis=0, return_inverse=True, return_counts=True)
    out = np.zeros(len(points), dtype=bool)
    out[ConvexHull(points).vertices] = True
    return out & (counts[inverse.reshape(-1)] == 1)


def int_keys(max_n: int = 14, max_d: int = 3, lo: int = -3, hi: int = 3):
    """Small-integer key sets: many ties, collinear points, duplicates and points on facets."""
    return st.integers(1, max_d).flatmap(
        lambda d: st.lists(st.lists(st.integers(lo, hi), min_size=d, max_size=d), min_size=1, max_size=max_n).map(
            lambda rows: np.array(rows, dtype=np.float64)
        )
    )


# ----------------------------------------------------------------------------- fast == naive


@pytest.mark.parametrize(
    ("n", "d", "seed"),
    [
        (1, 3, 0),
        (2, 4, 1),
        (3, 8, 2),  # n < d: every key of a generic set is a vertex
        (7, 12, 3),
        (30, 1, 4),
        (40, 2, 5),
        (80, 3, 6),
        (120, 4, 7),
        (150, 6, 8),
        (200, 8, 9),
        (90, 16, 10),
    ],
)
def test_fast_matches_naive_on_normal_keys(n, d, seed):
    keys = np.random.default_rng(seed).standard_normal((n, d))
    res = check_both(keys)
    if n <= d:
        assert res.selectable.all()
    if d == 1:  # on a line only the two ends can win
        expected = np.zeros(n, dtype=bool)
        expected[[keys[:, 0].argmin(), keys[:, 0].argmax()]] = True
        np.testing.assert_array_equal(res.selectable, expected)


def test_fast_uses_few_lps_on_normal_keys():
    keys = np.random.default_rng(11).standard_normal((400, 6))
    res = selectable_keys(keys)
    assert res.stats["lp"] <= 4, res.stats
    assert res.stats["directions"] > 0 and res.stats["working_set"] > 0
    assert 0 < res.n_unselectable < 400


def test_naive_queries_come_from_the_lp_dual(monkeypatch):
    """The HiGHS marginals must already certify selectable keys (no second, separation LP)."""
    calls = []
    original = HullSolver.separation_lp
    monkeypatch.setattr(
        HullSolver, "separation_lp", lambda self, i, others: calls.append(i) or original(self, i, others)
    )
    keys = np.random.default_rng(23).standard_normal((60, 4))
    res = selectable_keys(keys, method="naive")
    assert res.selectable.any() and calls == []


def test_fast_fallback_to_lp_gives_the_same_answer(monkeypatch):
    """With the cheap stages switched off the fast method must still agree (all keys via the LP)."""
    rng = np.random.default_rng(12)
    keys = np.vstack([rng.standard_normal((40, 3)), rng.integers(-2, 3, (20, 3))])
    keys = np.vstack([keys, keys[:3]])  # duplicates too
    reference = selectable_keys(keys, method="naive")
    monkeypatch.setattr(hull_fast, "screen_own_directions", lambda s, show: None)
    monkeypatch.setattr(hull_fast, "screen_local_normals", lambda s, rows, nb: None)
    monkeypatch.setattr(hull_fast, "screen_random_directions", lambda s: None)
    monkeypatch.setattr(hull_fast, "working_sets", lambda s, rows, nb, show: {})
    res = selectable_keys(keys)
    assert res.stats["lp"] == len(keys) - res.stats["duplicates"] and res.stats["duplicates"] >= 6
    np.testing.assert_array_equal(res.selectable, reference.selectable)
    assert_certificates(keys, res)


# ----------------------------------------------------------------------------- adversarial sets


def test_duplicates_are_unselectable():
    square = np.array([[0.0, 0.0], [1.0, 0.0], [1.0, 1.0], [0.0, 1.0]])
    keys = np.vstack([square, [[0.5, 0.5]], square[[2]], [[0.5, 0.5]]])  # corner 2 and the centre twice
    res = check_both(keys, expected=[True, True, False, True, False, False, False])
    cert = res.certificate(2)
    assert cert.support.tolist() == [5] and cert.weights.tolist() == [1.0]
    assert res.stats["duplicates"] == 4


def test_all_equal_and_single_keys():
    check_both(np.ones((5, 3)), expected=[False] * 5)
    check_both(np.zeros((3, 2)), expected=[False] * 3)
    res = check_both(np.array([[2.0, -1.0]]), expected=[True])
    assert res.certificate(0).margin == math.inf
    check_both(np.array([[1.0, 2.0], [1.0, 2.0]]), expected=[False, False])
    check_both(np.array([[1.0, 2.0], [1.0, 3.0]]), expected=[True, True])


def test_midpoints_and_facet_points_are_unselectable():
    rng = np.random.default_rng(13)
    base = rng.standard_normal((25, 3))
    pairs = rng.integers(0, 25, (12, 2))
    pairs = pairs[pairs[:, 0] != pairs[:, 1]]
    mids = 0.5 * (base[pairs[:, 0]] + base[pairs[:, 1]])
    res = check_both(np.vstack([base, mids]))
    assert not res.selectable[25:].any()
    # Points on the facets of a 3-D hull (qhull) with random barycentric weights.
    h = ConvexHull(base)
    w = rng.dirichlet(np.ones(3), size=len(h.simplices))
    facet_points = np.einsum("fk,fkd->fd", w, base[h.simplices])
    keys = np.vstack([base, facet_points])
    res = check_both(keys)
    np.testing.assert_array_equal(res.selectable[:25], qhull_selectable(base))
    assert not res.selectable[25:].any()


@pytest.mark.parametrize(("side", "d"), [(3, 2), (4, 2), (3, 3), (2, 4)])
def test_integer_lattice_only_corners_are_selectable(side, d):
    grid = np.stack(np.meshgrid(*[np.arange(side)] * d, indexing="ij"), axis=-1).reshape(-1, d).astype(float)
    corner = np.all((grid == 0) | (grid == side - 1), axis=1)
    check_both(grid, expected=corner)


def test_collinear_keys_only_the_ends():
    rng = np.random.default_rng(14)
    t = rng.permutation(np.linspace(-2.0, 3.0, 15))
    keys = np.outer(t, rng.standard_normal(4)) + rng.standard_normal(4)
    expected = np.zeros(15, dtype=bool)
    expected[[t.argmin(), t.argmax()]] = True
    check_both(keys, expected=expected)


def test_keys_on_a_sphere_are_all_selectable():
    x = np.random.default_rng(15).standard_normal((150, 3))
    keys = 2.5 * x / np.linalg.norm(x, axis=1, keepdims=True)
    check_both(keys, expected=[True] * 150)


def test_keys_after_layer_norm_rank_deficient_and_all_selectable():
    """Brody §3.2/§4.2: scaling puts keys on a sphere, so every key is selectable.

    The keys lie in the hyperplane orthogonal to 1 (rank d-1); the query certificates stay in
    that hyperplane.
    """
    rng = np.random.default_rng(16)
    x = 3.0 * rng.standard_normal((160, 4)) + 1.0
    before = check_both(x)
    assert before.n_unselectable > 0
    ln = layer_norm_geometric(x)
    assert np.linalg.matrix_rank(ln - ln.mean(0)) == 3
    after = check_both(ln, expected=[True] * 160)
    np.testing.assert_allclose(after.queries.sum(axis=1), 0.0, atol=1e-9)
    # Projection alone (no scaling) keeps the keys rank-deficient but leaves keys inside the hull.
    projected = x @ layer_norm_projection(4)
    assert check_both(projected).n_unselectable > 0


def test_nearly_degenerate_points_follow_the_tolerance():
    square = np.array([[0.0, 0.0], [1.0, 0.0], [1.0, 1.0], [0.0, 1.0]])
    keys = np.vstack([square, [[0.5, -1e-12], [1.0 + 1e-6, 0.5]]])
    expected = [True, True, True, True, False, True]
    check_both(keys, expected=expected)
    # Relative tolerance: the answer does not change when all keys are scaled.
    check_both(1e6 * keys, expected=expected)
    check_both(1e-6 * keys, expected=expected)
    # A looser tolerance swallows the point 1e-6 outside.
    check_both(keys, expected=[True, True, True, True, False, False], tol=1e-5)
    # Near-duplicates within the tolerance: both copies are unselectable.
    check_both(np.vstack([square, square[[1]] + 1e-13]), expected=[True, False, True, True, False])


def test_points_just_outside_3d_facets():
    rng = np.random.default_rng(17)
    base = rng.standard_normal((30, 3))
    h = ConvexHull(base)
    f = rng.choice(len(h.simplices), size=6, replace=False)
    centres = base[h.simplices[f]].mean(axis=1)
    normals = h.equations[f, :3]  # outward unit normals
    scale = np.abs(base).max()
    inside_tol = centres + 1e-12 * scale * normals
    outside = centres + 1e-5 * scale * normals
    res = check_both(np.vstack([base, inside_tol]))
    assert not res.selectable[30:].any()
    res = check_both(np.vstack([base, outside]))
    assert res.selectable[30:].all()


def test_translated_and_scaled_sets_agree():
    rng = np.random.default_rng(18)
    keys = rng.standard_normal((60, 3))
    ref = check_both(keys)
    for a, b in [(1e3, 0.0), (1e-3, 0.0), (-2.0, 5.0), (1.0, 100.0)]:
        res = check_both(a * keys + b * np.ones(3))
        np.testing.assert_array_equal(res.selectable, ref.selectable)


# ----------------------------------------------------------------------------- closed-form references


@HYP
@given(pts=st.lists(st.tuples(st.integers(-6, 6), st.integers(-6, 6)), min_size=3, max_size=25))
def test_2d_polygon_vertices_match_qhull(pts):
    keys = np.array(pts, dtype=np.float64)
    assume(np.linalg.matrix_rank(keys[1:] - keys[0]) == 2)  # qhull needs a full-dimensional set
    res = selectable_keys(keys)
    np.testing.assert_array_equal(res.selectable, qhull_selectable(keys))
    assert_certificates(keys, res)


@pytest.mark.parametrize(("n", "d", "seed"), [(300, 2, 19), (300, 3, 20), (400, 4, 21)])
def test_normal_keys_match_qhull(n, d, seed):
    keys = np.random.default_rng(seed).standard_normal((n, d))
    res = selectable_keys(keys)
    np.testing.assert_array_equal(res.selectable, qhull_selectable(keys))
    assert_certificates(keys, res)


def test_theorem1_no_query_selects_an_unselectable_key():
    """Brody Theorem 1: for a key in the hull of the others, max_j v.h_j >= v.h_n for every v."""
    rng = np.random.default_rng(22)
    keys = rng.standard_normal((80, 3))
    res = selectable_keys(keys)
    bad = res.unselectable_indices
    assert bad.size > 0
    v = rng.standard_normal((5000, 3))
    scores = keys @ v.T
    for i in bad:
        others = np.delete(scores, i, axis=0).max(axis=0)
        assert np.all(scores[i] <= others + 1e-12)


# ----------------------------------------------------------------------------- properties


@HYP
@given(keys=int_keys())
def test_fast_matches_naive_on_integer_sets(keys):
    check_both(keys)


@HYP
@given(
    keys=int_keys(max_n=12),
    raw_w=st.lists(st.floats(0.05, 1.0), min_size=12, max_size=12),
)
def test_adding_a_convex_combination_adds_an_unselectable_key(keys, raw_w):
    n = len(keys)
    w = np.array(raw_w[:n]) / np.sum(raw_w[:n])
    new = w @ keys
    before = selectable_keys(keys)
    after = selectable_keys(np.vstack([keys, new]))
    assert not after.selectable[n]
    # Adding a point never makes an old unselectable key selectable (the hull of the others grows).
    assert not np.any(after.selectable[:n] & ~before.selectable)
    assert_certificates(np.vstack([keys, new]), after)


@HYP
@given(
    keys=int_keys(),
    a=st.sampled_from([1.0, -1.0, 0.5, 3.0, -1024.0, 1 / 64]),
    b=st.lists(st.integers(-50, 50), min_size=4, max_size=4),
    seed=st.integers(0, 2**16),
)
def test_selectable_set_is_invariant_under_scaling_translation_and_permutation(keys, a, b, seed):
    n, d = keys.shape
    ref = selectable_keys(keys).selectable
    moved = a * keys + np.array(b[:d], dtype=np.float64)
    np.testing.assert_array_equal(selectable_keys(moved).selectable, ref)
    perm = np.random.default_rng(seed).permutation(n)
    np.testing.assert_array_equal(selectable_keys(keys[perm]).selectable, ref[perm])


# ----------------------------------------------------------------------------- API


def test_to_json_and_result_fields():
    keys = np.array([[0.0, 0.0], [2.0, 0.0], [0.0, 2.0], [0.5, 0.5]])
    res = selectable_keys(keys, tol=1e-8)
    out = res.to_json()
    assert set(out) == {"n_keys", "dim", "n_unselectable", "fraction_unselectable", "tolerance", "method"}
    assert out == {
        "n_keys": 4,
        "dim": 2,
        "n_unselectable": 1,
        "fraction_unselectable": 0.25,
        "tolerance": 1e-8,
        "method": "fast",
    }
    json.dumps(out)
    assert res.n_keys == 4 and res.dim == 2 and res.unselectable_indices.tolist() == [3]
    assert res.weights.shape == (4, 4) and res.weights[[3]].nnz >= 1
    with pytest.raises(ExactLensError, match="out of range"):
        res.certificate(4)
    assert res.certificate(-1).index == 3


def test_torch_input_matches_numpy():
    keys = torch.randn(50, 3, generator=torch.Generator().manual_seed(0))
    a = selectable_keys(keys)
    b = selectable_keys(keys.numpy().astype(np.float64))
    np.testing.assert_array_equal(a.selectable, b.selectable)
    c = selectable_keys(keys.to(torch.float32).requires_grad_())
    np.testing.assert_array_equal(c.selectable, b.selectable)


@pytest.mark.parametrize(
    ("keys", "kwargs", "match"),
    [
        (np.zeros(4), {}, "2-D"),
        (np.zeros((2, 2, 2)), {}, "2-D"),
        (np.zeros((0, 3)), {}, "empty"),
        (np.zeros((3, 0)), {}, "empty"),
        (np.array([[1.0, np.nan]]), {}, "finite"),
        (np.array([[1.0, 2.0], [np.inf, 0.0]]), {}, "finite"),
        (np.array([[1 + 1j, 2.0]]), {}, "real"),
        (np.array([["a", "b"]]), {}, "real"),
        (torch.zeros(3, 2, dtype=torch.complex64), {}, "real"),
        (np.ones((3, 2)), {"tol": 0.0}, "tol"),
        (np.ones((3, 2)), {"tol": -1e-9}, "tol"),
        (np.ones((3, 2)), {"tol": float("nan")}, "tol"),
        (np.ones((3, 2)), {"tol": "1e-9"}, "tol"),
        (np.ones((3, 2)), {"method": "qhull"}, "method"),
    ],
)
def test_bad_input_raises(keys, kwargs, match):
    with pytest.raises(ExactLensError, match=match):
        selectable_keys(keys, **kwargs)
    assert issubclass(ExactLensError, ValueError)


# ----------------------------------------------------------------------------- layer norm geometry


@pytest.mark.parametrize("d", [1, 2, 3, 8, 17])
def test_projection_matrix(d):
    p = layer_norm_projection(d)
    np.testing.assert_allclose(p @ p, p, atol=1e-14)
    np.testing.assert_array_equal(p, p.T)
    np.testing.assert_allclose(p @ np.ones(d), 0.0, atol=1e-14)
    # Brody eq. (28): (d-1)/d on the diagonal, -1/d elsewhere.
    expected = np.full((d, d), -1.0 / d) + np.eye(d)
    np.testing.assert_allclose(p, expected, atol=1e-15)
    x = np.random.default_rng(d).standard_normal(d)
    np.testing.assert_allclose(p @ x, x - x.mean(), atol=1e-14)
    assert np.linalg.matrix_rank(p) == d - 1


@pytest.mark.parametrize("bad", [0, -3, 2.0, True, "4"])
def test_projection_matrix_bad_d(bad):
    with pytest.raises(ExactLensError, match="positive integer"):
        layer_norm_projection(bad)


@HYP
@given(
    x=st.integers(2, 9).flatmap(
        lambda d: st.lists(
            st.lists(st.floats(-100, 100, allow_nan=False), min_size=d, max_size=d), min_size=1, max_size=5
        )
    )
)
def test_layer_norm_geometric_is_standardisation(x):
    x = np.array(x)
    std = x.std(axis=1)  # population std (ddof=0), as in LayerNorm
    assume(np.all(std > 1e-6 * (1 + np.abs(x).max())))
    ln = layer_norm_geometric(x)
    d = x.shape[1]
    np.testing.assert_allclose(ln, (x - x.mean(axis=1, keepdims=True)) / std[:, None], rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(np.linalg.norm(ln, axis=1), math.sqrt(d), rtol=1e-12)
    np.testing.assert_allclose(ln.sum(axis=1), 0.0, atol=1e-9)
    np.testing.assert_allclose(layer_norm_geometric(x[0]), ln[0])
    np.testing.assert_allclose(layer_norm_geometric(torch.tensor(x)), ln)


@HYP
@given(
    d=st.integers(2, 10),
    seed=st.integers(0, 2**16),
    alphas=st.lists(st.floats(1e-3, 1e3).flatmap(lambda a: st.sampled_from([a, -a])), min_size=2, max_size=8),
    betas=st.lists(st.floats(-1e3, 1e3), min_size=8, max_size=8),
)
def test_appendix_b_plane_collapses_to_two_points(d, seed, alphas, betas):
    """Brody App. B: LN maps the plane {alpha v + beta 1} to sqrt(d) v (alpha > 0) or -sqrt(d) v."""
    v = np.random.default_rng(seed).standard_normal(d)
    v -= v.mean()
    assume(np.linalg.norm(v) > 1e-3)
    v /= np.linalg.norm(v)
    x = np.array([a * v + b * np.ones(d) for a, b in zip(alphas, betas, strict=False)])
    ln = layer_norm_geometric(x)
    expected = np.sign(np.array(alphas))[:, None] * math.sqrt(d) * v
    np.testing.assert_allclose(ln, expected, atol=1e-9)
    # So as keys, two inputs of the plane with the same sign of alpha can only tie.
    res = selectable_keys(ln)
    signs = np.sign(alphas)
    for s in (1.0, -1.0):
        if np.count_nonzero(signs == s) > 1:
            assert not res.selectable[signs == s].any()
        elif np.count_nonzero(signs == s) == 1:
            assert res.selectable[signs == s].all()


def test_layer_norm_of_a_constant_row_raises():
    with pytest.raises(ExactLensError, match="constant"):
        layer_norm_geometric(np.array([[1.0, 2.0, 3.0], [5.0, 5.0, 5.0]]))
    with pytest.raises(ExactLensError, match="constant"):
        layer_norm_geometric(np.zeros(4))
    with pytest.raises(ExactLensError, match="finite"):
        layer_norm_geometric(np.array([1.0, np.nan]))

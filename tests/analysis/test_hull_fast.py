"""The fast unselectable-keys check, piece by piece (exactlens.analysis.hull.fast, hull_gram, hull_scores,
hull_columns, working on a hull_solver.HullSolver): each piece against an independent reference, and the
whole against the naive LP with its blocks and tiles shrunk so that every boundary between them is crossed."""

from __future__ import annotations

import io
from fractions import Fraction

import numpy as np
import pytest
from test_hull import assert_certificates, check_both

from exactlens import progress
from exactlens.analysis.hull import columns as hull_columns
from exactlens.analysis.hull import fast as hull_fast
from exactlens.analysis.hull import gram as hull_gram
from exactlens.analysis.hull import layer_norm_geometric, selectable_keys
from exactlens.analysis.hull import products as hull_products
from exactlens.analysis.hull import scores as hull_scores
from exactlens.analysis.hull.solver import HullSolver

# ----------------------------------------------------------------------------- duplicates


@pytest.mark.parametrize("seed", range(6))
def test_duplicate_groups_match_np_unique(seed):
    rng = np.random.default_rng(seed)
    keys = rng.integers(-2, 3, size=(rng.integers(2, 120), rng.integers(1, 5))).astype(np.float64)
    keys[rng.random(keys.shape) < 0.2] *= -0.0  # -0.0 equals 0.0 as a float
    dup, first = hull_fast.duplicate_groups(keys)
    _, inverse, counts = np.unique(keys, axis=0, return_inverse=True, return_counts=True)
    inverse = inverse.reshape(-1)
    expected = np.flatnonzero(counts[inverse] > 1)
    order = np.argsort(dup)
    np.testing.assert_array_equal(dup[order], expected)
    for i, f in zip(dup[order], first[order], strict=True):
        assert f == np.flatnonzero(inverse == inverse[i]).min()


def test_duplicate_groups_survive_hash_collisions(monkeypatch):
    """Every row hashed alike: the full comparison still finds exactly the equal rows."""
    keys = np.array([[0.0, 1.0], [1.0, 0.0], [0.0, 1.0], [2.0, 2.0], [1.0, 0.0], [3.0, 3.0]])
    monkeypatch.setattr(hull_fast, "row_hash", lambda y: np.zeros(y.shape[0], dtype=np.uint64))
    dup, first = hull_fast.duplicate_groups(keys)
    order = np.argsort(dup)
    assert dup[order].tolist() == [0, 1, 2, 4] and first[order].tolist() == [0, 1, 0, 1]
    assert hull_fast.duplicate_groups(keys[[0, 1, 3]])[0].size == 0


# ----------------------------------------------------------------------------- float32 Gram bound


def _exact_dot(a: np.ndarray, b: np.ndarray) -> Fraction:
    return sum((Fraction(float(x)) * Fraction(float(y)) for x, y in zip(a, b, strict=True)), Fraction(0))


@pytest.mark.parametrize("d", [2, 8, 64, 300])
def test_float32_scores_stay_within_the_error_bound(d):
    """Against exact rational arithmetic, on vectors built to cancel (large entries of both signs)."""
    rng = np.random.default_rng(d)
    y = rng.standard_normal((40, d)) * np.exp(4 * rng.standard_normal((40, d)))
    y[20:] = -y[:20] + 1e-3 * rng.standard_normal((20, d)) * np.abs(y[:20])  # near-opposite pairs cancel
    y /= np.abs(y).max()
    y32 = y.astype(np.float32)
    s32 = y32 @ y32.T
    norms = np.linalg.norm(y, axis=1)
    c = hull_gram.error_bound(d)
    worst = 0.0
    for i in range(0, 40, 3):
        for j in range(40):
            err = abs(Fraction(float(s32[i, j])) - _exact_dot(y[i], y[j]))
            allowed = c * norms[i] * norms[j] + d * 2.0**-124
            worst = max(worst, float(err) / allowed)
    assert worst <= 1.0, worst
    assert worst > 1e-4, "the bound is not absurdly loose on cancelling data"


def _float64_leads(y: np.ndarray) -> np.ndarray:
    g = y @ y.T
    own = np.diag(g).copy()
    np.fill_diagonal(g, -np.inf)
    return own - g.max(axis=1)


@pytest.mark.parametrize("tile", [5, 16, 512])
def test_own_direction_leads_equal_the_float64_leads(monkeypatch, tile):
    monkeypatch.setattr(hull_gram, "TILE", tile)
    rng = np.random.default_rng(tile)
    for y in (rng.standard_normal((150, 6)), rng.standard_normal((90, 40)), layer_norm_geometric(
            rng.standard_normal((120, 5)))):
        y = (y - y.mean(0)) / np.abs(y - y.mean(0)).max()
        lead = hull_gram.own_direction_leads(y, show=False)
        ref = _float64_leads(y)
        settled = ~np.isnan(lead)
        assert settled.mean() > 0.9
        np.testing.assert_allclose(lead[settled], ref[settled], rtol=1e-12, atol=1e-14)


def test_near_ties_across_blocks_are_left_to_float64(monkeypatch):
    """Keys whose two best competitors tie (a lattice) are not settled in float32; none is settled wrongly."""
    monkeypatch.setattr(hull_gram, "TILE", 4)
    grid = np.stack(np.meshgrid(np.arange(4.0), np.arange(4.0), indexing="ij"), -1).reshape(-1, 2)
    y = (grid - grid.mean(0)) / np.abs(grid - grid.mean(0)).max()
    lead = hull_gram.own_direction_leads(y, show=False)
    ref = _float64_leads(y)
    assert np.isnan(lead).any()
    settled = ~np.isnan(lead)
    np.testing.assert_allclose(lead[settled], ref[settled], rtol=1e-12, atol=1e-14)


# ----------------------------------------------------------------------------- nearest neighbours


@pytest.mark.parametrize("d", [3, 40])  # the k-d tree and the all-pairs path
def test_nearest_are_the_nearest_other_keys(d):
    rng = np.random.default_rng(d)
    keys = rng.standard_normal((80, d))
    keys = np.vstack([keys, keys[:5]])  # twins at distance 0
    solver = HullSolver(keys, 1e-9)
    rows = np.arange(0, 85, 3)
    k = 6
    nb = hull_scores.nearest(solver, rows, k)
    y = solver.Y
    for row, i in enumerate(rows):
        assert i not in nb[row]
        dist = np.linalg.norm(y - y[i], axis=1)
        dist[i] = np.inf
        got = np.sort(dist[nb[row]])
        np.testing.assert_allclose(got, np.sort(dist)[:k], rtol=1e-12, atol=1e-12)
        assert dist[nb[row, 0]] == pytest.approx(dist.min(), abs=1e-12)


# ----------------------------------------------------------------------------- the whole, with tiny blocks


def _tiny_blocks(monkeypatch):
    monkeypatch.setattr(hull_gram, "TILE", 7)
    monkeypatch.setattr(hull_scores, "BLOCK_ENTRIES", 64)


@pytest.mark.parametrize("seed", range(3))
def test_fast_matches_naive_with_tiny_tiles_and_blocks(monkeypatch, seed):
    _tiny_blocks(monkeypatch)
    rng = np.random.default_rng(100 + seed)
    grid = np.stack(np.meshgrid(*[np.arange(3.0)] * 3, indexing="ij"), -1).reshape(-1, 3)
    sets = [
        rng.standard_normal((90, 4)),
        rng.random((70, 5)),
        np.vstack([grid, grid[:4]]),  # lattice: ties everywhere, duplicates
        layer_norm_geometric(rng.standard_normal((60, 6))),  # rank deficient, all selectable
        np.vstack([rng.standard_normal((40, 3)), 0.1 * rng.standard_normal((40, 3))]),  # a cloud inside
    ]
    for keys in sets:
        check_both(keys)


def test_near_duplicates_go_through_small_lps_that_agree_with_the_full_lp(monkeypatch):
    """Pairs 1e-7 apart: NNLS residuals are too small to give a certifying direction, the
    working-set LPs (cutting planes) decide them, and the full LP is rarely needed."""
    rng = np.random.default_rng(7)
    base = rng.standard_normal((60, 4))
    keys = np.vstack([base, base[:30] + 1e-7 * rng.standard_normal((30, 4))])
    full_lps = []
    real = HullSolver.decide_by_lp
    monkeypatch.setattr(HullSolver, "decide_by_lp", lambda self, i: full_lps.append(i) or real(self, i))
    fast = selectable_keys(keys)
    monkeypatch.setattr(HullSolver, "decide_by_lp", real)
    naive = selectable_keys(keys, method="naive")
    np.testing.assert_array_equal(fast.selectable, naive.selectable)
    assert_certificates(keys, fast)
    assert fast.stats["lp"] > 0, fast.stats
    assert len(full_lps) < fast.stats["lp"], (full_lps, fast.stats)


def test_small_lps_alone_decide_every_key_like_the_naive_method(monkeypatch):
    """With every cheaper stage off, all keys go through the working-set LPs, which must agree."""
    rng = np.random.default_rng(8)
    keys = np.vstack([rng.standard_normal((50, 3)), rng.integers(-1, 2, (15, 3))])
    monkeypatch.setattr(hull_fast, "screen_own_directions", lambda s, show: None)
    monkeypatch.setattr(hull_fast, "screen_local_normals", lambda s, rows, nb: None)
    monkeypatch.setattr(hull_fast, "screen_random_directions", lambda s: None)
    monkeypatch.setattr(hull_fast, "working_sets", lambda s, rows, nb, show: {})
    calls = []
    real = hull_columns.decide_by_small_lps
    monkeypatch.setattr(hull_fast, "decide_by_small_lps", lambda s, i, w: calls.append(i) or real(s, i, w))
    res = selectable_keys(keys)
    reference = selectable_keys(keys, method="naive")
    np.testing.assert_array_equal(res.selectable, reference.selectable)
    assert_certificates(keys, res)
    assert len(calls) == len(keys) - res.stats["duplicates"]


def test_search_among_candidates_never_misses_a_vertex():
    """Keys in the hull are dropped from the search once certified; the answer stays the naive one."""
    rng = np.random.default_rng(9)
    outer = rng.standard_normal((30, 5))
    outer /= np.linalg.norm(outer, axis=1, keepdims=True)
    inner = 0.2 * rng.standard_normal((150, 5))
    res = check_both(np.vstack([outer, inner]))
    assert res.selectable[:30].all()


# ----------------------------------------------------------------------------- threads, progress bars


def test_products_run_on_the_set_threads_and_restore_torch_s_count(monkeypatch):
    import torch

    original = torch.get_num_threads()
    monkeypatch.setattr(hull_products, "THREADS", 1)
    seen = []
    real = hull_products.product_t
    monkeypatch.setattr(hull_gram, "product_t", lambda a, b: seen.append(torch.get_num_threads()) or real(a, b))

    def boom(s, show):
        raise RuntimeError("boom")

    try:
        torch.set_num_threads(2)  # a count other than THREADS, so the switch is seen
        selectable_keys(np.random.default_rng(0).standard_normal((40, 3)))
        assert seen and set(seen) == {1}
        assert torch.get_num_threads() == 2
        monkeypatch.setattr(hull_fast, "screen_own_directions", boom)
        with pytest.raises(RuntimeError, match="boom"):
            selectable_keys(np.random.default_rng(0).standard_normal((40, 3)))
        assert torch.get_num_threads() == 2, "restored after an error too"
    finally:
        torch.set_num_threads(original)


def test_large_key_sets_show_progress_bars(monkeypatch):
    made = []
    real = progress.tqdm

    def recording(iterable=None, **kwargs):
        made.append(kwargs)
        return real(iterable, **{**kwargs, "disable": True, "file": io.StringIO()})

    monkeypatch.setattr(progress, "tqdm", recording)
    progress.set_quiet(False)
    selectable_keys(np.random.default_rng(0).standard_normal((hull_fast.PROGRESS_FROM, 3)))
    shown = [b for b in made if b["disable"] is not True]
    assert {"hull: scores of key pairs", "hull: keys left after screening"} <= {b["desc"] for b in shown}
    assert all(b["file"] is progress.sys.stderr for b in made)
    made.clear()
    selectable_keys(np.random.default_rng(0).standard_normal((hull_fast.PROGRESS_FROM - 1, 3)))
    assert made and all(b["disable"] is True for b in made), "no bars below PROGRESS_FROM keys"
    made.clear()
    progress.set_quiet(True)
    try:
        selectable_keys(np.random.default_rng(0).standard_normal((hull_fast.PROGRESS_FROM, 3)))
    finally:
        progress.set_quiet(False)
    assert made and all(b["disable"] is True for b in made)


def test_margins_are_the_float64_margins_at_scale():
    """n = 3000 keys in d = 24 (the float32 Gram decides): every reported margin is the float64 one."""
    keys = np.random.default_rng(10).standard_normal((3000, 24))
    res = selectable_keys(keys)
    assert res.stats["directions"] > 0.9 * len(keys)
    sel = np.flatnonzero(res.selectable)[:300]
    scores = keys @ res.queries[sel].T  # (n, 300)
    for col, i in enumerate(sel):
        others = np.delete(scores[:, col], i)
        assert scores[i, col] - others.max() == pytest.approx(res.margins[i], rel=1e-9, abs=1e-12)
    assert np.isnan(res.margins[~res.selectable]).all()


# ----------------------------------------------------------------------------- regressions of a randomized sweep


def _sweep_set(seed: int, index: int) -> np.ndarray:
    """Set number ``index`` of the randomized sweep that compared fast and naive on 1800 small sets."""
    rng = np.random.default_rng(seed)
    for it in range(index + 1):
        d, n = int(rng.integers(1, 6)), int(rng.integers(1, 40))
        kind = it % 4
        if kind == 0:
            keys = rng.integers(-2, 3, (n, d)).astype(float)
        elif kind == 1:
            keys = rng.standard_normal((n, d))
        elif kind == 2:  # near-duplicates, 1e-13 .. 1e-6 apart
            base = rng.standard_normal((max(1, n // 2), d))
            near = base[rng.integers(0, len(base), n - len(base))]
            keys = np.vstack([base, near + 10.0 ** rng.integers(-13, -5) * rng.standard_normal((n - len(base), d))])
        else:
            x = rng.standard_normal((n, d))
            keys = x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-300)
            keys = np.vstack([keys, keys[: n // 3]])
    return keys


@pytest.mark.parametrize(("seed", "index", "shape"), [(1, 134, (21, 5)), (2, 10, (22, 5)), (3, 558, (31, 4))])
def test_sweep_regressions_near_duplicates(seed, index, shape):
    """Where the naive method used to fail, all on near-duplicates: (1, 134) its LP's t* said
    "inside" but a query certifies the key (it now tries the separation LP before deciding by t*);
    (2, 10) HiGHS's dual simplex stalled (status 15) at the tight tolerances (the interior-point
    method solves it); (3, 558) t* said "outside" but convex weights rebuild the key to 3e-16 (it
    now tries NNLS over all other keys before deciding by t*)."""
    keys = _sweep_set(seed, index)
    assert keys.shape == shape
    check_both(keys)

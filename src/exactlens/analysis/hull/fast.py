"""The fast method of :func:`exactlens.analysis.hull.selectable_keys`: the same exact decisions as one
LP per key, with certificates, from batched linear algebra (Brody, Alon & Yahav 2023, §3.2).

Everything works on the solver's internal keys y_i (centred, divided by their spread; see
:class:`~exactlens.analysis.hull.solver.HullSolver`) and certifies a key only against *all* keys:

* a *selectable* key i with a direction q: q.y_i - max_{j != i} q.y_j > tol * ||q||_1, the
  maximum over every other key computed in float64 (``scores``; for the first screen, float32
  with a rigorous error bound and the decisive score in float64, ``gram``);
* an *unselectable* key i with convex weights over other keys that rebuild y_i to within tol in
  every coordinate (``HullSolver.convex_weights`` recomputes the residual in float64).

Stages, cheapest first; each works only on the keys still undecided:

1. exact duplicates (weight 1 on a twin), by an exact row hash;
2. own directions: every key along its own centred vector y_i (one symmetric Gram matrix,
   ``gram``; on a sphere about the centroid this certifies every key, for standard-normal
   keys in d = 64 nearly every key), then along its raw vector k_i (keys after layer norm lie on a
   sphere about the origin), then along a local outward normal y_i - mean(nearest neighbours);
3. random Gaussian directions: the strict winner along each is certified (vertices with wide
   normal cones in low dimension);
4. Gilbert rounds and NNLS column generation for all keys left, in lock-step, then small LPs over
   working sets, and the naive full LP last (``columns``).
"""

from __future__ import annotations

import numpy as np

from exactlens.analysis.hull.columns import decide_by_small_lps, working_sets
from exactlens.analysis.hull.gram import own_direction_leads
from exactlens.analysis.hull.products import product_t
from exactlens.analysis.hull.scores import block_rows, certify_by_leads, leads, nearest, project
from exactlens.analysis.hull.solver import UNDECIDED, HullSolver
from exactlens.progress import bar, shows

PROGRESS_FROM = 500  # key sets from this size show progress bars
MAX_RANDOM_DIRECTIONS = 20000


def run(s: HullSolver) -> None:
    """Decide every undecided key of ``s``, cheapest stage first."""
    show = shows(s.n, PROGRESS_FROM) is not True  # True: bars off (quiet, or too few keys)
    mark_duplicates(s)
    screen_own_directions(s, show)
    rows = np.flatnonzero(s.state == UNDECIDED)
    if rows.size == 0:
        return
    nb = nearest(s, rows, min(s.n - 1, s.d + 2))
    screen_local_normals(s, rows, nb)
    screen_random_directions(s)
    left = s.state[rows] == UNDECIDED
    rows, nb = rows[left], nb[left]
    if rows.size == 0:
        return
    work = {int(i): nb[a] for a, i in enumerate(rows.tolist())}
    work.update(working_sets(s, rows, nb, show))
    rows = np.flatnonzero(s.state == UNDECIDED)
    for i in bar(rows.tolist(), desc="hull: LPs for the keys left", unit="key", min_items=PROGRESS_FROM):
        decide_by_small_lps(s, i, work[i])


# ----------------------------------------------------------------------------- duplicates


def row_hash(Y: np.ndarray) -> np.ndarray:
    """A 64-bit hash of each row, equal for rows equal as floats (-0.0 and 0.0 alike)."""
    bits = (Y + 0.0).view(np.uint64)  # + 0.0 turns -0.0 into 0.0, so equal floats have equal bits
    rng = np.random.default_rng(0)
    mult = rng.integers(0, 2**62, size=Y.shape[1], dtype=np.uint64) * np.uint64(2) + np.uint64(1)
    with np.errstate(over="ignore"):
        return (bits * mult).sum(axis=1, dtype=np.uint64)  # modulo 2^64


def duplicate_groups(Y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Keys equal to another key (as floats), and for each the first key of its group.

    Rows are hashed exactly (their bits times random odd 64-bit integers, summed modulo 2^64, after
    -0.0 -> 0.0), sorted by hash, and rows with equal hashes compared in full, so a collision costs
    time, never a wrong group. Far faster than ``np.unique(Y, axis=0)`` on large sets.
    """
    h = row_hash(Y)
    order = np.argsort(h, kind="stable")
    hs = h[order]
    same = np.flatnonzero(hs[1:] == hs[:-1])
    if same.size == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    cand = np.unique(np.concatenate([order[same], order[same + 1]]))
    _, inverse = np.unique(Y[cand], axis=0, return_inverse=True)  # exact groups among the candidates
    inverse = inverse.reshape(-1)
    counts = np.bincount(inverse)
    keep = counts[inverse] > 1
    dup, groups = cand[keep], inverse[keep]
    first = np.full(counts.size, Y.shape[0], dtype=np.int64)
    np.minimum.at(first, groups, dup)
    return dup, first[groups]


def mark_duplicates(s: HullSolver) -> None:
    """Exact duplicates: weight 1 on a twin (the group's first key; the first key gets the next one)."""
    dup, first = duplicate_groups(s.Y)
    if dup.size == 0:
        return
    order = np.lexsort((dup, first))  # by group, then index
    dup, first = dup[order], first[order]
    twins = np.where(first != dup, first, np.roll(dup, -1))  # a group's first key is followed by its second
    s.set_duplicates(dup, twins)


# ----------------------------------------------------------------------------- screens


def screen_own_directions(s: HullSolver, show: bool) -> None:
    """Each key along its own centred vector (Gram matrix), then along its raw vector."""
    rows = np.flatnonzero(s.state == UNDECIDED)
    if rows.size == 0:
        return
    lead = own_direction_leads(s.Y, show)
    tie = np.flatnonzero(np.isnan(lead))  # near ties in float32: these rows again in float64
    lead[tie] = leads(s, tie, s.Y[tie])[0]
    certify_by_leads(s, np.arange(s.n), s.Y, lead, "directions")
    rows = np.flatnonzero(s.state == UNDECIDED)
    if rows.size and np.any(s.center):  # raw keys differ from centred ones only off the centroid
        q = project(s, s.raw[rows])
        certify_by_leads(s, rows, q, leads(s, rows, q)[0], "directions")


def screen_local_normals(s: HullSolver, rows: np.ndarray, nb: np.ndarray) -> None:
    """Each key along y_i - mean of its nearest neighbours (an outward normal of the hull near a vertex)."""
    left = s.state[rows] == UNDECIDED
    rows = rows[left]
    if rows.size:
        q = s.Y[rows] - s.Y[nb[left]].mean(axis=1)
        certify_by_leads(s, rows, q, leads(s, rows, q)[0], "directions")


def screen_random_directions(s: HullSolver) -> None:
    """Scores along random directions; certify the strict winner of each if its lead > tol."""
    undecided = int(np.count_nonzero(s.state == UNDECIDED))
    if undecided == 0:
        return
    n, Y = s.n, s.Y
    count = int(min(max(4 * undecided, 64), MAX_RANDOM_DIRECTIONS))
    dirs = project(s, np.random.default_rng(0).standard_normal((count, s.d)))
    l1 = np.abs(dirs).sum(axis=1)
    best = np.full(n, -np.inf)
    best_dir = np.full(n, -1)
    step = block_rows(n)
    for a in range(0, count, step):
        scores = product_t(dirs[a : a + step], Y)  # one row of scores per direction
        at = np.arange(scores.shape[0])
        top = scores.argmax(axis=1)
        v1 = scores[at, top]
        scores[at, top] = -np.inf
        lead = (v1 - scores.max(axis=1)) / l1[a : a + step]
        ok = np.flatnonzero((lead > s.tol) & (s.state[top] == UNDECIDED))
        by_lead = ok[np.argsort(-lead[ok], kind="stable")]
        _, first = np.unique(top[by_lead], return_index=True)  # per key, its direction with the largest lead
        pick = by_lead[first]
        pick = pick[lead[pick] > best[top[pick]]]
        best[top[pick]] = lead[pick]
        best_dir[top[pick]] = a + pick
    rows = np.flatnonzero(best_dir >= 0)
    if rows.size:
        q = dirs[best_dir[rows]]
        certify_by_leads(s, rows, q, leads(s, rows, q)[0], "directions")

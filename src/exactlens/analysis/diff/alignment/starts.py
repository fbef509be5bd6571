"""Where DAS fits start, and how many dimensions a variable can need (issue 29, item 5).

Gradient descent on Q from a random start misses subspaces that are there (measured on the exact
constructions against themselves): on hard attention no gradient reaches the keys a subspace feeds
(induction-recent's "previous symbol" is read only by layer 2's unique-hard keys), a fit that starts
on a direction that is dead at the site stays there (FIRST's AND label started from its own
dimension at a site that does not write it), and a minimum over two outputs (Dyck) is slow to find.
So every fit runs from several starts at once (stacked like the fits themselves; restarting only
the fits that did not converge measured no faster, as most fits of a trained model do not), and
each fit keeps the start that does best on the *validation* pairs, which also pick k (test pairs,
used for neither choice, report):

* ``"random"``: a random orthonormal basis (what DAS does alone);
* ``"probe"``: the directions of a ridge probe of the variable's value on the site's activations at
  the patched positions (training base words only): the column space of the probe's weights, strongest
  first. A categorical variable (one integer value per unit, at most ONE_HOT_MAX values) is probed
  one-hot; a vector (e.g. majority's counts) or a many-valued quantity as numbers;
* ``"probe (pooled)"``: at every position, where one probe per length and position was the probe start, one
  probe over all positions too, if its direction differs (:func:`pooled_alternative`);
* ``"known direction"``: where the trained side is itself an exact construction that names its
  residual dimensions (a self-diff), an exact label's own dimension.

A start that is not random is also a candidate *unfitted* (zero steps): on hard attention the
gradient can move a right start off the subspace without seeing what it breaks.

A variable's dimension (``variable_dim``) is the rank of its centred (encoded) values on the training
words: a categorical variable of c values needs c - 1 dimensions, a count vector of m classes m (m - 1
within one length). DAS tries k = 1..max_dim and, where the variable needs more, k = its dimension too.
"""

from __future__ import annotations

from typing import Any

import torch

ONE_HOT_MAX = 12  # an integer variable with at most this many values is categorical (probed one-hot)
RIDGE = 1e-6  # ridge strength relative to the largest squared singular value of the activations
RANK_TOL = 1e-8  # relative singular value below which a direction of the values does not count
SAME_DIRECTION = 0.999  # |cos| above which a pooled probe's direction is the grouped probes' own
START_NORM = 10.0  # length of a start direction among the N(0, 1) columns of the free weights

START_KINDS = ("random", "probe", "probe (pooled)", "known direction")


def encode(values: torch.Tensor) -> torch.Tensor:
    """[N, m] values -> [N, m'] numbers a linear probe can target: one column of integers with at
    most ONE_HOT_MAX distinct values becomes one-hot (a categorical variable), anything else stays."""
    values = values.double()
    if values.shape[1] == 1 and torch.equal(values, values.round()):
        kinds, index = torch.unique(values[:, 0], return_inverse=True)
        if 1 < len(kinds) <= ONE_HOT_MAX:
            return torch.nn.functional.one_hot(index, len(kinds)).double()
    return values


def variable_dim(values: torch.Tensor, cap: int) -> int:
    """Rank of the centred encoded values [N, m] (at least 1, at most ``cap``)."""
    if values.shape[0] < 2:
        return 1
    y = encode(values)
    y = y - y.mean(0)
    s = torch.linalg.svdvals(y)
    if not len(s) or float(s[0]) == 0.0:
        return 1
    return max(1, min(cap, int((s > RANK_TOL * s[0]).sum())))


def probe_directions(acts: torch.Tensor, values: torch.Tensor, groups: torch.Tensor | None = None) -> torch.Tensor:
    """[d, r] orthonormal directions of a ridge probe from activations [N, d] to values [N, m] (rows
    aligned), strongest first; r = 0 where nothing varies. ``groups`` [N] (e.g. one per length and
    token position): one probe per group, each centred on its own and scaled to unit norm, and the
    directions of all of them together. A value may be coded with a scale that depends on the position
    (Dyck-1's depth (i + 1) b_i is b_i at position i times i + 1): no single pooled probe is then its
    direction, while every position's probe is."""
    d = acts.shape[1]
    y_all = encode(values)
    keys = [None] if groups is None else torch.unique(groups).tolist()
    weights = []
    for key in keys:
        rows = slice(None) if key is None else groups == key
        w = _ridge(acts[rows].double(), y_all[rows])
        if w is not None:
            weights.append(w / w.norm())
    if not weights:
        return acts.new_zeros(d, 0).double()
    return _column_space(torch.cat(weights, 1))


def _column_space(weights: torch.Tensor) -> torch.Tensor:
    w_u, w_s, _ = torch.linalg.svd(weights, full_matrices=False)
    if not len(w_s) or float(w_s[0]) == 0.0:
        return weights.new_zeros(weights.shape[0], 0)
    return w_u[:, w_s > RANK_TOL * w_s[0]]


def pooled_alternative(acts: torch.Tensor, values: torch.Tensor, grouped: torch.Tensor) -> torch.Tensor | None:
    """Where the start came from one probe per group (``grouped``, :func:`probe_directions`), the directions of
    one probe over all rows, if its strongest direction is not already the grouped one (else None): a second
    probe start. Centred within a group, a probe loses every direction constant there, e.g. a one-hot group's
    sum (induction-recent's prev_a + prev_b + prev_c = 1 after the first symbol): it points at
    e_a - (e_a + e_b + e_c) / 3 (the rotated self-diff's prev_a: 0.81 from it), where the pooled probe finds e_a;
    the grouped one is right where the value's scale depends on the group (Dyck-1's depth)."""
    weights = _ridge(acts.double(), encode(values))
    if weights is None:
        return None
    pooled = _column_space(weights)
    if not pooled.shape[1]:
        return None
    if grouped.shape[1] and float((grouped.T @ pooled[:, 0]).norm()) > SAME_DIRECTION:
        return None
    return pooled


def _ridge(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor | None:
    """[d, m] ridge weights from activations x [N, d] to encoded values y [N, m], both centred here;
    None where fewer than 2 rows, or the activations or values do not vary."""
    if x.shape[0] < 2:
        return None
    x, y = x - x.mean(0), y - y.mean(0)
    u, s, vh = torch.linalg.svd(x, full_matrices=False)
    if not len(s) or float(s[0]) == 0.0 or float(y.abs().max()) == 0.0:
        return None
    shrink = s / (s * s + RIDGE * s[0] ** 2)
    weights = vh.T @ (shrink[:, None] * (u.T @ y))
    return weights if float(weights.norm()) > 0.0 else None


def start_weights(directions: list[torch.Tensor | None], dims: list[int], d: int, generator: torch.Generator,
                  dtype: torch.dtype) -> torch.Tensor:
    """[F, d, kmax] free weights: random N(0, 1) columns, the first columns of fit f replaced by its
    start directions ([d, r] or None: random) scaled to START_NORM (QR keeps them first)."""
    weights = torch.randn(len(dims), d, max(dims), generator=generator, dtype=dtype)
    for f, start in enumerate(directions):
        if start is not None and start.shape[1]:
            r = min(start.shape[1], dims[f])
            weights[f, :, :r] = start[:, :r].to(dtype) * START_NORM
    return weights


def pick_best(scores: list[dict[str, Any]]) -> int:
    """Index of the best candidate by IIA on changed units, then on all units (first wins ties)."""
    def key(item: tuple[int, dict[str, Any]]) -> tuple:
        n, score = item
        changed = score.get("iia_changed")
        return (-(changed if changed is not None else -1.0), -(score.get("iia") or 0.0), n)

    return min(enumerate(scores), key=key)[0]

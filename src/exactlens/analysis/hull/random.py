"""Unselectable random keys, without and with layer norm (the experiment of Brody et al. 2023, Fig. 1c/1d).

For each number of keys n and dimension d, ``trials`` sets of n keys are drawn i.i.d. from the
standard normal distribution N(0, I_d). For each set, the fraction of unselectable keys (keys in
the convex hull of the others, which can never get the strictly highest score q.k; exact check of
:func:`exactlens.analysis.hull.selectable_keys`) is measured on the raw keys and on the same keys
after layer norm without gain and bias, ``layer_norm_geometric`` = sqrt(d) P x / ||P x||.

What to expect. Without LN the fraction grows with n and shrinks with d (n <= d + 1 points in
general position are all vertices of their hull). With LN the keys lie on a sphere of radius
sqrt(d) inside the (d-1)-dimensional hyperplane orthogonal to 1, and distinct points of a sphere
are all extreme points, so the fraction is 0 for every d >= 3 (with probability one). The one
exception is d = 2: the hyperplane is a line and its "sphere" is the two points ±(1, -1), so LN
maps n > 2 keys onto two points, and keys that share a point are duplicates, which can only tie:
almost every key is unselectable there.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from exactlens.analysis.hull.keys import METHODS, layer_norm_geometric, selectable_keys
from exactlens.analysis.hull.request import HullRequest
from exactlens.errors import ExactLensError

DEFAULT_NS = (4, 8, 16, 32, 64, 128)
DEFAULT_DS = (2, 3, 4, 6, 8, 16)


def _positive_ints(values: Sequence[int], name: str, minimum: int) -> list[int]:
    try:
        out = [int(v) for v in values]
    except (TypeError, ValueError) as err:
        raise ExactLensError(f"{name} must be a sequence of integers, got {values!r}") from err
    if not out or min(out) < minimum or any(isinstance(v, bool) or int(v) != v for v in values):
        raise ExactLensError(f"{name} must be a non-empty sequence of integers >= {minimum}, got {list(values)!r}")
    return out


def random_keys(
    ns: Sequence[int] = DEFAULT_NS,
    ds: Sequence[int] = DEFAULT_DS,
    trials: int = 100,
    seed: int = 0,
    tol: float = HullRequest.tol,
    method: str = "fast",
) -> dict[str, Any]:
    """Mean fraction of unselectable standard-normal keys over an (n, d) grid, without and with LN.

    Returns a JSON-ready dict: ``ns``, ``ds``, ``trials``, ``seed``, ``tolerance``, ``method``,
    ``without_ln`` and ``with_ln`` (mean fractions, ``[len(ns)][len(ds)]``: row = n, column = d),
    ``without_ln_std`` and ``with_ln_std`` (standard deviations over trials), ``elapsed_s``.
    Each trial uses the same keys for both panels (LN applied to them), so the panels are paired.
    The default grid (6 x 6, 100 trials, as in Brody et al.) takes about 35 s on one core.
    """
    ns_ = _positive_ints(ns, "ns", 1)
    ds_ = _positive_ints(ds, "ds", 2)  # layer norm of a 1-D vector is undefined (constant)
    if isinstance(trials, bool) or not isinstance(trials, int) or trials < 1:
        raise ExactLensError(f"trials must be an integer >= 1, got {trials!r}")
    if method not in METHODS:
        raise ExactLensError(f"method must be one of {METHODS}, got {method!r}")
    rng = np.random.default_rng(seed)
    start = time.perf_counter()
    raw = np.zeros((len(ns_), len(ds_), trials))
    normed = np.zeros_like(raw)
    for a, n in enumerate(ns_):
        for b, d in enumerate(ds_):
            for t in range(trials):
                keys = rng.standard_normal((n, d))
                raw[a, b, t] = selectable_keys(keys, tol=tol, method=method).fraction_unselectable
                normed[a, b, t] = selectable_keys(
                    layer_norm_geometric(keys), tol=tol, method=method
                ).fraction_unselectable
    return {
        "ns": ns_,
        "ds": ds_,
        "trials": trials,
        "seed": seed,
        "tolerance": float(tol),
        "method": method,
        "without_ln": raw.mean(axis=2).tolist(),
        "with_ln": normed.mean(axis=2).tolist(),
        "without_ln_std": raw.std(axis=2).tolist(),
        "with_ln_std": normed.std(axis=2).tolist(),
        "elapsed_s": time.perf_counter() - start,
    }

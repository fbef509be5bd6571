"""Linear probes and basis alignment for the circuit diff (:mod:`exactlens.analysis.diff`).

A probe predicts one named feature of the exact model (a residual label, e.g. ``k/n``) from the
activations at one hook site of the trained model, by ridge regression.
The ridge strength is chosen on the training rows by generalized cross-validation (GCV, Golub,
Heath & Wahba 1979: GCV(a) = N |(I - H_a) y|^2 / (N - tr H_a)^2, closed form from one SVD), and the
score is the R^2 on held-out *sequences* (all positions of a sequence fall on the same side of the
split, so a probe cannot memorize a sequence).

Inputs are centred and divided by one overall scale, which keeps every probe equivariant under
rotations of the trained residual basis. The same regression with matrix targets gives the maps
that align the two residual bases for the weight comparison (:mod:`exactlens.analysis.diff.weights`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from exactlens.analysis.diff.runs import LengthRun, Side, degenerate_rows, later_scale, pool, pooled

ALPHAS = (1e-10, 1e-8, 1e-6, 1e-4, 1e-3, 1e-2, 1e-1, 1.0, 10.0)
"""Ridge strengths tried, relative to the number of training rows (inputs are centred and divided
by their overall RMS, so X^T X / N has mean eigenvalue 1 and the relative strength is scale-free)."""

CONSTANT_TOLERANCE = 1e-9
"""A target whose standard deviation is below this (times max(1, |mean|)) is constant: no R^2."""


@dataclass
class LinearMap:
    """y ~ x @ weight + bias, in the raw (unstandardized) coordinates of x."""

    weight: np.ndarray  # [d_in, d_out]
    bias: np.ndarray  # [d_out]
    alpha: float  # the chosen relative ridge strength

    def __call__(self, x: np.ndarray) -> np.ndarray:
        return x @ self.weight + self.bias

    def augmented(self) -> np.ndarray:
        """[[weight, 0], [bias, 1]]: the same affine map on rows [x, 1] -> [y, 1]."""
        d_in, d_out = self.weight.shape
        out = np.zeros((d_in + 1, d_out + 1))
        out[:d_in, :d_out] = self.weight
        out[d_in, :d_out] = self.bias
        out[d_in, d_out] = 1.0
        return out


def _standardize(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, float]:
    """Centre every column and divide by ONE overall scale (the RMS of the centred entries).

    A single scale (not one per column) keeps ridge rotation-equivariant: for x' = x R with R
    orthogonal the fitted weights are R^T w, so probes, directions and scores do not depend on
    the basis of the trained residual stream."""
    mean = x.mean(0)
    centred = x - mean
    scale = float(np.sqrt((centred**2).mean())) if centred.size else 0.0
    scale = scale if scale > 1e-300 else 1.0
    return centred / scale, mean, scale


def fit_ridge(x: np.ndarray, y: np.ndarray, alphas: tuple[float, ...] = ALPHAS) -> LinearMap:
    """Ridge regression of y [N, k] (or [N]) on x [N, d], the strength chosen by GCV (summed over outputs)."""
    return RidgeDesign.of(x).fit(y, alphas)


@dataclass
class RidgeDesign:
    """The inputs x [N, d] of ridge regressions, standardized and decomposed once: every target fitted on
    the same x (the features probed at one site) reuses its d x d eigendecomposition."""

    xs: np.ndarray  # x centred and scaled (:func:`_standardize`)
    x_mean: np.ndarray
    x_scale: float
    s: np.ndarray  # singular values of xs (directions with s^2 below rel_tol * max s^2 dropped)
    vt: np.ndarray  # the matching right singular vectors, as rows

    @classmethod
    def of(cls, x: np.ndarray, rel_tol: float = 1e-12) -> RidgeDesign:
        """From the d x d Gram matrix (N >> d: O(N d^2) instead of an N x d SVD)."""
        xs, x_mean, x_scale = _standardize(x)
        evals, evecs = np.linalg.eigh(xs.T @ xs)
        keep = evals > rel_tol * max(float(evals.max(initial=0.0)), 1e-300)
        return cls(xs, x_mean, x_scale, np.sqrt(evals[keep]), evecs[:, keep].T)

    def fit(self, y: np.ndarray, alphas: tuple[float, ...] = ALPHAS) -> LinearMap:
        y2 = y.reshape(len(y), -1)
        y_mean = y2.mean(0)
        yc = y2 - y_mean
        n, s, vt = self.xs.shape[0], self.s, self.vt
        uty = (vt @ (self.xs.T @ yc)) / s[:, None]  # U^T y
        resid_outside = float((yc**2).sum() - (uty**2).sum())  # part of y outside the column space of xs
        best = None
        for rel in alphas:
            a = rel * n
            shrink = s**2 / (s**2 + a)  # eigenvalues of the hat matrix
            rss = float((((1 - shrink)[:, None] * uty) ** 2).sum()) + max(resid_outside, 0.0)
            dof = n - float(shrink.sum())
            gcv = n * rss / max(dof, 1e-12) ** 2
            if best is None or gcv < best[0]:
                best = (gcv, rel)
        rel = best[1]
        coef_std = vt.T @ ((s / (s**2 + rel * n))[:, None] * uty)  # [d, k]
        weight = coef_std / self.x_scale
        bias = y_mean - self.x_mean @ weight
        return LinearMap(weight, bias, rel)


def r2_score(y_true: np.ndarray, y_pred: np.ndarray) -> float:
    """1 - SSE / SST with the held-out mean (can be negative: worse than predicting the mean)."""
    sst = float(((y_true - y_true.mean()) ** 2).sum())
    sse = float(((y_true - y_pred) ** 2).sum())
    return 1.0 - sse / sst if sst > 0 else float("nan")


def is_constant(y: np.ndarray) -> bool:
    return float(y.std()) <= CONSTANT_TOLERANCE * max(1.0, float(np.abs(y.mean())))


def split_sequences(n_sequences: int, test_fraction: float, rng: np.random.Generator) -> np.ndarray:
    """Bool [n_sequences]: True for held-out sequences (at least one on each side)."""
    order = rng.permutation(n_sequences)
    n_test = min(max(1, int(round(test_fraction * n_sequences))), n_sequences - 1)
    test = np.zeros(n_sequences, dtype=bool)
    test[order[:n_test]] = True
    return test


@dataclass
class ProbeResult:
    r2: float | None  # held-out R^2 (None: constant target)
    map: LinearMap  # refit on every row, for interventions and alignment


def probe(x: np.ndarray, y: np.ndarray, test_rows: np.ndarray,
          designs: dict[str, RidgeDesign] | None = None) -> ProbeResult:
    """Held-out R^2 of a ridge probe y ~ x; ``test_rows`` [N] bool. Constant targets get r2=None.
    ``designs``: a cache for probes of other targets on the same x and split ("all" and "train" rows)."""
    designs = {} if designs is None else designs
    if "all" not in designs:
        designs["all"] = RidgeDesign.of(x)
    full = designs["all"].fit(y)
    if is_constant(y[~test_rows]) or is_constant(y[test_rows]):
        return ProbeResult(None, full)
    if "train" not in designs:
        designs["train"] = RidgeDesign.of(x[~test_rows])
    fitted = designs["train"].fit(y[~test_rows])
    pred = fitted(x[test_rows]).reshape(-1)
    return ProbeResult(r2_score(y[test_rows], pred), full)


def feature_direction(linear_map: LinearMap) -> np.ndarray:
    """The unit vector u of activation space along which a 1-d probe reads its feature (w / |w|)."""
    w = linear_map.weight.reshape(-1)
    norm = float(np.linalg.norm(w))
    return w / norm if norm > 0 else w


def row_space_projector(x: np.ndarray, center: bool = False, rel_tol: float = 1e-11) -> np.ndarray:
    """Orthogonal projector [d, d] onto the span of the rows of x (centered first if asked)."""
    if center:
        x = x - x.mean(0)
    evals, evecs = np.linalg.eigh(x.T @ x)
    top = float(evals.max(initial=0.0))
    if top <= 0:
        return np.zeros((x.shape[1], x.shape[1]))
    basis = evecs[:, evals > rel_tol * top]  # rel_tol on squared singular values
    return basis @ basis.T


# ----------------------------------------------------------------------------- the probe table

SETTLE_TOLERANCE = 1e-6  # a label is settled at a site when it equals its final value to this (relative)
BEST_TOLERANCE = 0.005
"""best_site: the earliest site whose held-out R^2 is within this of the highest (where the trained
model has computed the feature, not where rounding happens to favour)."""


def feature_scopes(exact_model: Any, labels: list[str]) -> list[str]:
    """'readout' for labels only the unembedding reads (e.g. the logit s), else 'all'."""
    w_u = exact_model.W_U.detach().double().abs().sum(-1).cpu().numpy()
    readers = np.zeros(len(labels))
    for block in exact_model.blocks:
        a = block.attn
        readers += (a.W_Q.detach().double().abs().sum((0, 2)).cpu().numpy()
                    + a.W_K.detach().double().abs().sum((0, 2)).cpu().numpy())
        readers += a.W_V.detach().double().abs().sum((0, 2)).cpu().numpy()
        if block.mlp is not None:
            readers += block.mlp.W_in.detach().double().abs().sum(1).cpu().numpy()
    return ["readout" if w_u[i] > 0 and readers[i] == 0 else "all" for i in range(len(labels))]


def reference_site(held: dict[str, np.ndarray], sites: list[str]) -> str:
    """The site whose value of a label is the one it is probed and settled against (``held``: the label's
    values at each site): the last site where it is not zero on every row. That is the final site, unless a
    later component cancels the label (Chiang & Cholak Prop. 2's confidence layer clears the whole stream
    but s): then its value just before."""
    scale = max((float(np.abs(v).max()) for v in held.values() if v.size and np.isfinite(v).all()), default=0.0)
    for site in reversed(sites):
        v = held[site]
        if v.size and np.isfinite(v).all() and np.abs(v).max() > SETTLE_TOLERANCE * (1 + scale):
            return site
    return sites[-1]


def component_reads(exact_model: Any, site: str) -> np.ndarray | None:
    """[d] per residual dimension, whether the component that writes ``site`` reads it (the attention of
    the layer for ``hook_resid_mid``: W_Q, W_K, W_V; its FFN for ``hook_resid_post``: W_in); None for
    another site or a layer without that component."""
    parts = site.split(".")
    if len(parts) != 3 or not parts[1].isdigit() or not hasattr(exact_model, "blocks"):
        return None
    block = exact_model.blocks[int(parts[1])]
    if parts[2] == "hook_resid_mid":
        a = block.attn
        return ((a.W_Q.detach().double().abs().sum((0, 2)) + a.W_K.detach().double().abs().sum((0, 2))
                 + a.W_V.detach().double().abs().sum((0, 2))) > 0).cpu().numpy()
    if parts[2] == "hook_resid_post" and block.mlp is not None:
        return (block.mlp.W_in.detach().double().abs().sum(1) > 0).cpu().numpy()
    return None


def before_overwrite(held: dict[str, np.ndarray], sites: list[str], reference: str, reads: list[np.ndarray | None],
                     index: int) -> str:
    """The site whose value of a label counts when a component reads the label and then changes it (tracr's
    selector width: the FFN reads ``hist_2_selector_width_attn_output`` and clears it at BOS, so the value it
    read exists only at ``hook_resid_mid``): the site before the first such component, where the label is not
    zero; else ``reference``. A value that a later component reads again is no overwrite: Shin & Matzinger's
    solution 1 adds the previous category into the category coordinates with attention, and its FFN reads the
    sum (the pair), so the label counts as the sum, where ``reference`` holds it. ``held``: the label's values
    per site on one scale; ``reads[j]``: which dimensions the component writing ``sites[j]`` reads
    (:func:`component_reads`)."""
    scale = max((float(np.abs(v[np.isfinite(v)]).max(initial=0.0)) for v in held.values()), default=0.0)
    tolerance = SETTLE_TOLERANCE * (1 + scale)
    for j in range(1, sites.index(reference) + 1):
        before, after, read = held[sites[j - 1]], held[sites[j]], reads[j]
        if read is None or not read[index]:
            continue
        finite = np.isfinite(before) & np.isfinite(after)
        if np.abs(before[finite]).max(initial=0.0) > tolerance and \
                np.abs(after[finite] - before[finite]).max(initial=0.0) > tolerance and \
                not any(later is not None and later[index] for later in reads[j + 1:]):
            return sites[j - 1]
    return reference


def earliest_best(r2: dict[str, float | None], order: list[str]) -> tuple[str | None, float | None]:
    scored = {k: v for k, v in r2.items() if v is not None}
    if not scored:
        return None, None
    top = max(scored.values())
    site = next(k for k in order if k in scored and scored[k] >= top - BEST_TOLERANCE)
    return site, scored[site]


def probe_table(
    runs: list[LengthRun],
    trained: Side,
    exact: Side,
    labels: list[str],
    scopes: list[str],
    test_fraction: float,
    seed: int,
) -> tuple[dict[str, Any], dict[tuple[str, str], Any]]:
    """The ``probes`` part of the JSON and the fitted probe maps {(label, site): LinearMap}."""
    rows = pool(runs, exact)
    n_seq = int(rows.sequence.max()) + 1
    test_seq = split_sequences(n_seq, test_fraction, np.random.default_rng(seed))
    test_rows = test_seq[rows.sequence]
    exact_pooled = {site: pooled(runs, site, "exact") for site in exact.sites}
    trained_pooled = {site: pooled(runs, site, "trained") for site in trained.sites}
    # Positions where some activation is not finite (e.g. layer norm with eps = 0 of a zero vector,
    # at a position the readout never reads) cannot be probed: they are left out and counted.
    finite = np.ones(len(rows.sequence), dtype=bool)
    for acts in (*exact_pooled.values(), *trained_pooled.values()):
        finite &= np.isfinite(acts).all(1)
    # rows where a site holds normalized rounding noise do not decide which site a label is settled against
    degenerate = {site: degenerate_rows(runs, exact, site) for site in exact.sites}
    # post-LN rescales the whole stream at every norm: a label has settled where its value, divided by the
    # scales of the norms still to come, is its final value
    with np.errstate(divide="ignore", invalid="ignore"):
        rescale = {site: later_scale(runs, exact, site) for site in exact.sites}
    reads = [component_reads(exact.model, site) for site in exact.sites]
    features, maps = [], {}
    designs: dict[tuple[str, str], dict[str, RidgeDesign]] = {}  # (site, positions): the same x for every label
    for i, label in enumerate(labels):
        mask = (rows.is_readout if scopes[i] == "readout" else np.ones(len(rows.sequence), dtype=bool)) & finite
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            held = {site: exact_pooled[site][mask, i] / rescale[site][mask] for site in exact.sites}
            reference = reference_site({site: exact_pooled[site][mask, i][~degenerate[site][mask]]
                                        for site in exact.sites}, exact.sites)
            # the values as the reference site holds them (scaled by the norms between a site and it only)
            held = {site: v * rescale[reference][mask] for site, v in held.items()}
            # a component that reads the label and then changes it: the value it read is the label's
            read_at = before_overwrite({site: np.where(degenerate[site][mask], np.nan, v) for site, v in held.items()},
                                       exact.sites, reference, reads, i)
            overwritten = read_at != reference
            if overwritten:
                held = {site: v / rescale[reference][mask] * rescale[read_at][mask] for site, v in held.items()}
                reference = read_at
        y = exact_pooled[reference][mask, i]
        tolerance = SETTLE_TOLERANCE * (1 + (np.abs(y).max() if y.size else 0.0))
        settled = next(site for site in exact.sites[:exact.sites.index(reference) + 1]
                       if np.all(np.abs(held[site] - y) <= tolerance))
        entry: dict[str, Any] = {
            "label": label,
            "index": i,
            "positions": scopes[i],
            "exact_site": settled,
            "constant": bool(is_constant(y)),
            "overwritten": bool(overwritten),  # settled where its reader reads it, before that reader changes it
            "r2": {},
        }
        for site in trained.sites:
            result = probe(trained_pooled[site][mask], y, test_rows[mask],
                           designs.setdefault((site, scopes[i]), {}))
            entry["r2"][site] = result.r2
            maps[(label, site)] = result.map
        entry["best_site"], entry["best_r2"] = earliest_best(entry["r2"], trained.sites)
        residual = {k: v for k, v in entry["r2"].items() if k in trained.patch_sites}
        entry["best_residual_site"], entry["best_residual_r2"] = earliest_best(residual, trained.sites)
        features.append(entry)
    out = {
        "sites": list(trained.sites),
        "exact_sites": list(exact.sites),
        "test_fraction": test_fraction,
        "rows": int(len(rows.sequence)),
        "nonfinite_rows": int((~finite).sum()),
        "sequences": n_seq,
        "held_out_sequences": int(test_seq.sum()),
        "features": features,
    }
    return out, maps

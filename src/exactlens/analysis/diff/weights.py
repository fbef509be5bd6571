"""Weight part of the circuit diff: QK and OV circuits of matched heads in one residual basis.

The exact model's residual dimensions are named; the trained model's are not. For a matched pair
(trained layer lt, head ht) ~ (exact layer le, head he) we fit, on the words of the diff, the affine
map A that best predicts the trained attention input from the exact one (ridge, rows [y, 1] ->
[x, 1]), and the linear map B from the trained residual after attention to the exact one
(``hook_resid_mid``). In augmented coordinates ([x, 1], so that biases are part of the matrices):

    QK_e = [W_Q; b_Q] [W_K; b_K]^T / divisor                       (exact, label basis)
    QK_t->e = A [W_Q; b_Q]_t [W_K; b_K]_t^T A^T / divisor_t         (trained, read in the label basis)
    OV_e = [W_V; b_V] W_O,     OV_t->e = A [W_V; b_V]_t W_O,t B

Both sides are then restricted to what the words can show: the query/value side to the span of
the exact inputs [y, 1], the key side to the span of the *centred* inputs (a score term that does
not depend on the key cancels in the softmax), the OV output side to the span of the centred exact
``hook_resid_mid``. Scores: the cosine similarity of the two matrices (Frobenius inner product; 1 =
same circuit up to a positive scale) and the relative error |M_t - M_e| / |M_e|. The log-n factor
of eq. 2 is not part of the matrices (``length_scale`` records it). Singular values: of the raw
circuits (TransformerLens ``FactoredMatrix``, each in its own basis) and of the aligned ones.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from transformer_lens import FactoredMatrix

from exactlens.analysis.diff.probes import fit_ridge, row_space_projector
from exactlens.analysis.diff.runs import pooled

TOP_SINGULAR_VALUES = 8
ZERO_NORM = 1e-9


def _stacked(model: Any, name: str, n_layers: int) -> np.ndarray | None:
    value = getattr(model, name, None)
    if isinstance(value, torch.Tensor) and value.shape[0] == n_layers:
        return value.detach().double().cpu().numpy()
    try:
        return np.stack(
            [getattr(model.blocks[layer].attn, name).detach().double().cpu().numpy() for layer in range(n_layers)]
        )
    except (AttributeError, TypeError, IndexError):
        return None


def head_weights(model: Any, n_layers: int) -> dict[str, np.ndarray]:
    out = {}
    for name in ("W_Q", "W_K", "W_V", "W_O", "b_Q", "b_K", "b_V"):
        value = _stacked(model, name, n_layers)
        if value is None and name.startswith("b_"):
            w = out["W" + name[1:]]
            value = np.zeros((w.shape[0], w.shape[1], w.shape[3]))
        if value is None:
            raise ValueError(f"{type(model).__name__} has no {name}")
        out[name] = value
    return out


def _divisor(model: Any) -> float:
    cfg = model.cfg
    if hasattr(cfg, "scale_divisor"):
        return float(cfg.scale_divisor)
    scale = getattr(cfg, "attn_scale", None)
    return float(scale) if scale else float(np.sqrt(cfg.d_head))


def _length_scale(model: Any, layer: int) -> str:
    cfg = model.cfg
    if hasattr(cfg, "per_layer"):
        return cfg.per_layer("attn_length_scale")[layer]
    return str(getattr(cfg, "attn_length_scale", "none"))


def _aug(x: np.ndarray) -> np.ndarray:
    return np.hstack([x, np.ones((x.shape[0], 1))])


def _attention_input(runs: list, side: Any, layer: int, which: str) -> np.ndarray:
    """What the layer's attention reads: the residual stream, or (pre-LN layers) LN's output."""
    if side.norms[layer] != "pre":
        return pooled(runs, f"blocks.{layer}.hook_resid_pre", which)
    normed = pooled(runs, f"blocks.{layer}.ln1.hook_normalized", which)
    ln = getattr(side.model.blocks[layer], "ln1", None)
    w, b = getattr(ln, "w", None), getattr(ln, "b", None)
    if isinstance(w, torch.Tensor) and isinstance(b, torch.Tensor):
        return normed * w.detach().double().cpu().numpy() + b.detach().double().cpu().numpy()
    return normed


def _compare(trained: np.ndarray, exact: np.ndarray) -> dict[str, Any]:
    nt, ne = float(np.linalg.norm(trained)), float(np.linalg.norm(exact))
    cos = float((trained * exact).sum() / (nt * ne)) if nt > ZERO_NORM and ne > ZERO_NORM else None
    rel = float(np.linalg.norm(trained - exact) / ne) if ne > ZERO_NORM else None
    return {"cosine": cos, "relative_error": rel, "norm_trained": nt, "norm_exact": ne}


def _top(values: Any) -> list[float]:
    v = np.asarray(values, dtype=np.float64).reshape(-1)
    return [float(x) for x in np.sort(v)[::-1][:TOP_SINGULAR_VALUES]]


def _raw_spectra(w: dict[str, np.ndarray], layer: int, head: int) -> tuple[list[float], list[float]]:
    qk = FactoredMatrix(torch.from_numpy(w["W_Q"][layer, head]), torch.from_numpy(w["W_K"][layer, head]).T)
    ov = FactoredMatrix(torch.from_numpy(w["W_V"][layer, head]), torch.from_numpy(w["W_O"][layer, head]))
    return _top(qk.S), _top(ov.S)


def weights_table(runs: list, trained: Any, exact: Any, matching: list[dict[str, Any]]) -> dict[str, Any]:
    """The ``weights`` part of the diff JSON: one entry per matched head pair."""
    tw = head_weights(trained.model, trained.n_layers)
    ew = head_weights(exact.model, exact.n_layers)
    t_div, e_div = _divisor(trained.model), _divisor(exact.model)
    cache: dict[tuple[int, int], tuple] = {}
    pairs = []
    for m in matching:
        lt, ht, le, he = m["trained_layer"], m["trained_head"], m["exact_layer"], m["exact_head"]
        if (lt, le) not in cache:
            x_in = _attention_input(runs, trained, lt, "trained")
            y_in = _attention_input(runs, exact, le, "exact")
            a = fit_ridge(y_in, x_in).augmented()  # [d_e + 1, d_t + 1]
            x_mid = _pooled_mid(runs, lt, "trained")
            y_mid = _pooled_mid(runs, le, "exact")
            b = fit_ridge(x_mid, y_mid).weight  # [d_t, d_e]
            p_q = row_space_projector(_aug(y_in))
            p_k = row_space_projector(_aug(y_in), center=True)
            p_out = row_space_projector(y_mid, center=True)
            cache[(lt, le)] = (a, b, p_q, p_k, p_out)
        a, b, p_q, p_k, p_out = cache[(lt, le)]

        def qk(w: dict[str, np.ndarray], layer: int, head: int, div: float) -> np.ndarray:
            q = np.vstack([w["W_Q"][layer, head], w["b_Q"][layer, head][None]])
            k = np.vstack([w["W_K"][layer, head], w["b_K"][layer, head][None]])
            return q @ k.T / div

        def ov(w: dict[str, np.ndarray], layer: int, head: int) -> np.ndarray:
            v = np.vstack([w["W_V"][layer, head], w["b_V"][layer, head][None]])
            return v @ w["W_O"][layer, head]

        qk_e = p_q @ qk(ew, le, he, e_div) @ p_k
        qk_t = p_q @ a @ qk(tw, lt, ht, t_div) @ a.T @ p_k
        ov_e = p_q @ ov(ew, le, he) @ p_out
        ov_t = p_q @ a @ ov(tw, lt, ht) @ b @ p_out
        qk_cmp, ov_cmp = _compare(qk_t, qk_e), _compare(ov_t, ov_e)
        t_qk_s, t_ov_s = _raw_spectra(tw, lt, ht)
        e_qk_s, e_ov_s = _raw_spectra(ew, le, he)
        pairs.append(
            {
                "trained_layer": lt,
                "trained_head": ht,
                "exact_layer": le,
                "exact_head": he,
                "qk_cosine": qk_cmp["cosine"],
                "qk_relative_error": qk_cmp["relative_error"],
                "qk_norm_trained": qk_cmp["norm_trained"],
                "qk_norm_exact": qk_cmp["norm_exact"],
                "ov_cosine": ov_cmp["cosine"],
                "ov_relative_error": ov_cmp["relative_error"],
                "ov_norm_trained": ov_cmp["norm_trained"],
                "ov_norm_exact": ov_cmp["norm_exact"],
                "length_scale": {"trained": _length_scale(trained.model, lt), "exact": _length_scale(exact.model, le)},
                "qk_singular_values": {
                    "trained": t_qk_s,
                    "exact": e_qk_s,
                    "trained_aligned": _top(np.linalg.svd(qk_t, compute_uv=False)),
                    "exact_aligned": _top(np.linalg.svd(qk_e, compute_uv=False)),
                },
                "ov_singular_values": {
                    "trained": t_ov_s,
                    "exact": e_ov_s,
                    "trained_aligned": _top(np.linalg.svd(ov_t, compute_uv=False)),
                    "exact_aligned": _top(np.linalg.svd(ov_e, compute_uv=False)),
                },
                # the aligned exact-basis matrices, rows/columns = residual labels + "1" (bias)
                "qk_trained_in_exact_basis": qk_t.tolist(),
                "qk_exact": qk_e.tolist(),
            }
        )
    return {
        "method": "aligned with ridge maps fitted on the diff's words (see exactlens.analysis.diff.weights)",
        "pairs": pairs,
    }


def _pooled_mid(runs: list, layer: int, which: str) -> np.ndarray:
    return pooled(runs, f"blocks.{layer}.hook_resid_mid", which)

"""Error analysis (Transformer Cookbook §7.2, Propositions 7.1-7.5) as bounds computed from a
model's weights.

Norm: the cookbook allows the infinity norm "for simplicity"; here every bound is in it, per
position: ||x|| = max_c |x_c| for one position's vector, and a perturbation of size eps moves
every position by at most eps. For a row-vector map x -> x @ W the operator norm is
||W|| = max_c sum_r |W[r, c]|. Bounds are derived here (the displays were lost in our copy)
and checked in the tests on worst-case and adversarial (gradient-sign) inputs.

Prop 7.1, bounded activations: ``activation_boxes(model, max_length)`` propagates a box
(lo <= x <= hi per component) through the model: tokens x positions (every i < n <= N),
attention output = a convex combination of values (weights sum to 1, or 0 for a query that
sees no key), FFNs by interval arithmetic, and a layer norm bounds its output whatever its
input (|LN(x)_c| <= sqrt(d - 1) |w_c| + |b_c| centered, sqrt(d) |w_c| + |b_c| uncentered),
even with eps = 0. Bounded positional features give boxes that do not grow with N.

Prop 7.2, FFN: ||f(x) - f(x')|| <= L max_c sum_u |W_out[u, c]| sum_r |W_in[r, u]| eps,
L = max |act'| (ReLU 1, GELU Phi(sqrt 2) + sqrt 2 phi(sqrt 2) = 1.1289). Attained when every
unit is active and the signs align (tested).

Prop 7.3, softmax attention, with x (and q) in box X and keys of the perturbed input in X
widened by eps: |s' - s| <= eps S, S = alpha sum_d (a^Q_d K'_d + Q_d a^K_d) (a = column abs
sums, K', Q = box radii of k, q, alpha = score factor); the softmax Jacobian gives
||w' - w||_1 <= (max - min of s' - s) / 2 <= eps S (mean absolute deviation of a variable in
[a, b] is <= (b - a)/2); values u = x W_V W_O + b_V W_O, and since w' - w sums to 0,
|o'_c - o_c| <= eps (sum_r |M[r, c]| + S R_c), R_c = half the width of u_c's box. Summed over
heads, max over c. Hard attention has no such constant (it jumps; tested).

Prop 7.4, residual: (x + f(x)) - (x' + f'(x')) <= eps_1 + eps_2 (triangle inequality).

Prop 7.5, layer norm with eps > 0: J = (w/r)(I - c c^T/(d r^2)) P, r^2 = |c|^2/d + eps,
so ||J|| <= max|w| k / sqrt(eps) with k = min(sqrt d, 2(d-1)/d + 2 sqrt(d) / 3^1.5) centered
(the first from ||J||_2 = 1/r, the second row by row; s/(s + eps)^1.5 <= 2 / (3^1.5 sqrt eps)),
and with 1 in place of 2(d-1)/d uncentered; 2(d-1)/d max|w| for centering only. With
eps = 0 there is no constant (§6.4 amplifies exactly that).

``perturbation_bounds(model, eps, max_length)`` chains them layer by layer.
"""

from __future__ import annotations

import math

import torch

from exactlens.errors import ExactLensError
from exactlens.model.positional import evaluate_features

F64 = torch.float64
Box = tuple[torch.Tensor, torch.Tensor]

GELU_LIPSCHITZ = 0.5 * (1.0 + math.erf(1.0)) + math.sqrt(2.0) * math.exp(-1.0) / math.sqrt(2.0 * math.pi)
"""max |GELU'(x)| = GELU'(sqrt 2) = Phi(sqrt 2) + sqrt 2 phi(sqrt 2) (GELU'' = phi (2 - x^2))."""

ACTIVATION_LIPSCHITZ = {"relu": 1.0, "identity": 1.0, "gelu": GELU_LIPSCHITZ}

STRICT_MASKS = ("strict_causal", "strict_past")
"""Masks under which a query may see no key (its attention output is then 0)."""


def _gelu_argmin() -> float:
    """The minimum of GELU: Phi(x) + x phi(x) = 0 at x ~ -0.7518 (bisection)."""
    lo, hi = -2.0, 0.0
    for _ in range(200):
        mid = (lo + hi) / 2
        slope = 0.5 * (1 + math.erf(mid / math.sqrt(2))) + mid * math.exp(-mid * mid / 2) / math.sqrt(2 * math.pi)
        lo, hi = (mid, hi) if slope < 0 else (lo, mid)
    return (lo + hi) / 2


GELU_ARGMIN = _gelu_argmin()


def op_norm(W: torch.Tensor) -> float:
    """||x @ W||_inf <= op_norm(W) ||x||_inf: the largest column sum of |W|."""
    return float(W.to(F64).abs().sum(0).max()) if W.numel() else 0.0


# ----------------------------------------------------------------------------- boxes


def affine_box(box: Box, W: torch.Tensor, b: torch.Tensor | float = 0.0) -> Box:
    """The tightest box holding x @ W + b for every x in the box (interval arithmetic)."""
    lo, hi = box
    W = W.to(F64)
    center, radius = (lo + hi) / 2 @ W + torch.as_tensor(b, dtype=F64), (hi - lo) / 2 @ W.abs()
    return center - radius, center + radius


def _add(a: Box, b: Box) -> Box:
    return a[0] + b[0], a[1] + b[1]


def _hull_zero(box: Box) -> Box:
    return box[0].clamp(max=0.0), box[1].clamp(min=0.0)


def widen(box: Box, eps: float) -> Box:
    return box[0] - eps, box[1] + eps


def radius(box: Box) -> torch.Tensor:
    """max |x_c| over the box, per component."""
    return torch.maximum(box[0].abs(), box[1].abs())


def _positional_box(model, max_length: int) -> Box:
    cfg = model.cfg
    d = cfg.d_model
    if cfg.learned_positions:
        if max_length > cfg.n_ctx:
            raise ExactLensError(f"max_length={max_length} exceeds the learned positional table (n_ctx={cfg.n_ctx})")
        rows = model.pos_embed.W_pos[:max_length].detach().to(F64)
        return rows.min(0).values, rows.max(0).values
    names = cfg.positional_features
    if not names:
        return torch.zeros(d, dtype=F64), torch.zeros(d, dtype=F64)
    W = model.pos_embed.W_feat.detach().to(F64)
    lo = torch.full((d,), math.inf, dtype=F64)
    hi = torch.full((d,), -math.inf, dtype=F64)
    for start in range(1, max_length + 1, 256):  # sequences of n = start .. start + 255 positions
        n = torch.arange(start, min(start + 256, max_length + 1))
        feats = evaluate_features(names, int(n.max()), n, F64) @ W  # [len(n), pos, d]
        real = (torch.arange(feats.shape[1]).unsqueeze(0) < n.unsqueeze(1)).unsqueeze(-1)
        lo = torch.minimum(lo, torch.where(real, feats, math.inf).amin((0, 1)))
        hi = torch.maximum(hi, torch.where(real, feats, -math.inf).amax((0, 1)))
    return lo, hi


def input_box(model, max_length: int) -> Box:
    """Every token embedding plus every positional encoding (i < n <= max_length): exact per
    component (the token and the position vary independently)."""
    _check_length(max_length)
    W_E = model.embed.W_E.detach().to(F64)
    return _add((W_E.min(0).values, W_E.max(0).values), _positional_box(model, max_length))


def layer_norm_box(ln, box: Box) -> Box:
    """Prop 7.1's point: a scaling LN bounds its output whatever the input box."""
    d = ln.w.shape[0]
    w, b = ln.w.detach().to(F64), ln.b.detach().to(F64)
    if hasattr(ln, "W_select"):
        box = affine_box(box, ln.W_select.detach())
    if not ln.scale:  # centering only: interval arithmetic through (I - 11^T/d) diag(w)
        P = torch.eye(d, dtype=F64) - 1.0 / d if ln.center else torch.eye(d, dtype=F64)
        return affine_box(box, P * w, b)
    largest = math.sqrt(d - 1) if ln.center else math.sqrt(d)
    return b - w.abs() * largest, b + w.abs() * largest


def _attention_box(attn, box: Box) -> Box:
    if attn.weighting == "none":
        raise ExactLensError(
            f"layer {attn.layer}: attention weighting 'none' (scores used as weights) is no convex combination; "
            "activation bounds need softmax, average-hard or unique-hard weights"
        )
    total = (attn.b_O.detach().to(F64), attn.b_O.detach().to(F64))
    for h in range(attn.W_V.shape[0]):
        M = attn.W_V[h].detach().to(F64) @ attn.W_O[h].detach().to(F64)
        beta = attn.b_V[h].detach().to(F64) @ attn.W_O[h].detach().to(F64)
        values = affine_box(box, M, beta)
        total = _add(total, _hull_zero(values) if attn.mask in STRICT_MASKS else values)
    return total


def _activation_box(kind: str, box: Box) -> Box:
    lo, hi = box
    if kind == "relu":
        return lo.clamp(min=0.0), hi.clamp(min=0.0)
    if kind == "gelu":  # decreasing left of GELU_ARGMIN, increasing right of it
        gelu = torch.nn.functional.gelu
        return gelu(torch.minimum(torch.maximum(lo, torch.full_like(lo, GELU_ARGMIN)), hi)), torch.maximum(
            gelu(lo), gelu(hi)
        )
    return box


def _mlp_box(mlp, kind: str, box: Box) -> Box:
    pre = affine_box(box, mlp.W_in.detach(), mlp.b_in.detach().to(F64))
    return affine_box(_activation_box(kind, pre), mlp.W_out.detach(), mlp.b_out.detach().to(F64))


def activation_boxes(model, max_length: int, start: Box | None = None) -> dict[str, Box]:
    """Prop 7.1: {hook name: (lo, hi)} with every activation there inside the box, for every
    input of at most max_length positions (any tokens). Hooks: blocks.l.hook_resid_pre,
    hook_attn_out, hook_resid_mid, hook_mlp_out, hook_resid_post, and "logits". ``start``:
    a box for the embeddings (token + position) instead of ``input_box(model, max_length)``."""
    cfg = model.cfg
    x = input_box(model, max_length) if start is None else (start[0].to(F64), start[1].to(F64))
    out: dict[str, Box] = {}
    for layer, block in enumerate(model.blocks):
        name = f"blocks.{layer}"
        out[f"{name}.hook_resid_pre"] = x
        attn = _attention_box(block.attn, layer_norm_box(block.ln1, x) if block.norm == "pre" else x)
        out[f"{name}.hook_attn_out"] = attn
        mid = _add(x, attn)
        mid = layer_norm_box(block.ln1, mid) if block.norm == "post" else mid
        out[f"{name}.hook_resid_mid"] = mid
        if block.mlp is None:
            x = mid
        else:
            kind = cfg.per_layer("act_fn")[layer]
            f = _mlp_box(block.mlp, kind, layer_norm_box(block.ln2, mid) if block.norm == "pre" else mid)
            out[f"{name}.hook_mlp_out"] = f
            if not block.mlp_residual:
                x = f
            else:
                x = _add(mid, f)
                x = layer_norm_box(block.ln2, x) if block.norm == "post" else x
        out[f"{name}.hook_resid_post"] = x
    if cfg.final_ln:
        x = layer_norm_box(model.ln_final, x)
    out["logits"] = affine_box(x, model.unembed.W_U.detach(), model.unembed.b_U.detach().to(F64))
    return out


# ----------------------------------------------------------------------------- Lipschitz constants


def ffn_lipschitz(W_in: torch.Tensor, W_out: torch.Tensor, activation: str = "relu") -> float:
    """Prop 7.2: C with ||f(x) - f(x')|| <= C ||x - x'|| (infinity norm) for
    f(x) = act(x W_in + b_in) W_out + b_out."""
    if activation not in ACTIVATION_LIPSCHITZ:
        raise ExactLensError(f"activation must be one of {', '.join(ACTIVATION_LIPSCHITZ)}, got {activation!r}")
    spread = W_in.detach().to(F64).abs().sum(0)  # |pre_u' - pre_u| <= eps * spread_u
    if not spread.numel():
        return 0.0
    return ACTIVATION_LIPSCHITZ[activation] * float((spread @ W_out.detach().to(F64).abs()).amax())


def score_factor(attn, max_length: int) -> float:
    """The largest factor on q . k: 1 / divisor, times log N under a length scale (n <= N)."""
    factor = 1.0 / attn.cfg.scale_divisor
    return factor * math.log(max_length) if attn.length_scale != "none" else factor


def attention_lipschitz(attn, box: Box, max_length: int, perturbation: float = 0.0) -> float:
    """Prop 7.3 for a softmax layer (module docstring): C with ||att(x)_i - att(x')_i|| <= C eps
    for inputs x in ``box`` and x' within perturbation of x at every position, eps = the
    largest such distance (<= perturbation)."""
    if attn.weighting != "softmax":
        raise ExactLensError(
            f"layer {attn.layer}: {attn.weighting} attention is discontinuous (a tiny change of the scores can "
            "move all the weight); Prop 7.3 holds for softmax attention only"
        )
    _check_length(max_length)
    alpha = score_factor(attn, max_length)
    wide = widen(box, perturbation)
    total = torch.zeros(attn.W_O.shape[-1], dtype=F64)
    for h in range(attn.W_Q.shape[0]):
        W_Q, W_K = attn.W_Q[h].detach().to(F64), attn.W_K[h].detach().to(F64)
        keys = radius(affine_box(wide, W_K, attn.b_K[h].detach().to(F64)))
        queries = radius(affine_box(box, W_Q, attn.b_Q[h].detach().to(F64)))
        score_change = alpha * float(W_Q.abs().sum(0) @ keys + queries @ W_K.abs().sum(0))
        M = attn.W_V[h].detach().to(F64) @ attn.W_O[h].detach().to(F64)
        values = affine_box(box, M, attn.b_V[h].detach().to(F64) @ attn.W_O[h].detach().to(F64))
        total += M.abs().sum(0) + score_change * (values[1] - values[0]) / 2
    return float(total.max())


def layer_norm_lipschitz(ln) -> float:
    """Prop 7.5 (module docstring): C with ||LN(x) - LN(x')|| <= C ||x - x'|| (eps > 0)."""
    d = ln.w.shape[0]
    gain = float(ln.w.detach().to(F64).abs().max())
    select = op_norm(ln.W_select.detach()) if hasattr(ln, "W_select") else 1.0
    centering = 2.0 * (d - 1) / d if ln.center else 1.0
    if not ln.scale:
        return gain * centering * select
    if not ln.eps > 0:
        raise ExactLensError(
            "a layer norm with eps = 0 is not Lipschitz (it maps differences as small as you like to +-1, §6.4); "
            "Prop 7.5 needs eps > 0"
        )
    k = min(math.sqrt(d), centering + 2.0 * math.sqrt(d) / 3.0**1.5)
    return gain * k / math.sqrt(ln.eps) * select


def residual_error(input_error: float, sublayer_error: float) -> float:
    """Prop 7.4: x + f(x) moves by at most the input's error plus the sublayer output's."""
    return input_error + sublayer_error


def perturbation_bounds(model, eps: float, max_length: int) -> dict[str, float]:
    """Props 7.1-7.5 chained: if every position's embedding (token + positional) moves by at
    most eps, each hook's activation moves by at most the returned value (same hook names as
    ``activation_boxes``). Softmax attention and LN with eps > 0 only."""
    if not (math.isfinite(eps) and eps >= 0):
        raise ExactLensError(f"eps must be a finite number >= 0, got {eps!r}")
    boxes = activation_boxes(model, max_length)
    cfg = model.cfg
    e = eps
    out: dict[str, float] = {}
    for layer, block in enumerate(model.blocks):
        name = f"blocks.{layer}"
        x_box = boxes[f"{name}.hook_resid_pre"]
        out[f"{name}.hook_resid_pre"] = e
        if block.norm == "pre":
            attn_box, e_in = layer_norm_box(block.ln1, x_box), layer_norm_lipschitz(block.ln1) * e
        else:
            attn_box, e_in = x_box, e
        e_attn = attention_lipschitz(block.attn, attn_box, max_length, perturbation=e_in) * e_in
        out[f"{name}.hook_attn_out"] = e_attn
        e = residual_error(e, e_attn)
        if block.norm == "post":
            e *= layer_norm_lipschitz(block.ln1)
        out[f"{name}.hook_resid_mid"] = e
        if block.mlp is not None:
            e_in = layer_norm_lipschitz(block.ln2) * e if block.norm == "pre" else e
            kind = cfg.per_layer("act_fn")[layer]
            e_mlp = ffn_lipschitz(block.mlp.W_in, block.mlp.W_out, kind) * e_in
            out[f"{name}.hook_mlp_out"] = e_mlp
            e = residual_error(e, e_mlp) if block.mlp_residual else e_mlp
            if block.norm == "post" and block.mlp_residual:
                e *= layer_norm_lipschitz(block.ln2)
        out[f"{name}.hook_resid_post"] = e
    if cfg.final_ln:
        e *= layer_norm_lipschitz(model.ln_final)
    out["logits"] = op_norm(model.unembed.W_U.detach()) * e
    return out


def _check_length(max_length: int) -> None:
    if isinstance(max_length, bool) or not isinstance(max_length, int) or max_length < 1:
        raise ExactLensError(f"max_length must be an integer >= 1, got {max_length!r}")


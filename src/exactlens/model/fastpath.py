"""The training loop's readout as one autograd node: the model's forward and its backward written out by hand.

At the training loop's sizes (100 words of 10-100 positions, d_model 16) a step is bound by per-operation
overhead, not arithmetic: autograd records ~120 nodes per FIRST step, each with its bookkeeping, views and
gradient accumulation. :class:`FastReadout` computes the same function as ``ExactTransformer.run`` with
``readout_only=True`` and the fused kernels (``set_fused``): the same products, torch's layer norm, its fused
CPU attention kernel, on the same parameters. Its backward calls the matching backward kernels directly
(``native_layer_norm_backward``, the attention kernel's backward, the products' transposes) under no autograd
at all, and the node hands each parameter its gradient. The values are the reference path's up to rounding
(tests/model/test_fastpath.py: outputs and every gradient against ``run`` in float32 and float64); float64
training does not use it (its weights stay bit for bit what they were, tests/train/test_bit_identical.py).
:meth:`FastPath.by_hand` runs the same forward under no autograd and hands back its backward to call
(:class:`HandReadout`): the training loop's step for a loss whose gradient has a closed form, which then never
starts autograd's engine (exactlens.train.loop).

Only the common training shape is covered, checked by :func:`fast_plan` (anything else returns a reason and
the caller runs the model's own forward): every layer softmax attention with no mask on unpadded words and no
length factor beyond log n, post- or pre-LN with a full layer norm, an FFN with a residual (ReLU or GELU),
a sigmoid or logits readout at a fixed position, float32 on the CPU, and no hook attached anywhere.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from exactlens.model.components import HookPoint

aten = torch.ops.aten

ENABLED = True
"""Whether the training loop uses the hand-written readout where it applies (benchmarks/bench_vs_torch.py turns it
off to measure what it gains; results are the same either way, tests/model/test_fastpath.py)."""


@dataclass(frozen=True)
class _Layer:
    norm: str  # "post" or "pre"
    act: str  # "relu" or "gelu"
    eps1: float
    eps2: float


@dataclass(frozen=True)
class FastPlan:
    """What the hand-written forward needs to know beyond the parameters (fixed for a model and a shape)."""

    layers: tuple[_Layer, ...]
    heads: int
    d_head: int
    q_scale: float  # 1 / divisor, times log n under log_n
    position: int  # the readout position (a slice in the last layer)
    learned: bool  # learned positional table, else features @ W_feat
    final_eps: float | None  # the final layer norm's eps (None: no final LN)
    sigmoid: bool


KNOWN_FIELDS = frozenset((
    "act_fn", "attention_mask", "attention_weighting", "attn_bias", "attn_length_scale", "attn_scale", "d_head",
    "d_mlp", "d_model", "d_vocab", "d_vocab_out", "decision_rule", "dtype", "hard_tie_tolerance", "ln_affine",
    "ln_center", "ln_eps", "ln_final", "ln_scale", "ln_select", "metadata", "mlp_bias", "mlp_residual", "model_name",
    "n_ctx", "n_heads", "n_layers", "normalization", "positional_features", "readout", "readout_position",
    "residual_labels", "task", "use_attn_result", "vocab"))
"""The ExactConfig fields this path was written for: a model whose config has another (a switch added later)
runs its own forward until the switch is handled here and in tests/model/test_fastpath.py."""


def unsupported(model, dtypes: tuple[torch.dtype, ...] = (torch.float32,)) -> str | None:
    """Why the hand-written path does not apply to ``model`` whatever its input, or None. ``dtypes``: those it is
    used for (tests also check its arithmetic in float64)."""
    cfg = model.cfg
    unknown = sorted({f.name for f in dataclasses.fields(cfg)} - KNOWN_FIELDS)
    if unknown:
        return f"config fields it was not written for: {', '.join(unknown)}"
    if model.W_E.dtype not in dtypes or model.device.type != "cpu":
        return "float32 on the CPU only (float64 training keeps its bits)"
    if cfg.readout not in ("sigmoid", "logits") or cfg.readout_position < 0:
        return "a readout at one fixed position only"
    if cfg.ln_select or not (cfg.ln_center and cfg.ln_scale) or cfg.d_mlp == 0 or not cfg.mlp_residual:
        return "full layer norms and an FFN with a residual only"
    if cfg.n_layers == 0:
        return "no layer"
    for name, allowed in (("attention_weighting", {"softmax"}), ("attention_mask", {"none"}),
                          ("attn_length_scale", {"none", "log_n"}), ("normalization", {"post", "pre"}),
                          ("act_fn", {"relu", "gelu"})):
        if not set(cfg.per_layer(name)) <= allowed:
            return f"{name} other than {sorted(allowed)}"
    return None


def fast_plan(model, n_pos: int, padded: bool, readout_only: bool = True,
              dtypes: tuple[torch.dtype, ...] = (torch.float32,)) -> FastPlan | str:
    """The plan for ``model`` on words of ``n_pos`` positions, or why the hand-written path does not apply
    (then the model's own forward runs)."""
    cfg = model.cfg
    reason = unsupported(model, dtypes)
    if reason is not None:
        return reason
    if not readout_only:
        return "the full forward is asked (readout_only=False)"
    if padded:
        return "padded words (keys masked)"
    if cfg.readout_position >= n_pos:
        return "the readout position lies beyond the words"
    if hooked(hook_points(model)):
        return "a hook is attached"
    if not all(getattr(m, "fused", True) for m in model.modules()):
        return "fused kernels are off (set_fused(False))"
    layers = tuple(
        _Layer(norm, act, block.ln1.eps, block.ln2.eps)
        for norm, act, block in zip(cfg.per_layer("normalization"), cfg.per_layer("act_fn"), model.blocks,
                                    strict=True))
    scales = {1.0 / cfg.scale_divisor * (math.log(n_pos) if s == "log_n" else 1.0)
              for s in cfg.per_layer("attn_length_scale")}
    if len(scales) > 1:
        return "different length factors per layer"
    return FastPlan(layers, cfg.n_heads, cfg.d_head, scales.pop(), cfg.readout_position, cfg.learned_positions,
                    model.ln_final.eps if cfg.final_ln else None, cfg.readout == "sigmoid")


def hook_points(model) -> list[HookPoint]:
    return [m for m in model.modules() if isinstance(m, HookPoint)]


def hooked(points: list[HookPoint]) -> bool:
    """Whether a hook is attached to one of ``points`` (or a global module hook exists): HookPoint.active for
    each, with the global hooks looked at once (a check every training step)."""
    if points and points[0].active:
        return True
    return any(p._forward_hooks or p._forward_pre_hooks or p._backward_hooks or p._backward_pre_hooks
               for p in points)


def parameters_of(model) -> list[torch.Tensor]:
    """The parameters FastReadout reads, in its order: embedding, positions, each layer's, final LN, unembedding."""
    params = [model.embed.W_E, model.pos_embed.W_pos if model.cfg.learned_positions else model.pos_embed.W_feat]
    for block in model.blocks:
        a, m = block.attn, block.mlp
        params += [a.W_Q, a.W_K, a.W_V, a.b_Q, a.b_K, a.b_V, a.W_O, a.b_O, block.ln1.w, block.ln1.b,
                   m.W_in, m.b_in, m.W_out, m.b_out, block.ln2.w, block.ln2.b]
    if model.cfg.final_ln:
        params += [model.ln_final.w, model.ln_final.b]
    return params + [model.unembed.W_U, model.unembed.b_U]


PER_LAYER = 16


class FastPath:
    """The hand-written readout for one model, used where it applies: ``readout`` returns None where it does
    not (the caller runs the model's own forward). Plans are made once per shape; every call checks that no
    hook was attached since and that the fused kernels are still on (both would change what must run)."""

    def __init__(self, model):
        self.model = model
        self.points = hook_points(model)
        self.attn = model.blocks[0].attn if model.cfg.n_layers else None
        self.plans: dict[tuple, FastPlan | str] = {}
        self.flat: tuple[torch.Tensor, tuple[int, ...]] | None = None
        self.params: list[torch.Tensor] | None = None  # parameters_of(model), once a plan applies

    def use_flat(self, flat: torch.Tensor, leaves: list[torch.Tensor]) -> None:
        """The trainable parameters are ``leaves``, views of the leaf ``flat`` in that order (model.stacked.
        FlatLeaves): the node then gives ``flat`` one gradient (one accumulation instead of one per parameter)."""
        if unsupported(self.model) is not None:
            return
        index = {id(p): i for i, p in enumerate(parameters_of(self.model))}
        if all(id(leaf) in index for leaf in leaves):
            self.flat = (flat, tuple(index[id(leaf)] for leaf in leaves))

    def _plan(self, tokens: torch.Tensor, padded: bool, readout_only: bool) -> FastPlan | None:
        if not ENABLED or self.attn is None or not self.attn.fused or hooked(self.points):
            return None
        key = (tokens.shape[1], padded, readout_only)
        plan = self.plans.get(key)
        if plan is None:
            plan = self.plans[key] = fast_plan(self.model, *key)
        if isinstance(plan, str):
            return None
        if self.params is None:
            self.params = parameters_of(self.model)
        return plan

    def readout(self, tokens: torch.Tensor, padded: bool, readout_only: bool) -> torch.Tensor | None:
        plan = self._plan(tokens, padded, readout_only)
        return None if plan is None else fast_readout(self.model, plan, tokens, self.flat, self.params)

    def by_hand(self, tokens: torch.Tensor, padded: bool) -> HandReadout | None:
        """The readout outputs with no autograd at all, and their backward to call by hand (HandReadout), where
        the path applies and the parameters are views of one flat leaf (use_flat); else None."""
        plan = self._plan(tokens, padded, True) if self.flat is not None else None
        if plan is None:
            return None
        feats = None if plan.learned else self.model.pos_embed._unpadded_features(tokens.shape[1])[0]
        with torch.no_grad():
            logits, saved = _forward(plan, tokens, feats, self.params)
        return HandReadout(logits[:, 0] if plan.sigmoid else logits, saved, tokens, feats, self.params, self.flat)


@dataclass
class HandReadout:
    """A readout computed with no autograd (FastPath.by_hand), for a training step whose loss gradient has a
    closed form (exactlens.tasks.kinds.mean_loss_gradient): the step then skips autograd's engine too, whose every
    ``backward()`` call costs ~0.1 ms at these sizes, about a twentieth of a FIRST step at |w| = 10. The
    gradients are the autograd path's, bit for bit (tests/model/test_fastpath.py)."""

    outputs: torch.Tensor  # [batch] (sigmoid) or [batch, out], as FastPath.readout's
    saved: _Saved
    tokens: torch.Tensor
    feats: torch.Tensor | None
    params: list[torch.Tensor]
    flat: tuple[torch.Tensor, tuple[int, ...]]

    def add_gradient(self, grad: torch.Tensor) -> None:
        """Add d loss / d parameters to the flat leaf's gradient, given d loss / d outputs (``outputs``' shape):
        in place, as autograd accumulates into a leaf's existing gradient."""
        with torch.no_grad():
            grads = _backward(self.saved, self.tokens, self.feats, self.params,
                              grad[:, None] if self.saved.plan.sigmoid else grad)
            self.flat[0].grad.add_(_flat_gradient(grads, self.flat[1]))


def fast_readout(model, plan: FastPlan, tokens: torch.Tensor, flat: tuple[torch.Tensor, tuple[int, ...]] | None = None,
                 params: list[torch.Tensor] | None = None) -> torch.Tensor:
    """The readout outputs of checked, unpadded ``tokens`` [batch, pos]: [batch] (sigmoid) or [batch, out].
    ``flat``: (the flat leaf, the index in parameters_of of each of its views), see FastPath.use_flat; ``params``:
    parameters_of(model), when the caller keeps it (the module lookups cost ~60 us a step)."""
    n_pos = tokens.shape[1]
    feats = None if plan.learned else model.pos_embed._unpadded_features(n_pos)[0]
    params = parameters_of(model) if params is None else params
    if flat is None:  # a gradient for each parameter
        logits = FastReadout.apply(plan, tokens, feats, None, None, *params)
    else:  # one for the flat leaf; the parameters (its views) passed as one object, so autograd adds no edge
        logits = FastReadout.apply(plan, tokens, feats, flat[1], flat[0], tuple(params))
    return logits[:, 0] if plan.sigmoid else logits


def _ln(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, eps: float) -> tuple[torch.Tensor, ...]:
    return torch.native_layer_norm(x, [x.shape[-1]], w, b, eps)  # (out, mean, rstd)


def _ln_back(grad: torch.Tensor, x: torch.Tensor, saved: tuple, w: torch.Tensor, b: torch.Tensor):
    return aten.native_layer_norm_backward(grad, x, [x.shape[-1]], saved[1], saved[2], w, b, [True, True, True])


class FastReadout(torch.autograd.Function):
    """tokens [batch, pos] -> readout logits [batch, out] of the model whose parameters follow (parameters_of),
    with the forward and backward of fast_plan's model written out (see the module's docstring)."""

    @staticmethod
    def forward(ctx, plan: FastPlan, tokens: torch.Tensor, feats: torch.Tensor | None, order: tuple[int, ...] | None,
                flat: torch.Tensor | None, *params: torch.Tensor):
        if order is not None:
            params = params[0]
        logits, ctx.saved = _forward(plan, tokens, feats, params)
        ctx.order = order
        if order is None:
            ctx.save_for_backward(tokens, feats, *params)
        else:  # leaves (views of the flat one), not outputs of this node: no cycle kept through ctx
            ctx.save_for_backward(tokens, feats)
            ctx.params = params
        return logits

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        tokens, feats, *params = ctx.saved_tensors
        if ctx.order is not None:
            params = ctx.params
        grads = _backward(ctx.saved, tokens, feats, params, grad)
        if ctx.order is not None:  # one gradient for the flat leaf, in its order
            return None, None, None, None, _flat_gradient(grads, ctx.order), None
        needs = ctx.needs_input_grad[5:]
        return (None, None, None, None, None,
                *(gr if need else None for gr, need in zip(grads, needs, strict=True)))


def _flat_gradient(grads: list[torch.Tensor], order: tuple[int, ...]) -> torch.Tensor:
    return torch.cat([grads[i].reshape(-1) for i in order])


@dataclass
class _Saved:
    """What the forward keeps for the backward (besides tokens, features and parameters)."""

    plan: FastPlan
    layers: list[tuple]
    final: tuple | None
    unembed_in: torch.Tensor


def _forward(plan: FastPlan, tokens: torch.Tensor, feats: torch.Tensor | None, params) -> tuple[torch.Tensor, _Saved]:
    batch, n_pos = tokens.shape
    W_E, W_pos = params[0], params[1]
    pos = W_pos.narrow(0, 0, n_pos) if plan.learned else torch.mm(feats, W_pos)  # [pos, m]
    x = F.embedding(tokens, W_E) + pos
    saved_layers = []
    last = len(plan.layers) - 1
    for i, layer in enumerate(plan.layers):
        p = params[2 + PER_LAYER * i : 2 + PER_LAYER * (i + 1)]
        x, saved = _layer_forward(plan, layer, p, x, plan.position if i == last else None)
        saved_layers.append(saved)
    x = x.reshape(batch, -1)  # [batch, m]: the readout position's residual stream
    rest = params[2 + PER_LAYER * len(plan.layers):]
    final = None
    if plan.final_eps is not None:
        final = (x, _ln(x, rest[0], rest[1], plan.final_eps))
        x = final[1][0]
    W_U, b_U = rest[-2], rest[-1]
    return torch.addmm(b_U, x, W_U), _Saved(plan, saved_layers, final, x)


def _backward(saved: _Saved, tokens: torch.Tensor, feats: torch.Tensor | None, params,
              grad: torch.Tensor) -> list[torch.Tensor]:
    """Every parameter's gradient (parameters_of's order) from the logits' ``grad`` [batch, out]."""
    plan = saved.plan
    grads: list[torch.Tensor | None] = [None] * len(params)
    rest = 2 + PER_LAYER * len(plan.layers)
    W_U = params[-2]
    grads[-2], grads[-1] = torch.mm(saved.unembed_in.t(), grad), grad.sum(0)
    g = torch.mm(grad, W_U.t())  # [batch, m]
    if saved.final is not None:
        x, ln = saved.final
        g, grads[rest], grads[rest + 1] = _ln_back(g, x, ln, params[rest], params[rest + 1])
    batch, n_pos = tokens.shape
    g = g.view(batch, 1, -1)
    last = len(plan.layers) - 1
    for i in range(last, -1, -1):
        lo = 2 + PER_LAYER * i
        g, layer_grads = _layer_backward(plan, plan.layers[i], params[lo : lo + PER_LAYER], saved.layers[i], g,
                                         n_pos, plan.position if i == last else None)
        grads[lo : lo + PER_LAYER] = layer_grads
    g_sum = g.sum(0)  # [pos, m]
    if plan.learned:
        grads[1] = torch.zeros_like(params[1])
        grads[1][:n_pos] = g_sum
    else:
        grads[1] = torch.mm(feats.t(), g_sum)
    m = g.shape[-1]  # the embedding's gradient: rows added by token (index_add: ~3.5x embedding_dense_backward)
    grads[0] = torch.zeros_like(params[0]).index_add_(0, tokens.reshape(-1), g.reshape(-1, m))
    return grads


def _qkv_weights(p) -> tuple[torch.Tensor, torch.Tensor]:
    W_Q, W_K, W_V, b_Q, b_K, b_V = p[:6]
    m = W_Q.shape[1]
    w = torch.stack((W_Q, W_K, W_V)).permute(2, 0, 1, 3).reshape(m, -1)  # [m, 3 h d]
    return w, torch.stack((b_Q, b_K, b_V)).reshape(-1)


def _layer_forward(plan: FastPlan, layer: _Layer, p, x: torch.Tensor, row: int | None):
    """One block on x [batch, pos, m] -> (output [batch, pos or 1, m], what its backward needs). ``row``: the
    last layer's one query position."""
    W_O, b_O, w1, b1, W_in, b_in, W_out, b_out, w2, b2 = p[6:]
    batch, n_pos, m = x.shape
    h, d = plan.heads, plan.d_head
    ln_x = _ln(x, w1, b1, layer.eps1) if layer.norm == "pre" else None
    attn_in = (ln_x[0] if ln_x is not None else x).reshape(batch * n_pos, m)
    w_qkv, b_qkv = _qkv_weights(p)
    qkv = torch.addmm(b_qkv, attn_in, w_qkv).view(batch, n_pos, 3, h, d)
    q = qkv.select(2, 0) if row is None else qkv.narrow(1, row, 1).select(2, 0)
    q = q.permute(0, 2, 1, 3) * plan.q_scale  # [b, h, q, d]
    k, v = qkv.select(2, 1).permute(0, 2, 1, 3), qkv.select(2, 2).permute(0, 2, 1, 3)
    z, lse = torch._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, False, attn_mask=None, scale=1.0)
    n_q = q.shape[2]
    z_flat = z.permute(0, 2, 1, 3).reshape(batch * n_q, h * d)
    attn_out = torch.addmm(b_O, z_flat, W_O.reshape(h * d, m))
    resid = (x if row is None else x.narrow(1, row, 1)).reshape(batch * n_q, m)
    mid_in = resid + attn_out
    ln1 = _ln(mid_in, w1, b1, layer.eps1) if layer.norm == "post" else None
    mid = ln1[0] if ln1 is not None else mid_in
    ln2_in = _ln(mid, w2, b2, layer.eps2) if layer.norm == "pre" else None
    mlp_in = ln2_in[0] if ln2_in is not None else mid
    pre = torch.addmm(b_in, mlp_in, W_in)
    act = torch.relu(pre) if layer.act == "relu" else F.gelu(pre)
    out_in = mid + torch.addmm(b_out, act, W_out)
    ln2 = _ln(out_in, w2, b2, layer.eps2) if layer.norm == "post" else None
    out = ln2[0] if ln2 is not None else out_in
    saved = (x, ln_x, attn_in, w_qkv, q, k, v, z, lse, z_flat, mid_in, ln1, mid, ln2_in, mlp_in, pre, act,
             out_in, ln2)
    return out.view(batch, n_q, m), saved


def _layer_backward(plan: FastPlan, layer: _Layer, p, saved, g: torch.Tensor, n_pos: int, row: int | None):
    """The gradient of one block: g [batch, q, m] at its output -> (at its input [batch, pos, m], the
    gradients of its 16 parameters in parameters_of's order)."""
    x, ln_x, attn_in, w_qkv, q, k, v, z, lse, z_flat, mid_in, ln1, mid, ln2_in, mlp_in, pre, act, out_in, ln2 = saved
    W_Q, W_K, W_V, b_Q, b_K, b_V, W_O, b_O, w1, b1, W_in, b_in, W_out, b_out, w2, b2 = p
    batch, n_q, m = g.shape
    h, d = plan.heads, plan.d_head
    g = g.reshape(batch * n_q, m)
    gw2 = gb2 = gw1 = gb1 = None
    if layer.norm == "post":
        g, gw2, gb2 = _ln_back(g, out_in, ln2, w2, b2)
    g_f = g  # the FFN's output and the residual share it
    gW_out, gb_out = torch.mm(act.t(), g_f), g_f.sum(0)
    g_act = torch.mm(g_f, W_out.t())
    g_pre = aten.threshold_backward(g_act, act, 0) if layer.act == "relu" else aten.gelu_backward(g_act, pre)
    gW_in, gb_in = torch.mm(mlp_in.t(), g_pre), g_pre.sum(0)
    g_mlp_in = torch.mm(g_pre, W_in.t())
    if layer.norm == "pre":
        g_ln2, gw2, gb2 = _ln_back(g_mlp_in, mid, ln2_in, w2, b2)
        g_mid = g + g_ln2
    else:
        g_mid = g + g_mlp_in
        g_mid, gw1, gb1 = _ln_back(g_mid, mid_in, ln1, w1, b1)
    gW_O = torch.mm(z_flat.t(), g_mid).view(h, d, m)
    gb_O = g_mid.sum(0)
    g_z = torch.mm(g_mid, W_O.reshape(h * d, m).t()).view(batch, n_q, h, d).permute(0, 2, 1, 3)
    dq, dk, dv = aten._scaled_dot_product_flash_attention_for_cpu_backward(
        g_z.contiguous(), q, k, v, z, lse, 0.0, False, attn_mask=None, scale=1.0)
    dq = (dq * plan.q_scale).permute(0, 2, 1, 3)  # [b, q, h, d]
    if row is not None:  # q at one row: zero at the others
        dq = F.pad(dq, (0, 0, 0, 0, row, n_pos - row - 1))
    g_qkv = torch.stack((dq, dk.permute(0, 2, 1, 3), dv.permute(0, 2, 1, 3)), 2).view(batch * n_pos, 3 * h * d)
    gW_qkv = torch.mm(attn_in.t(), g_qkv).view(m, 3, h, d).permute(1, 2, 0, 3)
    gb_qkv = g_qkv.sum(0).view(3, h, d)
    g_x = torch.mm(g_qkv, w_qkv.t()).view(batch, n_pos, m)
    if layer.norm == "pre":
        g_x, gw1, gb1 = _ln_back(g_x, x, ln_x, w1, b1)
    if row is None:
        g_x = g_x + g_mid.view(batch, n_pos, m)
    else:
        g_x.select(1, row).add_(g_mid)
    return g_x, [*gW_qkv.unbind(0), *gb_qkv.unbind(0), gW_O, gb_O, gw1, gb1, gW_in, gb_in, gW_out, gb_out,
                 gw2, gb2]

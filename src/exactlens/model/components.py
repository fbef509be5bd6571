"""Sublayers of the exact transformer, each with its hooks next to its math.

Shapes follow TransformerLens: activations are [batch, pos, ...], attention
scores/patterns are [batch, head, query_pos, key_pos], per-head tensors are
[batch, pos, head, d_head].
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.modules import module as _torch_module
from transformer_lens.hook_points import HookPoint as _TLHookPoint

from exactlens.model.config import ExactConfig
from exactlens.model.positional import evaluate_features


class HookPoint(_TLHookPoint):
    """TransformerLens's HookPoint with a fast path: with no hook attached (and no
    global module hooks) it returns its input without nn.Module's call machinery.
    Hooks added by run_with_hooks / run_with_cache / add_hook take the normal path."""

    @property
    def active(self) -> bool:
        """A hook is attached here (or a global module hook exists): the value must be computed."""
        return bool(
            self._forward_hooks
            or self._forward_pre_hooks
            or self._backward_hooks
            or self._backward_pre_hooks
            or _torch_module._global_forward_hooks
            or _torch_module._global_forward_pre_hooks
            or _torch_module._global_backward_hooks
            or _torch_module._global_backward_pre_hooks
        )

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return super().__call__(x) if self.active else x


def _param(*shape: int, dtype: torch.dtype, trainable: bool = True) -> nn.Parameter:
    return nn.Parameter(torch.zeros(*shape, dtype=dtype), requires_grad=trainable)


class Embed(nn.Module):
    def __init__(self, cfg: ExactConfig):
        super().__init__()
        self.W_E = _param(cfg.d_vocab, cfg.d_model, dtype=cfg.torch_dtype)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.W_E[tokens]


class PosEmbed(nn.Module):
    """Learned table W_pos [n_ctx, d_model], or features(i, n) @ W_feat."""

    def __init__(self, cfg: ExactConfig):
        super().__init__()
        self.cfg = cfg
        if cfg.learned_positions:
            self.W_pos = _param(cfg.n_ctx, cfg.d_model, dtype=cfg.torch_dtype)
        else:
            self.W_feat = _param(len(cfg.positional_features), cfg.d_model, dtype=cfg.torch_dtype)
        self._features: dict[tuple, torch.Tensor] = {}

    def forward(self, n_pos: int, n_positions: torch.Tensor, padded: bool = True) -> torch.Tensor:
        """padded=False promises n_positions == n_pos for every row (features computed once)."""
        batch = n_positions.shape[0]
        if self.cfg.learned_positions:
            return self.W_pos[:n_pos].unsqueeze(0).expand(batch, -1, -1)
        if not padded:
            return (self._unpadded_features(n_pos) @ self.W_feat).expand(batch, -1, -1)
        feats = evaluate_features(self.cfg.positional_features, n_pos, n_positions, self.W_feat.dtype)
        return feats @ self.W_feat

    def _unpadded_features(self, n_pos: int) -> torch.Tensor:
        """Features [1, n_pos, n_features] of a word of n_pos positions, computed once per length, dtype and
        device (a training run asks for the same few every step). Computed from n_pos itself, never from a
        caller's tensor, so a tensor mapped by torch.vmap never enters the cache."""
        key = (n_pos, self.W_feat.dtype, self.W_feat.device, self.cfg.positional_features)
        feats = self._features.get(key)
        if feats is None:
            if len(self._features) >= 64:  # many lengths (a sweep of verify calls): start over
                self._features.clear()
            n = torch.full((1,), n_pos, dtype=torch.long, device=self.W_feat.device)
            feats = self._features[key] = evaluate_features(self.cfg.positional_features, n_pos, n, self.W_feat.dtype)
        return feats


class LayerNorm(nn.Module):
    """LN(x) = (x - mean x) / sqrt(var x + eps) * w + b, eps may be 0.

    With ln_center=False it only scales: x / sqrt(mean x^2 + eps) (Brody et
    al.'s LN without the projection); with ln_scale=False it only projects:
    x - mean x (LN without the scaling, Brody et al. Table 2). hook_scale is the
    denominator, [batch, pos, 1] (1 when not scaling).

    With ln_select, LN reads x @ W_select instead of x (Transformer Cookbook §5.3.3: a
    linear map before pre-LN normalizes only the components it selects, e.g. the four
    components of a layer-norm hash, whatever else the stream holds).
    """

    def __init__(self, cfg: ExactConfig):
        super().__init__()
        self.eps = cfg.ln_eps
        self.center = cfg.ln_center
        self.scale = cfg.ln_scale
        self.w = nn.Parameter(torch.ones(cfg.d_model, dtype=cfg.torch_dtype), requires_grad=cfg.ln_affine)
        self.b = _param(cfg.d_model, dtype=cfg.torch_dtype, trainable=cfg.ln_affine)
        if cfg.ln_select:
            self.W_select = nn.Parameter(torch.eye(cfg.d_model, dtype=cfg.torch_dtype))
        self.hook_scale = HookPoint()
        self.hook_normalized = HookPoint()
        self.fused = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if hasattr(self, "W_select"):
            x = x @ self.W_select
        if self.fused and self.scale and not (self.hook_scale.active or self.hook_normalized.active):
            # The same function through torch's fused kernels (one pass forward and backward; rounding
            # differs in the last bits): the training loop turns this on (ExactTransformer.set_fused).
            if self.center:
                return F.layer_norm(x, x.shape[-1:], self.w, self.b, eps=self.eps)
            return F.rms_norm(x, x.shape[-1:], eps=self.eps) * self.w + self.b
        if self.center:
            x = x - x.mean(-1, keepdim=True)
        if not self.scale:
            return self.hook_normalized(x) * self.w + self.b
        scale = self.hook_scale((x.pow(2).mean(-1, keepdim=True) + self.eps).sqrt())
        return self.hook_normalized(x / scale) * self.w + self.b


def visible_keys(mask: str, n_pos: int, n_positions: torch.Tensor, padded: bool = True) -> torch.Tensor | None:
    """Bool [batch, 1, query, key]: may query i read key j (mask and padding).
    None when nothing is masked (no mask, no padding): attention then skips masking."""
    if mask == "none" and not padded:
        return None
    device = n_positions.device
    i = torch.arange(n_pos, device=device).unsqueeze(1)
    j = torch.arange(n_pos, device=device).unsqueeze(0)
    structural = {
        "none": torch.ones(n_pos, n_pos, dtype=torch.bool, device=device),
        "causal": j <= i,
        "strict_causal": j < i,
        "past": j >= i,
        "strict_past": j > i,
    }[mask]
    real_key = torch.arange(n_pos, device=device).unsqueeze(0) < n_positions.unsqueeze(1)  # [batch, key]
    return structural.unsqueeze(0).unsqueeze(0) & real_key[:, None, None, :]


class FusedAttention(torch.autograd.Function):
    """softmax(q k^T + mask) v [b, h, q, d] through torch's fused CPU attention kernel and its
    backward (no [query, key] tensor is stored for the backward pass). Under torch.vmap the mapped
    dimension joins the batch dimension, so R stacked runs make one kernel call, not R (torch has
    no batching rule for the fused kernel). ``mask``: bool [b, 1, q, k] (True = visible) or None."""

    @staticmethod
    def forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None):
        out, logsumexp = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            q, k, v, 0.0, False, attn_mask=_mask_bias(q, mask), scale=1.0
        )
        return out, logsumexp

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        # Only inputs and outputs, through save_for_backward: a tensor kept as a ctx attribute that is
        # itself an output of this node (the bias once was) forms a cycle through the C++ graph that no
        # garbage collector frees, leaking every step's [b, 1, q, k] tensor in training.
        q, k, v, mask = inputs
        out, logsumexp = output
        ctx.save_for_backward(q, k, v, out, logsumexp, mask)
        ctx.mark_non_differentiable(logsumexp)

    @staticmethod
    def backward(ctx, grad: torch.Tensor, *unused):
        q, k, v, out, logsumexp, mask = ctx.saved_tensors
        grads = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
            grad.contiguous(), q, k, v, out, logsumexp, 0.0, False, attn_mask=_mask_bias(q, mask), scale=1.0
        )
        return (*grads, None)

    @staticmethod
    def vmap(info, in_dims, q, k, v, mask):
        runs = info.batch_size

        def fold(t: torch.Tensor, dim: int | None) -> torch.Tensor:  # [R, b, ...] -> [R * b, ...]
            t = t.movedim(dim, 0) if dim is not None else t.expand(runs, *t.shape)
            return t.reshape(runs * t.shape[1], *t.shape[2:])

        q, k, v = (fold(t, d) for t, d in zip((q, k, v), in_dims[:3], strict=True))
        if mask is not None:
            mask = mask.movedim(in_dims[3], 0) if in_dims[3] is not None else mask.expand(runs, *mask.shape)
            mask = fold(mask.expand(runs, q.shape[0] // runs, *mask.shape[2:]), 0)
        out, logsumexp = FusedAttention.apply(q, k, v, mask)
        return (out.reshape(runs, -1, *out.shape[1:]), logsumexp.reshape(runs, -1, *logsumexp.shape[1:])), (0, 0)


def fused_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """softmax(q k^T + mask) v through torch's fused kernel: FusedAttention under torch.vmap (stacked
    runs), else torch's own scaled_dot_product_attention, which dispatches to the same CPU kernel
    without autograd.Function's per-call argument binding (~0.1 ms a call, measured)."""
    if any(torch._C._functorch.is_batchedtensor(t) for t in (q, k, v)):
        return FusedAttention.apply(q, k, v, mask)[0]
    return F.scaled_dot_product_attention(q, k, v, attn_mask=_mask_bias(q, mask), scale=1.0)


def _mask_bias(q: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor | None:
    """The additive bias of a visibility mask: 0 where visible, -inf where not."""
    return None if mask is None else q.new_zeros(()).masked_fill(~mask, -math.inf)


def gather_rows(x: torch.Tensor, rows: torch.Tensor | int) -> torch.Tensor:
    """x [batch, pos, ...] at one position per row, rows [batch] -> [batch, 1, ...]; an int: that position in
    every row (a slice: no index tensor, and a copy instead of a scatter in the backward pass)."""
    if isinstance(rows, int):
        return x[:, rows : rows + 1]
    index = rows.view(-1, 1, *([1] * (x.ndim - 2))).expand(-1, 1, *x.shape[2:])
    return x.gather(1, index)


def _in_place_ok(target: torch.Tensor, other: torch.Tensor) -> bool:
    """Whether ``target`` can take an in-place operation with ``other``: its shape is already the broadcast one, and
    ``other`` is not batched under torch.vmap where ``target`` is not (the in-place form would fail there)."""
    batched = torch._C._functorch.is_batchedtensor
    return (torch.broadcast_shapes(target.shape, other.shape) == target.shape
            and (batched(target) or not batched(other)))


def hard_weights(scores: torch.Tensor, allowed: torch.Tensor | None, kind: str, tol: float) -> torch.Tensor:
    """Average-hard or unique-hard (leftmost/rightmost) attention weights. ``allowed``: None when every query
    sees every key (``scores`` masked to -inf where it does not)."""
    best = scores.amax(-1, keepdim=True)
    tied = scores >= best - tol
    if allowed is not None:
        tied = tied.logical_and_(allowed) if _in_place_ok(tied, allowed) else tied & allowed
    if kind == "average_hard":
        # tied / count as tied * (1 / count): the same values (tied is 0 or 1, and 1 * (1/c) is 1/c), with a
        # product in place of a division over [.., q, k] and no second buffer
        weights = tied.to(scores.dtype)
        return weights.mul_(1.0 / weights.sum(-1, keepdim=True).clamp(min=1))
    if kind == "unique_hard_right":
        tied = tied.flip(-1)
    first = tied & (tied.cumsum(-1) == 1)
    if kind == "unique_hard_right":
        first = first.flip(-1)
    return first.to(scores.dtype)


QUERY_CHUNK_BYTES = 2**28
"""Attention whose [query, key] tensors would exceed this many bytes, with no hook reading them, is
computed a block of queries at a time (the same values; what lets verify run 10^5 positions)."""


def _query_slice(allowed: torch.Tensor | None, start: int, size: int) -> torch.Tensor | None:
    if allowed is None or allowed.shape[2] == 1:
        return allowed
    return allowed[:, :, start : start + size]


class Attention(nn.Module):
    def __init__(self, cfg: ExactConfig, layer: int = 0):
        super().__init__()
        self.cfg = cfg
        self.layer = layer
        h, m, d = cfg.n_heads, cfg.d_model, cfg.d_head
        dt = cfg.torch_dtype
        self.W_Q = _param(h, m, d, dtype=dt)
        self.W_K = _param(h, m, d, dtype=dt)
        self.W_V = _param(h, m, d, dtype=dt)
        self.W_O = _param(h, d, m, dtype=dt)
        self.b_Q = _param(h, d, dtype=dt, trainable=cfg.attn_bias)
        self.b_K = _param(h, d, dtype=dt, trainable=cfg.attn_bias)
        self.b_V = _param(h, d, dtype=dt, trainable=cfg.attn_bias)
        self.b_O = _param(m, dtype=dt, trainable=cfg.attn_bias)
        for name in ("q", "k", "v", "attn_scores", "pattern", "z", "result"):
            setattr(self, f"hook_{name}", HookPoint())
        self.fused = False  # ExactTransformer.set_fused

    # This layer's per-layer switches, read from the config (not copied, so they cannot go stale).
    @property
    def mask(self) -> str:
        return self.cfg.per_layer("attention_mask")[self.layer]

    @property
    def weighting(self) -> str:
        return self.cfg.per_layer("attention_weighting")[self.layer]

    @property
    def length_scale(self) -> str:
        return self.cfg.per_layer("attn_length_scale")[self.layer]

    def forward(
        self,
        x: torch.Tensor,
        allowed: torch.Tensor | None,
        n_positions: torch.Tensor,
        query_rows: torch.Tensor | int | None = None,
    ) -> torch.Tensor:
        """allowed: bool [batch, 1, query, key], or None when every query sees every key.
        query_rows [batch]: only that query position of each row (keys and values from every position); an int:
        that position in every row."""
        if isinstance(query_rows, int) and allowed is not None:
            allowed = allowed[:, :, query_rows : query_rows + 1]
        elif query_rows is not None and allowed is not None:
            allowed = allowed.expand(x.shape[0], -1, -1, -1).gather(
                2, query_rows.view(-1, 1, 1, 1).expand(-1, 1, 1, allowed.shape[-1])
            )
        if self.fused and x.dtype != torch.float64:
            q, k, v = self._fused_products(x, query_rows)
        else:
            x_query = x if query_rows is None else gather_rows(x, query_rows)
            q, k, v = (torch.einsum("bpm,hmd->bphd", inp, w) + b for inp, w, b in (
                (x_query, self.W_Q, self.b_Q), (x, self.W_K, self.b_K), (x, self.W_V, self.b_V)))
        q, k, v = self.hook_q(q), self.hook_k(k), self.hook_v(v)
        # Scores (q . k) / divisor [* log n]; the per-row factor is applied to q so
        # that the [query, key] matrix is swept once (one product, one softmax).
        q_rows = self._query_rows(q, n_positions)  # [b, h, q, d]
        length_scale = self.length_scale
        if self._fused(length_scale):
            # The same softmax attention through torch's fused kernel, which keeps no [query, key]
            # tensor for the backward pass (rounding differs in the last bits; see set_fused).
            z = fused_attention(q_rows, k.permute(0, 2, 1, 3), v.permute(0, 2, 1, 3), allowed)
            return self._output(self.hook_z(z.permute(0, 2, 1, 3)))
        k_t, v_t = k.permute(0, 2, 3, 1), v.permute(0, 2, 1, 3)  # [b, h, d, k], [b, h, k, d]
        n_queries, n_keys = q_rows.shape[2], x.shape[1]
        per_query = q_rows.shape[0] * q_rows.shape[1] * n_keys * q_rows.element_size() * 3  # scores, mask, pattern
        hooked = self.hook_attn_scores.active or self.hook_pattern.active
        if hooked or per_query * n_queries <= QUERY_CHUNK_BYTES:
            z = self._attend(q_rows, k_t, v_t, allowed, n_keys)
        else:  # long inputs, nothing reads the [query, key] tensors: a few queries at a time, same values
            step = max(1, QUERY_CHUNK_BYTES // per_query)
            z = torch.cat([self._attend(q_rows[:, :, i : i + step], k_t, v_t, _query_slice(allowed, i, step), n_keys)
                           for i in range(0, n_queries, step)], dim=2)
        return self._output(self.hook_z(z.permute(0, 2, 1, 3)))  # z [b, q, h, d]

    def _fused_products(self, x: torch.Tensor, query_rows: torch.Tensor | int | None) -> tuple[torch.Tensor, ...]:
        """q, k, v [b, pos, h, d] from one product of the flattened stream with [d_model, 3 h d] (the training
        loop's path, see set_fused): one kernel call and a few backward nodes instead of three einsums' permutes,
        batched products and bias adds (1.6-1.8x those at the training loop's sizes). With query_rows, q at those
        rows only. Float32 only: in float64 the products and their gradients sum in another order than the
        einsums', and float64 training keeps its weights bit for bit (tests/train/test_bit_identical.py)."""
        batch, n_pos, m = x.shape
        h, d = self.cfg.n_heads, self.cfg.d_head
        w = torch.stack((self.W_Q, self.W_K, self.W_V)).permute(2, 0, 1, 3).reshape(m, 3 * h * d)
        qkv = x.reshape(batch * n_pos, m) @ w + torch.stack((self.b_Q, self.b_K, self.b_V)).reshape(3 * h * d)
        q, k, v = qkv.view(batch, n_pos, 3, h, d).unbind(2)
        return (q if query_rows is None else gather_rows(q, query_rows)), k, v

    def _query_rows(self, q: torch.Tensor, n_positions: torch.Tensor) -> torch.Tensor:
        """q [b, q, h, d] -> [b, h, q, d] scaled so that q_rows @ k^T are the scores: divided by the
        divisor, times log n under log_n (Chiang & Cholak eq. 2; the per-row factor goes on q so that
        the [query, key] matrix is swept once)."""
        q_rows = q.permute(0, 2, 1, 3) * (1.0 / self.cfg.scale_divisor)
        if self.length_scale == "log_n":
            q_rows = q_rows * torch.log(n_positions.to(q.dtype))[:, None, None, None]
        return q_rows

    def head_result(self, head: int, x_q: torch.Tensor, x_k: torch.Tensor, x_v: torch.Tensor,
                    allowed: torch.Tensor | None, n_positions: torch.Tensor) -> torch.Tensor:
        """One head's output z @ W_O[head] [b, pos, d_model] (b_O not included) when its queries, keys
        and values read different inputs [b, pos, d_model]: the edge-level circuit analysis feeds each
        input its own mix of senders (exactlens.analysis.circuit). No hooks fire."""
        one = slice(head, head + 1)
        q = torch.einsum("bpm,hmd->bphd", x_q, self.W_Q[one]) + self.b_Q[one]
        k = torch.einsum("bpm,hmd->bphd", x_k, self.W_K[one]) + self.b_K[one]
        v = torch.einsum("bpm,hmd->bphd", x_v, self.W_V[one]) + self.b_V[one]
        z = self._attend(self._query_rows(q, n_positions), k.permute(0, 2, 3, 1), v.permute(0, 2, 1, 3),
                         allowed, x_k.shape[1])
        return z[:, 0] @ self.W_O[head]

    def pattern_rows(self, q: torch.Tensor, k: torch.Tensor, n_positions: torch.Tensor,
                     allowed: torch.Tensor | None) -> torch.Tensor:
        """The attention weights [b, h, q, k] of the queries ``q`` [b, q, h, d] (as hook_q gives them) over the
        keys ``k`` [b, k, h, d] (hook_k): those rows of hook_pattern, computed from them alone, so that a metric
        reading a few query rows needs no [query, key] tensor of every row (nor the unfused attention that
        hooking the pattern forces). ``allowed``: bool [b, 1, q, k] for those rows, or None. No hook fires."""
        return self._weights(self._query_rows(q, n_positions), k.permute(0, 2, 3, 1), allowed, k.shape[1], False)

    def _attend(self, q_rows: torch.Tensor, k_t: torch.Tensor, v_t: torch.Tensor, allowed: torch.Tensor | None,
                n_keys: int) -> torch.Tensor:
        """Scores, weights and the weighted values [b, h, q, d] for the given queries."""
        return self._weights(q_rows, k_t, allowed, n_keys, True) @ v_t

    def _weights(self, q_rows: torch.Tensor, k_t: torch.Tensor, allowed: torch.Tensor | None, n_keys: int,
                 hooked: bool) -> torch.Tensor:
        """The weights [b, h, q, k] of the given queries (through hook_attn_scores and hook_pattern if
        ``hooked``)."""
        scores = q_rows @ k_t  # [b, h, q, k]
        if self.length_scale == "log_visible":
            seen = (allowed.sum(-1, keepdim=True) if allowed is not None
                    else torch.tensor(float(n_keys), device=scores.device))
            scores = scores * torch.log(seen.clamp(min=1).to(scores.dtype))
        if allowed is not None:  # in place where it can: scores is this call's own (the product's backward reads
            hidden = ~allowed  # q and k only)
            scores = scores.masked_fill_(hidden, -math.inf) if _in_place_ok(scores, hidden) else \
                scores.masked_fill(hidden, -math.inf)
        if hooked:
            scores = self.hook_attn_scores(scores)
        weighting = self.weighting
        if weighting == "softmax":
            pattern = torch.softmax(scores, dim=-1)
            if allowed is not None:  # a query that sees no key gets weight 0 everywhere
                pattern = torch.where(allowed, pattern, pattern.new_zeros(()))
        elif weighting == "none":
            pattern = scores if allowed is None else torch.where(allowed, scores, scores.new_zeros(()))
        else:
            pattern = hard_weights(scores, allowed, weighting, self.cfg.hard_tie_tolerance)
        return self.hook_pattern(pattern) if hooked else pattern

    def _output(self, z: torch.Tensor) -> torch.Tensor:
        if self.cfg.use_attn_result:
            result = self.hook_result(torch.einsum("bqhd,hdm->bqhm", z, self.W_O))
            return result.sum(-2) + self.b_O
        return z.flatten(2) @ self.W_O.flatten(0, 1) + self.b_O

    def _fused(self, length_scale: str) -> bool:
        """Softmax attention may run fused: when turned on (set_fused), with no hook on the scores or
        the pattern, a length factor applied to the queries, and a mask under which every query sees
        at least one key (the fused kernel gives NaN for a query that sees none)."""
        return (
            self.fused
            and self.W_Q.device.type == "cpu"  # FusedAttention calls torch's CPU kernel
            and self.weighting == "softmax"
            and length_scale in ("none", "log_n")
            and self.mask in ("none", "causal")
            and not (self.hook_attn_scores.active or self.hook_pattern.active)
        )


_ACTIVATIONS = {"relu": F.relu, "gelu": F.gelu, "identity": lambda x: x}


class MLP(nn.Module):
    def __init__(self, cfg: ExactConfig, layer: int = 0):
        super().__init__()
        dt = cfg.torch_dtype
        self.W_in = _param(cfg.d_model, cfg.d_mlp, dtype=dt)
        self.b_in = _param(cfg.d_mlp, dtype=dt, trainable=cfg.mlp_bias)
        self.W_out = _param(cfg.d_mlp, cfg.d_model, dtype=dt)
        self.b_out = _param(cfg.d_model, dtype=dt, trainable=cfg.mlp_bias)
        self.cfg = cfg
        self.layer = layer
        self.hook_pre = HookPoint()
        self.hook_post = HookPoint()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pre = self.hook_pre(x @ self.W_in + self.b_in)
        act = _ACTIVATIONS[self.cfg.per_layer("act_fn")[self.layer]]
        return self.hook_post(act(pre)) @ self.W_out + self.b_out


class Block(nn.Module):
    """One layer. Post-LN (Vaswani; Chiang & Cholak §2.2.2):
    c = LN1(x + Att(x)), a = LN2(c + FFN(c)); hook_resid_mid is c.
    Pre-LN: c = x + Att(LN1(x)), a = c + FFN(LN2(c)).
    mlp_residual=False: a = FFN(c) (post-LN: no LN2; pre-LN: a = FFN(LN2(c)))."""

    def __init__(self, cfg: ExactConfig, layer: int = 0):
        super().__init__()
        self.norm = cfg.per_layer("normalization")[layer]
        self.mlp_residual = cfg.mlp_residual
        self.attn = Attention(cfg, layer)
        self.mlp = MLP(cfg, layer) if cfg.d_mlp > 0 else None
        if self.norm != "none":
            self.ln1 = LayerNorm(cfg)
            if self.mlp is not None and (self.norm == "pre" or self.mlp_residual):
                self.ln2 = LayerNorm(cfg)
        for name in ("resid_pre", "attn_out", "resid_mid", "mlp_out", "resid_post"):
            setattr(self, f"hook_{name}", HookPoint())

    def forward(self, x: torch.Tensor, allowed: torch.Tensor | None, n_positions: torch.Tensor,
                query_rows: torch.Tensor | int | None = None) -> torch.Tensor:
        """query_rows [batch] (or one int for every row): compute this layer at one position per row (every
        position is still a key), output [batch, 1, d_model]: all a readout at that position needs from a last layer."""
        x = self.hook_resid_pre(x)
        attn_in = self.ln1(x) if self.norm == "pre" else x
        if query_rows is not None:
            x = gather_rows(x, query_rows)
        mid = x + self.hook_attn_out(self.attn(attn_in, allowed, n_positions, query_rows))
        mid = self.hook_resid_mid(self.ln1(mid) if self.norm == "post" else mid)
        if self.mlp is None:
            return self.hook_resid_post(mid)
        mlp_in = self.ln2(mid) if self.norm == "pre" else mid
        mlp_out = self.hook_mlp_out(self.mlp(mlp_in))
        if not self.mlp_residual:  # the FFN output replaces the stream (no add, no post-LN)
            return self.hook_resid_post(mlp_out)
        out = mid + mlp_out
        return self.hook_resid_post(self.ln2(out) if self.norm == "post" else out)


class Unembed(nn.Module):
    def __init__(self, cfg: ExactConfig):
        super().__init__()
        self.W_U = _param(cfg.d_model, cfg.d_vocab_out, dtype=cfg.torch_dtype)
        self.b_U = _param(cfg.d_vocab_out, dtype=cfg.torch_dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x @ self.W_U + self.b_U

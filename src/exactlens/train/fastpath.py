"""The training forward: CLS logits of one ExactTransformer, or of R of them at once.

Training reads one output, the logits at [CLS] (position 0). This module computes
exactly that function (same values and gradients as ``model(tokens, n_positions)[:, 0]``)
with less work:

- in the last layer only the CLS query matters, so its attention is one row (1 x n)
  instead of n x n, and its FFN and layer norms run at one position;
- attention runs through torch's fused scaled_dot_product_attention (no n x n softmax
  tensor kept for the backward pass), with the model's 1/divisor and log n factors
  applied to the query first, as ExactTransformer's Attention does;
- R models of one configuration (R training runs, e.g. R seeds) run as one computation:
  every parameter carries a leading run axis [R, ...], inputs are [R, batch, pos], and
  each kernel is launched once for all runs. Runs share no parameter and no gradient
  (the loss is a sum of per-run losses), so this is R independent trainings whose
  per-step overhead is paid once.

One model is the case R = 1 (its parameters seen through a leading axis of size 1), so
single and stacked training share this one implementation. Configurations outside what
it covers (hard or unnormalized attention, structural masks, log_visible, per-head
results, a readout elsewhere than position 0, layers with different normalizations,
selective LN, a non-standard final LN, an FFN that replaces the stream) train through the model's own forward;
``supports`` says which. Tests compare both against the model.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
import torch.nn.functional as F

from exactlens.errors import ExactLensError
from exactlens.model import ExactConfig, ExactTransformer
from exactlens.model.components import _ACTIVATIONS
from exactlens.model.positional import evaluate_features

Params = Mapping[str, torch.Tensor]  # parameter name -> [R, *shape]


def supports(model: ExactTransformer | ExactConfig) -> bool:
    cfg = model.cfg if isinstance(model, ExactTransformer) else model
    return (
        cfg.readout_position == 0
        and set(cfg.per_layer("attention_weighting")) == {"softmax"}
        and set(cfg.per_layer("attention_mask")) == {"none"}
        and set(cfg.per_layer("attn_length_scale")) <= {"none", "log_n"}
        and not cfg.use_attn_result
        and cfg.uniform("normalization") is not None
        and cfg.standard_final_ln
        and not cfg.ln_select
        and cfg.mlp_residual
    )


def stack_parameters(models: Sequence[ExactTransformer]) -> dict[str, torch.Tensor]:
    """The models' parameters stacked along a new run axis: trainable ones as leaf
    tensors that require grad (optimize these), frozen ones (e.g. attn_bias=False) as
    constants. The models must share one configuration."""
    if not models:
        raise ExactLensError("stack_parameters needs at least one model")
    first = models[0].cfg.to_dict()
    for model in models[1:]:
        if model.cfg.to_dict() != first:
            raise ExactLensError("stacked models must share one configuration (the same ExactConfig)")
    tables = [dict(m.named_parameters()) for m in models]
    return {
        name: torch.stack([t[name].detach() for t in tables]).requires_grad_(param.requires_grad)
        for name, param in tables[0].items()
    }


@torch.no_grad()
def unstack_into(params: Params, models: Sequence[ExactTransformer]) -> None:
    """Copy run r of every stacked parameter into models[r]."""
    for r, model in enumerate(models):
        for name, param in model.named_parameters():
            param.copy_(params[name][r])


def model_parameters(model: ExactTransformer) -> dict[str, torch.Tensor]:
    """One model's parameters as a stack of R = 1 (views: gradients reach the model)."""
    return {name: p.unsqueeze(0) for name, p in model.named_parameters()}


def cls_logits(model: ExactTransformer, tokens: torch.Tensor, n_positions: torch.Tensor | None = None) -> torch.Tensor:
    """The logits at position 0 of one model, [batch, d_vocab_out]; n_positions for right-padded rows."""
    n_positions = model._check_input(tokens, n_positions)
    return stacked_cls_logits(model.cfg, model_parameters(model), tokens[None], n_positions[None])[0]


def _linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """Per-run affine map: x [R, ..., m] @ weight [R, m, k] + bias [R, k], as one batched
    product over runs (a broadcast matmul would expand the weight to every row)."""
    flat = torch.baddbmm(bias[:, None, :], x.reshape(x.shape[0], -1, x.shape[-1]), weight)
    return flat.view(*x.shape[:-1], weight.shape[-1])


def _layer_norm(cfg: ExactConfig, params: Params, prefix: str, x: torch.Tensor) -> torch.Tensor:
    """exactlens.model.components.LayerNorm with per-run gain and bias ([R, d] -> [R, 1, 1, d]).
    Full LN and scaling-only LN use torch's fused kernels (one pass forward, one backward)."""
    if cfg.ln_center and cfg.ln_scale:
        x = F.layer_norm(x, x.shape[-1:], eps=cfg.ln_eps)
    elif cfg.ln_scale:
        x = F.rms_norm(x, x.shape[-1:], eps=cfg.ln_eps)
    else:
        x = x - x.mean(-1, keepdim=True)
    return torch.addcmul(params[f"{prefix}.b"][:, None, None], x, params[f"{prefix}.w"][:, None, None])


def _attention(
    cfg: ExactConfig,
    params: Params,
    layer: int,
    x_query: torch.Tensor,
    x: torch.Tensor,
    key_mask: torch.Tensor | None,
    log_n: torch.Tensor,
) -> torch.Tensor:
    """Softmax attention of every run: x_query [R, B, q, m], x [R, B, p, m] -> [R, B, q, m]."""
    p = f"blocks.{layer}.attn."
    runs, batch = x.shape[:2]

    def project(inp: torch.Tensor, kind: str) -> torch.Tensor:  # [R, B, pos, m] -> [R*B, h, pos, d]
        out = torch.einsum("rbpm,rhmd->rbhpd", inp, params[p + "W_" + kind]) + params[p + "b_" + kind][:, None, :, None]
        return out.flatten(0, 1)

    q = project(x_query, "Q") * (1.0 / cfg.scale_divisor)
    if cfg.per_layer("attn_length_scale")[layer] == "log_n":  # Chiang & Cholak eq. 2
        q = q * log_n
    z = F.scaled_dot_product_attention(q, project(x, "K"), project(x, "V"), attn_mask=key_mask, scale=1.0)
    z = z.unflatten(0, (runs, batch)).transpose(2, 3).flatten(3)  # [R, B, q, h*d]
    return _linear(z, params[p + "W_O"].flatten(1, 2), params[p + "b_O"])


def _mlp(cfg: ExactConfig, params: Params, layer: int, x: torch.Tensor) -> torch.Tensor:
    p = f"blocks.{layer}.mlp."
    hidden = _ACTIVATIONS[cfg.per_layer("act_fn")[layer]](_linear(x, params[p + "W_in"], params[p + "b_in"]))
    return _linear(hidden, params[p + "W_out"], params[p + "b_out"])


def _embed(cfg: ExactConfig, params: Params, tokens: torch.Tensor, n_positions: torch.Tensor, padded: bool):
    runs, _, n_pos = tokens.shape
    table = params["embed.W_E"]  # [R, V, d]: one gather over the runs' tables laid end to end
    offsets = torch.arange(runs)[:, None, None] * cfg.d_vocab
    x = table.flatten(0, 1)[tokens + offsets]  # [R, B, n, d]
    if cfg.learned_positions:
        return x + params["pos_embed.W_pos"][:, None, :n_pos]
    if not cfg.positional_features:
        return x
    w_feat = params["pos_embed.W_feat"]  # [R, f, d]
    if padded:
        feats = evaluate_features(cfg.positional_features, n_pos, n_positions.flatten(), w_feat.dtype)
        return x + feats.unflatten(0, tokens.shape[:2]) @ w_feat[:, None]
    feats = evaluate_features(cfg.positional_features, n_pos, n_positions.flatten()[:1], w_feat.dtype)[0]
    return x + (feats @ w_feat)[:, None]  # one n for every row: features computed once


def stacked_cls_logits(
    cfg: ExactConfig, params: Params, tokens: torch.Tensor, n_positions: torch.Tensor
) -> torch.Tensor:
    """CLS logits of R runs, [R, B, d_vocab_out]: params from stack_parameters (or
    model_parameters), tokens [R, B, pos] right-padded, n_positions [R, B] real positions
    (the caller checks token ids and lengths, as ExactTransformer._check_input does)."""
    if not supports(cfg):
        raise ExactLensError(f"the training fast path does not cover this configuration ({cfg.model_name})")
    n_pos = tokens.shape[-1]
    padded = bool((n_positions != n_pos).any())
    key_mask = None
    if padded:
        key_mask = (torch.arange(n_pos) < n_positions.flatten()[:, None])[:, None, None, :]  # [R*B, 1, 1, key]
    log_n = torch.log(n_positions.flatten().to(cfg.torch_dtype))[:, None, None, None]
    x = _embed(cfg, params, tokens, n_positions, padded)
    norm = cfg.uniform("normalization")
    pre, post = norm == "pre", norm == "post"
    for layer in range(cfg.n_layers):
        last = layer == cfg.n_layers - 1
        attn_in = _layer_norm(cfg, params, f"blocks.{layer}.ln1", x) if pre else x
        query_in = attn_in[:, :, :1] if last else attn_in
        mid = (x[:, :, :1] if last else x) + _attention(cfg, params, layer, query_in, attn_in, key_mask, log_n)
        if post:
            mid = _layer_norm(cfg, params, f"blocks.{layer}.ln1", mid)
        if cfg.d_mlp == 0:
            x = mid
            continue
        out = mid + _mlp(cfg, params, layer, _layer_norm(cfg, params, f"blocks.{layer}.ln2", mid) if pre else mid)
        x = _layer_norm(cfg, params, f"blocks.{layer}.ln2", out) if post else out
    if pre:
        x = _layer_norm(cfg, params, "ln_final", x)
    return _linear(x[:, :, 0], params["unembed.W_U"], params["unembed.b_U"])

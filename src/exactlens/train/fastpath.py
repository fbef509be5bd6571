"""A faster forward for training: the CLS logits of an ExactTransformer, same weights.

Training reads one output, the logits at [CLS] (position 0). Two things follow, both
exact (the same function and gradients as ``model(tokens, n_positions)[:, 0]``):

- in the last layer only the CLS query matters, so its attention is one row (1 x n)
  instead of n x n, and its FFN and layer norms run at one position;
- attention runs through torch's fused scaled_dot_product_attention (no n x n softmax
  tensor kept for the backward pass), with the model's 1/divisor and log n factors
  applied to the query first, as ExactTransformer's Attention does.

Everything else (embeddings, positional features, layer norm, FFN, unembedding) calls
the model's own modules. Configurations outside what this covers (hard or unnormalized
attention, structural masks, log_visible, per-head results, a readout elsewhere than
position 0) use the model's forward; ``supports`` says which. Tests compare the two.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from exactlens.model import ExactTransformer


def supports(model: ExactTransformer) -> bool:
    cfg = model.cfg
    return (
        cfg.readout_position == 0
        and set(cfg.per_layer("attention_weighting")) == {"softmax"}
        and set(cfg.per_layer("attention_mask")) == {"none"}
        and set(cfg.per_layer("attn_length_scale")) <= {"none", "log_n"}
        and not cfg.use_attn_result
        and cfg.uniform("normalization") is not None
        and not cfg.ln_select
    )


def _attention(block, x_query: torch.Tensor, x: torch.Tensor, key_mask, log_n) -> torch.Tensor:
    attn = block.attn
    q = torch.einsum("bpm,hmd->bhpd", x_query, attn.W_Q) + attn.b_Q[:, None, :]
    k = torch.einsum("bpm,hmd->bhpd", x, attn.W_K) + attn.b_K[:, None, :]
    v = torch.einsum("bpm,hmd->bhpd", x, attn.W_V) + attn.b_V[:, None, :]
    q = q * (1.0 / attn.cfg.scale_divisor)
    if attn.length_scale == "log_n":  # Chiang & Cholak eq. 2
        q = q * log_n
    z = F.scaled_dot_product_attention(q, k, v, attn_mask=key_mask, scale=1.0)  # [b, h, q, d]
    return z.transpose(1, 2).flatten(2) @ attn.W_O.flatten(0, 1) + attn.b_O


def cls_logits(model: ExactTransformer, tokens: torch.Tensor, n_positions: torch.Tensor | None = None) -> torch.Tensor:
    """The logits at position 0, [batch, d_vocab_out]; n_positions for right-padded rows."""
    cfg = model.cfg
    padded = n_positions is not None
    n_positions = model._check_input(tokens, n_positions)
    n_pos = tokens.shape[1]
    padded = padded and bool((n_positions != n_pos).any())
    key_mask = None
    if padded:
        key_mask = (torch.arange(n_pos) < n_positions[:, None])[:, None, None, :]  # [b, 1, 1, key]
    log_n = torch.log(n_positions.to(cfg.torch_dtype))[:, None, None, None]
    x = model.embed(tokens) + model.pos_embed(n_pos, n_positions, padded)
    norm = cfg.uniform("normalization")
    pre, post = norm == "pre", norm == "post"
    for index, block in enumerate(model.blocks):
        last = index == len(model.blocks) - 1
        attn_in = block.ln1(x) if pre else x
        query_in = attn_in[:, :1] if last else attn_in
        mid = (x[:, :1] if last else x) + _attention(block, query_in, attn_in, key_mask, log_n)
        if post:
            mid = block.ln1(mid)
        if block.mlp is None:
            x = mid
            continue
        out = mid + block.mlp(block.ln2(mid) if pre else mid)
        x = block.ln2(out) if post else out
    if pre:
        x = model.ln_final(x)
    return model.unembed(x[:, 0])

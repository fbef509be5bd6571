"""The MAJORITY preset's training loss computed from each word's token counts (exact, 4.7x per step).

The ``majority-per-position`` model has no positional encoding and no attention mask, so it is
permutation-equivariant: two positions that hold the same token have the same residual stream in
every layer (they read the same multiset of keys). A word of n tokens is therefore fully described
by its counts c_t, and softmax attention over its n keys equals softmax attention over the distinct
tokens with the score of token t raised by log c_t (t's c_t equal keys share exp(s) c_t of the
mass; absent tokens get -inf). The per-position cross-entropy averaged over the word's positions is
sum_t c_t CE(logits_t, target) / n. Instead of [batch, 50, 50] scores per run the first layer computes
[vocab, vocab] scores once and the weighted values by two matrix products per run: at the paper's batch of 6000 words
the whole step is 4.7x faster (2.08 vs 9.66 s for 10 runs, measured side by side by
benchmarks/brody_majority.py --time-only; sampling, the FFN and the readout remain per word).

:func:`counted_losses` is the preset's ``losses`` hook (exactlens.train.presets): the same per-run
mean loss and number of words with every position right as the training loop's default path
(the model's readout under the task's loss), computed from the stacked parameters. The option
``counted_loss=False`` makes the loop use the default path; tests/papers/brody/test_counted_loss.py
compares the two (losses and gradients, every layer norm variant, float64 and float32).
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F

from exactlens.errors import ExactLensError

_ACT = {"relu": F.relu, "gelu": F.gelu, "identity": lambda x: x}


def check_countable(config: Any) -> None:
    """Raise unless the configuration is permutation-equivariant in the way the counted loss needs."""
    problems = []
    if config.positional_features or config.learned_positions:
        problems.append("positional features or learned positions (need none)")
    if set(config.per_layer("attention_mask")) != {"none"}:
        problems.append("an attention mask (need 'none')")
    if set(config.per_layer("attention_weighting")) != {"softmax"}:
        problems.append("attention weighting other than softmax")
    if set(config.per_layer("attn_length_scale")) != {"none"}:
        problems.append("a length-dependent attention scale")
    if config.readout != "per_position" or config.ln_select or not config.mlp_residual:
        problems.append("a readout other than per position, ln_select or mlp_residual=False")
    if problems:
        raise ExactLensError("the counted loss needs a position-free, unmasked softmax model: " + "; ".join(problems))


def _norm(x: torch.Tensor, params: dict[str, torch.Tensor], prefix: str, config: Any) -> torch.Tensor:
    """exactlens.model.components.LayerNorm on stacked parameters [R, d] (x [R, ..., d])."""
    if config.ln_center and config.ln_scale:  # torch's fused kernels: one pass forward and backward
        x = F.layer_norm(x, x.shape[-1:], eps=config.ln_eps)
    elif config.ln_scale:
        x = F.rms_norm(x, x.shape[-1:], eps=config.ln_eps)
    elif config.ln_center:
        x = x - x.mean(-1, keepdim=True)
    shape = (x.shape[0],) + (1,) * (x.ndim - 2) + (x.shape[-1],)
    return x * params[f"{prefix}.w"].view(shape) + params[f"{prefix}.b"].view(shape)


def _expand(p: torch.Tensor, ndim: int) -> torch.Tensor:
    """A stacked parameter [R, *rest] viewed with singleton axes so it broadcasts against [R, ..., *rest]."""
    return p.view(p.shape[0], *([1] * (ndim - p.ndim)), *p.shape[1:])


def _linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """x [R, ..., m] @ weight [R, m, n] + bias [R, n] as one batched product per run (not one tiny
    product per word: broadcasting [R, B, V, m] against [R, 1, m, n] would launch R * B of them)."""
    flat = x.reshape(x.shape[0], -1, x.shape[-1]) @ weight + bias[:, None]
    return flat.view(*x.shape[:-1], weight.shape[-1])


def _shared_key_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, counts: torch.Tensor,
                          divisor: float) -> torch.Tensor | None:
    """Attention of every token's query over every word's keys when keys and values are the same in
    every word (the first layer): q, k, v [R, h, V, d_head], counts [R, B, V] -> z [R, B, h, V, d_head].
    With E = exp(S - max_k S) of the shared scores S [R, h, V, V], a word's weights are c_k E_qk /
    sum_k' c_k' E_qk', so z = (counts @ (E * v)) / (counts @ E^T): two matrix products per run, no
    [B, V, V] tensor. None where some denominator is so small that exp underflow could cost accuracy
    (a word whose present keys all score far below an absent one): the caller then takes the per-word
    softmax."""
    scores = q @ k.transpose(-1, -2) / divisor  # [R, h, Vq, Vk]
    e = torch.exp(scores - scores.amax(-1, keepdim=True))
    c = counts.to(q.dtype)  # [R, B, Vk]
    runs, heads, vocab, d_head = v.shape
    den = c @ e.permute(0, 3, 1, 2).reshape(runs, vocab, heads * vocab)  # [R, B, h * Vq]
    if bool((den < torch.finfo(q.dtype).tiny ** 0.5).any()):
        return None
    weighted = (e[..., None] * v[:, :, None]).permute(0, 3, 1, 2, 4)  # [R, Vk, h, Vq, d_head]
    num = c @ weighted.reshape(runs, vocab, heads * vocab * d_head)  # [R, B, h * Vq * d_head]
    batch = counts.shape[1]
    return num.view(runs, batch, heads, vocab, d_head) / den.view(runs, batch, heads, vocab, 1)


def counted_logits(params: dict[str, torch.Tensor], config: Any, counts: torch.Tensor) -> torch.Tensor:
    """Output logits [R, B, V, classes] of token t in each word, for token counts [R, B, V] (every
    word with at least one token): the model's per-position logits at any position holding t."""
    x = params["embed.W_E"][:, None]  # [R, 1, V, d]: before attention a position is its token
    log_counts = None
    for layer, norm in enumerate(config.per_layer("normalization")):
        p = f"blocks.{layer}"
        attn_in = _norm(x, params, f"{p}.ln1", config) if norm == "pre" else x
        q, k, v = (torch.einsum("rbtm,rhmd->rbhtd", attn_in, params[f"{p}.attn.W_{n}"])
                   + _expand(params[f"{p}.attn.b_{n}"], 5).transpose(2, 3) for n in "QKV")
        z = _shared_key_attention(q[:, 0], k[:, 0], v[:, 0], counts, config.scale_divisor) if x.shape[1] == 1 else None
        if z is None:  # keys differ per word (later layers) or the shared form could underflow
            if log_counts is None:
                log_counts = torch.where(counts > 0, counts.to(x.dtype).clamp(min=1).log(), -math.inf)
            scores = q @ k.transpose(-1, -2) / config.scale_divisor + log_counts[:, :, None, None, :]
            z = torch.softmax(scores, dim=-1) @ v  # [R, B, h, V, d_head]
        z = z.transpose(2, 3).flatten(3)  # [R, B, V, h * d_head]
        mid = x + _linear(z, params[f"{p}.attn.W_O"].flatten(1, 2), params[f"{p}.attn.b_O"])
        if norm == "post":
            mid = _norm(mid, params, f"{p}.ln1", config)
        if f"{p}.mlp.W_in" not in params:
            x = mid
            continue
        mlp_in = _norm(mid, params, f"{p}.ln2", config) if norm == "pre" else mid
        act = _ACT[config.per_layer("act_fn")[layer]]
        hidden = act(_linear(mlp_in, params[f"{p}.mlp.W_in"], params[f"{p}.mlp.b_in"]))
        x = mid + _linear(hidden, params[f"{p}.mlp.W_out"], params[f"{p}.mlp.b_out"])
        if norm == "post":
            x = _norm(x, params, f"{p}.ln2", config)
    if config.final_ln:
        x = _norm(x, params, "ln_final", config)
    return _linear(x, params["unembed.W_U"], params["unembed.b_U"])


def token_counts(tokens: torch.Tensor, n_positions: torch.Tensor, vocab: int) -> torch.Tensor:
    """Counts [R, B, vocab] of the real (unpadded) tokens of tokens [R, B, pos]."""
    real = torch.arange(tokens.shape[-1], device=tokens.device) < n_positions[..., None]
    counts = torch.zeros(*tokens.shape[:2], vocab, dtype=torch.long, device=tokens.device)
    return counts.scatter_add_(2, tokens.long(), real.long())


def counted_losses(spec: Any, params: dict[str, torch.Tensor], tokens: torch.Tensor, n_positions: torch.Tensor,
                   targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The preset's ``losses`` hook: per-run mean per-position cross-entropy (nats) [R] and words with
    every position right [R], from counts; None (the loop's default path) with ``counted_loss=False``."""
    if not spec.options.get("counted_loss", True):
        return None
    config = spec.config
    check_countable(config)
    task = spec.task
    if task.use_cls or task.use_eos:
        raise ExactLensError("the counted loss needs a task without special tokens (every position is a symbol)")
    valid = torch.arange(targets.shape[-1], device=targets.device) < n_positions[..., None]
    target = targets[..., 0].long()  # [R, B]
    if bool(((targets != target[..., None]) & valid).any()):
        raise ExactLensError("the counted loss needs one target per word (the same at every position)")
    counts = token_counts(tokens, n_positions, config.d_vocab)
    logits = counted_logits(params, config, counts)  # [R, B, V, classes]
    log_p = torch.log_softmax(logits, dim=-1)
    nll = -log_p.gather(-1, target[..., None, None].expand(*logits.shape[:-1], 1))[..., 0]  # [R, B, V]
    weights = counts.to(nll.dtype)
    losses = ((nll * weights).sum(-1) / n_positions.to(nll.dtype)).mean(-1)
    with torch.no_grad():
        wrong = (logits.argmax(-1) != target[..., None]) & (counts > 0)
        right = (~wrong.any(-1)).sum(-1).to(torch.float64)
    return losses, right

"""Layer norm as weight transforms and recipes: Chiang & Cholak §4.1 and Prop. 2, Transformer Cookbook §6.

``double_for_post_ln`` is Chiang & Cholak §4.1, the Cookbook's §6.3 "circumvent LN with [x, -x]":
every activation x becomes [x; -x] (label "-(x)"), whose mean is 0, so post-LN only divides each
position by one scale s = rms. ``pair_for_layer_norm`` is the same with the Cookbook's check of eps.
``append_confidence_layer`` is the extra layer of Prop. 2: with eps = 0 it maps the logit s to
±sqrt(d/2) whatever |s| is, so the readout can be scaled to any cross-entropy eta.

§6.4 amplification: with eps = 0, LN maps any nonzero vector to norm sqrt(d), so after clipping
every component to [-delta, delta] (an FFN, §4.1) a difference as small as delta becomes +-1.
``amplify`` is that FFN as a layer of a post-LN program.

(``exactlens.constructions.layer_norm``, the old home of the Chiang & Cholak transforms, re-exports them.)
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from exactlens.constructions.cookbook import ffn
from exactlens.constructions.cookbook.layers import Layer
from exactlens.errors import ExactLensError
from exactlens.model import ExactTransformer
from exactlens.model.labels import negated_label

__all__ = [
    "amplify", "append_confidence_layer", "confidence_scale", "double_for_post_ln", "negated_label",
    "pair_for_layer_norm",
]


def _negated_labels(labels: tuple[str, ...]) -> tuple[str, ...]:
    return labels + tuple(negated_label(label) for label in labels)


@torch.no_grad()
def double_for_post_ln(model: ExactTransformer, eps: float) -> ExactTransformer:
    """The §4.1 model: residual [x; -x] (d -> 2d), post-LN with gamma=1, beta=0.

    Each head's value map W^V (composed with W_O) becomes the paper's
    [[W^V, 0], [-W^V, 0]] as one explicit 2d x 2d value matrix (d_head = 2d,
    W_O = I), so that single entries such as W̄^{V,1,1}_{6,2} (Fig. 3) are
    parameters. Queries and keys read the first half only; scores are divided
    by sqrt(2d), the new model's sqrt(d) (or by cfg.attn_scale when one is set).
    """
    cfg = model.cfg
    if cfg.normalization != "none":
        raise ExactLensError(f"double_for_post_ln takes a model without layer norm, got {cfg.normalization!r}")
    # With the default scale the divisor becomes sqrt(2d) (the paper's); an explicit
    # attn_scale (e.g. 1 in cookbook programs) is kept, so scores before LN are unchanged.
    d = cfg.d_model
    new = ExactTransformer(
        cfg.replace(
            d_model=2 * d,
            d_head=2 * d,
            normalization="post",
            ln_eps=eps,
            ln_affine=False,
            residual_labels=_negated_labels(cfg.residual_labels or tuple(f"dim{i}" for i in range(d))),
            metadata=dict(cfg.metadata, ln_eps=eps),
        )
    )

    def both(t: torch.Tensor) -> torch.Tensor:  # [..., d] -> [..., 2d] as [t, -t]
        return torch.cat([t, -t], dim=-1)

    def first_half(t: torch.Tensor) -> torch.Tensor:  # rows read [x; -x]'s first half
        return torch.cat([t, torch.zeros_like(t)], dim=-2)

    new.embed.W_E.copy_(both(model.embed.W_E))
    if cfg.learned_positions:
        new.pos_embed.W_pos.copy_(both(model.pos_embed.W_pos))
    else:
        new.pos_embed.W_feat.copy_(both(model.pos_embed.W_feat))
    dh = cfg.d_head
    for old_block, block in zip(model.blocks, new.blocks, strict=True):
        old, att = old_block.attn, block.attn
        att.W_Q.zero_()
        att.W_K.zero_()
        att.W_Q[:, :d, :dh] = old.W_Q
        att.W_K[:, :d, :dh] = old.W_K
        att.b_Q[:, :dh] = old.b_Q
        att.b_K[:, :dh] = old.b_K
        value = torch.einsum("hmd,hdo->hmo", old.W_V, old.W_O)  # (W^V)^T per head, [h, d, d]
        value_bias = torch.einsum("hd,hdo->ho", old.b_V, old.W_O)
        att.W_V.zero_()
        att.W_V[:, :d, :] = both(value)
        att.b_V.copy_(both(value_bias))
        att.W_O.copy_(torch.eye(2 * d, dtype=att.W_O.dtype).expand_as(att.W_O))
        att.b_O.copy_(both(old.b_O))
        if old_block.mlp is not None:
            mlp, old_mlp = block.mlp, old_block.mlp
            mlp.W_in.copy_(first_half(old_mlp.W_in))
            mlp.b_in.copy_(old_mlp.b_in)
            mlp.W_out.copy_(both(old_mlp.W_out))
            mlp.b_out.copy_(both(old_mlp.b_out))
    new.unembed.W_U.copy_(first_half(model.unembed.W_U))
    new.unembed.b_U.copy_(model.unembed.b_U)
    return new


def confidence_scale(eta_bits: float, d: int) -> float:
    """Prop. 2's output weight c = -log(exp(eta) - 1) / sqrt(d/2), with eta in nats
    (we take eta in bits, the unit of reported cross-entropy)."""
    # eta >= 1 bit would make c <= 0: the logit would be 0 or of the wrong sign (no longer recognizing).
    if not (isinstance(eta_bits, (int, float)) and not isinstance(eta_bits, bool) and 0 < eta_bits < 1):
        raise ExactLensError(
            f"eta must be a number in (0, 1) (bits of cross-entropy per string; at >= 1 bit every decision "
            f"would be wrong or undecided), got {eta_bits!r}"
        )
    eta = eta_bits * math.log(2)
    return -math.log(math.expm1(eta)) / math.sqrt(d / 2)


@torch.no_grad()
def append_confidence_layer(model: ExactTransformer, eta_bits: float) -> ExactTransformer:
    """Chiang & Cholak Prop. 2: a new last layer whose attention does nothing and
    whose FFN cancels the residual and writes [s, -s, 0, ...], s = the old logit;
    post-LN with eps = 0 turns it into [±sqrt(d/2), ∓sqrt(d/2), 0...]; the new
    readout is c times dimension 1. Cross-entropy is then exactly eta for every string.
    """
    cfg = model.cfg
    if cfg.normalization != "post" or cfg.ln_eps != 0:
        raise ExactLensError("Prop. 2 needs post layer norm with eps = 0 (the layer relies on exact unit variance)")
    if cfg.readout != "sigmoid":
        raise ExactLensError("Prop. 2 applies to a sigmoid readout")
    d = cfg.d_model
    c = confidence_scale(eta_bits, d)
    labels = list(cfg.residual_labels or tuple(f"dim{i}" for i in range(d)))
    labels[0] = f"{labels[0]} | s̄ (layer {cfg.n_layers + 1})"
    labels[1] = f"{labels[1]} | -s̄ (layer {cfg.n_layers + 1})"
    new = ExactTransformer(
        cfg.replace(
            n_layers=cfg.n_layers + 1,
            d_mlp=max(cfg.d_mlp, 2 * d),
            residual_labels=tuple(labels),
            metadata=dict(cfg.metadata, eta_bits=eta_bits, confidence_scale=c),
        )
    )
    old_state = model.state_dict()
    new_state = new.state_dict()
    for key, value in old_state.items():
        target = new_state[key]
        target.zero_()
        target[tuple(slice(0, s) for s in value.shape)] = value
    new.load_state_dict(new_state)
    last = new.blocks[cfg.n_layers]
    w_out, b_out = model.unembed.W_U[:, 0], model.unembed.b_U[0]
    eye = torch.eye(d, dtype=w_out.dtype)
    last.mlp.W_in[:, :d] = eye  # hidden = [relu(x), relu(-x)]
    last.mlp.W_in[:, d : 2 * d] = -eye
    # W^{F,2} = [-I, I] + [[W, -W], [-W, W], 0]: cancels the residual, writes [s, -s, 0].
    last.mlp.W_out[:d, :] = -eye
    last.mlp.W_out[d : 2 * d, :] = eye
    last.mlp.W_out[:d, 0] += w_out
    last.mlp.W_out[d : 2 * d, 0] -= w_out
    last.mlp.W_out[:d, 1] -= w_out
    last.mlp.W_out[d : 2 * d, 1] += w_out
    last.mlp.b_out[0] = b_out
    last.mlp.b_out[1] = -b_out
    new.unembed.W_U.zero_()
    new.unembed.W_U[0, 0] = c
    new.unembed.b_U.zero_()
    return new


def pair_for_layer_norm(model: ExactTransformer, eps: float = 0.0) -> ExactTransformer:
    """§6.3: the model with residual [x; -x] and post-LN (gain 1, bias 0, given eps)."""
    if not eps >= 0:
        raise ExactLensError(f"eps must be >= 0, got {eps!r}")
    return double_for_post_ln(model, eps)


def amplify(labels: Sequence[str], delta: float) -> Layer:
    """§6.4: a layer whose FFN replaces every listed label by clip(x, -delta, delta). In a
    post-LN program with ln_eps = 0 whose residual is exactly ``labels`` in +- pairs (mean
    0), the next LN maps each component with |x| >= delta (after the attention LN) to
    +-sqrt(d / m), m = the number of nonzero components: differences are amplified."""
    if not labels:
        raise ExactLensError("amplify needs the labels of the whole residual stream")
    return Layer(ffns=(ffn.clip(labels, delta, name="amplify-clip"),))

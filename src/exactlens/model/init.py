"""The initializer: PyTorch's default initialization, mapped onto ExactTransformer's parameters.

Chiang & Cholak §5.1 and Nowak et al. §4.2 train with "PyTorch's default
initialization" of torch.nn.TransformerEncoderLayer. Its distributions, per tensor:

- word embeddings (nn.Embedding): N(0, 1);
- W_Q, W_K, W_V (MultiheadAttention's packed in_proj [3d, d]): Xavier uniform,
  bound sqrt(6 / (d + 3d)); their biases 0;
- W_O (out_proj, nn.Linear(d, d)): uniform with bound 1/sqrt(d); its bias 0;
- FFN and output layers (nn.Linear(fan_in, fan_out)): weight and bias uniform with
  bound 1/sqrt(fan_in);
- the linear map of fixed positional features (nn.Linear(n_features, d)): the same;
- layer norm: gain 1, bias 0.

Draws are made in float64 in the order of named_parameters() from one generator and
then cast, so a seed gives the same initial weights in float32 and float64. ``scale``
multiplies every random draw (1 = PyTorch's). Frozen parameters (requires_grad False, e.g.
attn_bias=False) keep their values. ``ExactTransformer.init_weights`` calls this.
"""

from __future__ import annotations

import math

import torch

from exactlens.errors import ExactLensError


def _uniform(shape: torch.Size, bound: float, gen: torch.Generator) -> torch.Tensor:
    return (torch.rand(shape, generator=gen, dtype=torch.float64) * 2 - 1) * bound


def initialize(model: torch.nn.Module, generator: torch.Generator, scale: float = 1.0) -> torch.nn.Module:
    """``model``: an ExactTransformer (annotated as its base class: exactlens.model.transformer imports this module,
    so this one does not import it)."""
    if not (isinstance(scale, (int, float)) and not isinstance(scale, bool) and math.isfinite(scale) and scale >= 0):
        raise ExactLensError(f"scale must be a finite number >= 0, got {scale!r}")
    cfg = model.cfg
    d = cfg.d_model
    with torch.no_grad():
        for name, p in model.named_parameters():
            leaf = name.rsplit(".", 1)[-1]
            if not p.requires_grad:  # frozen (e.g. attn_bias=False): stays as built (zeros)
                continue
            if leaf == "W_E":
                value = torch.randn(p.shape, generator=generator, dtype=torch.float64)
            elif leaf in ("W_Q", "W_K", "W_V"):
                value = _uniform(p.shape, math.sqrt(6.0 / (4 * d)), generator)
            elif leaf == "W_O":
                value = _uniform(p.shape, 1 / math.sqrt(cfg.n_heads * cfg.d_head), generator)
            elif leaf in ("b_Q", "b_K", "b_V", "b_O"):
                value = torch.zeros(p.shape, dtype=torch.float64)
            elif leaf in ("W_in", "b_in"):
                value = _uniform(p.shape, 1 / math.sqrt(d), generator)
            elif leaf in ("W_out", "b_out"):
                value = _uniform(p.shape, 1 / math.sqrt(cfg.d_mlp), generator)
            elif leaf in ("W_U", "b_U"):
                value = _uniform(p.shape, 1 / math.sqrt(d), generator)
            elif leaf == "W_feat":
                value = _uniform(p.shape, 1 / math.sqrt(max(p.shape[0], 1)), generator)
            elif leaf == "W_pos":  # a learned table, like nn.Embedding
                value = torch.randn(p.shape, generator=generator, dtype=torch.float64)
            elif leaf == "w":  # layer-norm gain
                value = torch.ones(p.shape, dtype=torch.float64)
            elif leaf == "b":  # layer-norm bias
                value = torch.zeros(p.shape, dtype=torch.float64)
            elif leaf == "W_select":  # selective LN (Cookbook §5.3.3): start as plain LN
                value = torch.eye(p.shape[0], dtype=torch.float64)
            else:  # a parameter this mapping does not know: fan-in uniform, like nn.Linear
                fan_in = p.shape[-2] if p.ndim >= 2 else p.shape[-1]
                value = _uniform(p.shape, 1 / math.sqrt(max(fan_in, 1)), generator)
            p.copy_(value * scale if leaf not in ("w", "W_select") else value)
    return model

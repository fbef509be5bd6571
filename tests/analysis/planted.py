"""Planted models for the DAS illusion check (issue 29): FIRST with a dormant copy head.

``first_with_dormant_copy()``: the exact ``first`` construction with one extra first-layer head that
copies w_1 into a new residual dimension at [CLS] ("w_1 copy") which nothing reads. Its decisions
are ``first``'s on every word; but a subspace mixing the dormant copy with the unembedding's ``s``
(read, not yet written in the first layer) swaps the answer in the first layer: the
dormant/disconnected illusion of Makelov et al. 2023.
"""

from __future__ import annotations

import torch

from exactlens.constructions import build
from exactlens.model import ExactTransformer

COPY_GAIN = 60.0  # attention score of [CLS] -> position 1 (others 0): all but e^-60 n of the weight


def first_with_dormant_copy() -> ExactTransformer:
    base = build("first", dtype="float64")
    cfg = base.cfg
    labels = list(base.cfg.residual_labels)
    d, d_head = cfg.d_model + 1, cfg.d_head
    model = ExactTransformer(cfg.replace(d_model=d, n_heads=2, residual_labels=tuple(labels + ["w_1 copy"])))
    old = dict(base.named_parameters())
    cls, one, first_pos = labels.index("I[w_i=CLS]"), labels.index("I[w_i=1]"), labels.index("I[i=1]")
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.zero_()
            w = old[name]
            index = tuple(slice(0, n) for n in w.shape)
            p[index] = w  # the construction's weights; the new head and the new dimension start at zero
        attn = model.blocks[0].attn
        attn.W_Q[1, cls, 0] = 1.0
        attn.W_K[1, first_pos, 0] = COPY_GAIN * (attn.W_K.shape[-1] ** 0.5 if cfg.attn_scale is None else 1.0)
        attn.W_V[1, one, 0] = 1.0
        attn.W_O[1, 0, d - 1] = 1.0
    del d_head
    return model.eval()

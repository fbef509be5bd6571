"""A precision-robust PALINDROME from Transformer Cookbook ingredients (our design).

Nowak et al.'s construction (§3.2) compares two base-2 numbers read off one softmax,
so its signal is O(2^-n) (App. A) and rounding wins at |w| = 45 in float32. Here the
comparison is done position by position instead, so every quantity stays O(1) or O(1/n):

Layer 1, attention (index lookup by quadratic maximization, Cookbook §5.3.4):
    query at i: q = lam [2 (n-1-i), -1],  key at j: k = [j, j^2],
    score(i, j) = lam (2 (n-1-i) j - j^2) = lam ((n-1-i)^2 - (j - (n-1-i))^2),
    uniquely maximized at the mirror j = n-1-i with a gap of at least lam to every other key.
    The head copies I[w_j = 1] into "w_(n-1-i)". With softmax, lam is the gap magnifier of
    Cookbook §5.7: lam = 128 (float32) / 1024 (float64) make e^-lam underflow to exactly 0,
    so the soft weights are bit-for-bit the hard (one-hot) ones.
Layer 1, FFN: mismatch_i = relu(w_i - w_(n-1-i)) + relu(w_(n-1-i) - w_i) = |w_i - w_(n-1-i)|.
Layer 2, attention: uniform (W^Q = W^K = 0) averages mismatch -> M/n and I[CLS] -> 1/n.
Readout: logit = (1/2) (1/n) - M/n = (1/2 - M)/n, positive iff M = 0 (M counts mismatched
positions, so a non-palindrome has M >= 2 and logit <= -3/(2n)). Margin: |logit| >= 1/(2n).

Limit: the scores are exact integers (times the power of two lam) as long as n^2 < 2^24
(float32) / 2^53 (float64), i.e. n <= 4096 / n < 9.4e7 positions; beyond that rounding can
tie or flip the mirror with its neighbour. In float64 the practical limit is the n x n
attention memory (8 n^2 bytes per score tensor).
"""

from __future__ import annotations

import math

import torch

from exactlens.constructions.builder import LabelledModel, labelled_config, token_labels
from exactlens.dtypes import dtype_name
from exactlens.errors import ExactLensError
from exactlens.model import ExactTransformer
from exactlens.tasks import Palindrome

ROBUST_LABELS = (
    *token_labels(Palindrome().vocab),
    "i",
    "n-1-i",
    "i^2",
    "w_(n-1-i)",
    "mismatch_i",
    "M/n",
    "1/n",
)
# Powers of two whose e^-lam underflows to 0 (float32 subnormals end near e^-103, float64 near e^-745).
UNDERFLOW_GAP_SCALE = {"float32": 128.0, "float64": 1024.0}
LOOKUPS = ("softmax", "average_hard")


def palindrome_robust(
    dtype: str = "float32", lookup: str = "softmax", gap_scale: float | None = None
) -> ExactTransformer:
    """Mirror lookup + position-wise mismatch + uniform average; logit (1/2 - M)/n."""
    if lookup not in LOOKUPS:
        raise ExactLensError(f"lookup={lookup!r} is not allowed; choose one of {', '.join(LOOKUPS)}")
    dtype = dtype_name(dtype)
    if gap_scale is None:
        gap_scale = UNDERFLOW_GAP_SCALE[dtype]
    if not (
        isinstance(gap_scale, (int, float))
        and not isinstance(gap_scale, bool)
        and gap_scale > 0
        and math.isfinite(gap_scale)
    ):
        raise ExactLensError(f"gap_scale must be a finite number > 0 (or None: per dtype), got {gap_scale!r}")
    lam = float(gap_scale)
    vocab = Palindrome().vocab
    positions = ("i", "n-1-i", "i^2")
    cfg = labelled_config(
        "palindrome-robust", ROBUST_LABELS, vocab, layers=2, heads=1, d_mlp=2, positions=positions, dtype=dtype,
        metadata={"lookup": lookup, "gap_scale": lam, "paper": "ours, from Yang et al. 2025 §5.3.4, §5.7"},
        d_head=2, attention_weighting=(lookup, "softmax"), attn_scale=1.0,
    )
    b = LabelledModel(cfg)
    b.embed_one_hot_tokens()
    for feature in positions:
        b.position(feature, {feature: 1})
    with torch.no_grad():
        mirror = b.model.blocks[0].attn
        mirror.W_Q[0, b.dim("n-1-i"), 0] = 2 * lam
        mirror.b_Q[0, 1] = -lam
        mirror.W_K[0, b.dim("i"), 0] = 1
        mirror.W_K[0, b.dim("i^2"), 1] = 1
        mirror.W_V[0, b.dim("I[w_i=1]"), 0] = 1
        mirror.W_O[0, 0, b.dim("w_(n-1-i)")] = 1
        average = b.model.blocks[1].attn  # W^Q = W^K = 0: uniform weights 1/n
        average.W_V[0, b.dim("mismatch_i"), 0] = 1
        average.W_V[0, b.dim("I[w_i=CLS]"), 1] = 1
        average.W_O[0, 0, b.dim("M/n")] = 1
        average.W_O[0, 1, b.dim("1/n")] = 1
    b.ffn(0, [{"I[w_i=1]": 1, "w_(n-1-i)": -1}, {"I[w_i=1]": -1, "w_(n-1-i)": 1}], {"mismatch_i": [1, 1]})
    b.readout({"1/n": 0.5, "M/n": -1})
    return b.model

"""Nowak et al. (2022): exact transformers for ONE (§3.1) and PALINDROME (§3.2).

Written from the paper's equations (the authors' code departs from them).
Notation: n is the number of positions, [CLS] at 0 (and [EOS] at n-1 for
PALINDROME), so n = |w| + 1 for ONE and n = |w| + 2 for PALINDROME; k is the
number of 1s. Residual dimensions carry the paper's meanings as labels.
"""

from __future__ import annotations

import math

import torch

from exactlens.constructions.builder import LabelledModel, labelled_config, token_labels
from exactlens.model import ExactTransformer
from exactlens.tasks import One, Palindrome
from exactlens.tasks.decisions import DecisionRule

ONE_LABELS = ("I[w_i=0]", "I[w_i=1]", "I[w_i=CLS]", "i/n", "k/n", "1/n", "s")
PALINDROME_LABELS = (
    *token_labels(Palindrome().vocab),
    "i",
    "n-1-i",
    "I[i<=(n-1)/2]",
    "I[i>=(n-1)/2]",
    "I[i<=(n-1)/2 & w_i=1]",
    "I[i>=(n-1)/2 & w_i=1]",
    "s",
)
PALINDROME_C = math.log(2)  # §3.2.3: c = ln 2 turns the softmax into base-2 place values
NOWAK = "Nowak et al. 2022"

# §3.2.1's half markers I[i<=(n-1)/2] and I[i>=(n-1)/2] are built-in positional features.


def one(dtype: str = "float32") -> ExactTransformer:
    """§3.1: one layer, one head, d = 7; s = (I[k = 1] - 1/2) / n at CLS."""
    b = LabelledModel(
        labelled_config("one", ONE_LABELS, One().vocab, layers=1, heads=1, d_mlp=4, positions=("i/n",), dtype=dtype,
                        metadata={"paper": NOWAK})
    )
    b.embed_one_hot_tokens()
    b.position("i/n", {"i/n": 1})
    # W^Q = W^K = 0: uniform attention averages I[w=1] -> k/n and I[CLS] -> 1/n (§3.1.2).
    b.value(0, 0, {("k/n", "I[w_i=1]"): 1, ("1/n", "I[w_i=CLS]"): 1})
    # h = (1/n) [relu(k-2), relu(k-1), relu(k), 1]; s = h1 - 2 h2 + h3 - h4/2 = (I[k=1] - 1/2)/n.
    b.ffn(0, [{"k/n": 1, "1/n": -2}, {"k/n": 1, "1/n": -1}, {"k/n": 1}, {"1/n": 1}], {"s": [1, -2, 1, -0.5]})
    b.readout({"s": 1})
    return b.model


def palindrome(dtype: str = "float32") -> ExactTransformer:
    """§3.2: two layers, two heads, d = 11; with c = ln 2 (App. A)

        s = (1 / (2^n - 1)) * sum over mismatches i <= (n-1)/2 of (-1)^I[w_i=0] 2^i,

    zero iff w is a palindrome. The output is the indicator I[s = 0] (§3.2.4),
    read with the tolerance of :func:`decide_palindrome`.
    """
    c = PALINDROME_C
    d = len(PALINDROME_LABELS)
    positions = ("i", "n-1-i", "I[i<=(n-1)/2]", "I[i>=(n-1)/2]")
    b = LabelledModel(
        labelled_config("palindrome", PALINDROME_LABELS, Palindrome().vocab, layers=2, heads=2, d_mlp=2,
                        positions=positions, dtype=dtype, metadata={"paper": NOWAK})
    )
    b.embed_one_hot_tokens()
    for feature in positions:
        b.position(feature, {feature: 1})
    # Layer 1: attention does nothing (W^Q = W^K = W^V = 0); the FFN marks 1s in each half (§3.2.2):
    # relu(-I[0] - I[CLS] - I[EOS] + I[half]) = I[half & w_i = 1].
    specials = {"I[w_i=0]": -1, "I[w_i=CLS]": -1, "I[w_i=EOS]": -1}
    b.ffn(
        0,
        [dict(specials, **{"I[i<=(n-1)/2]": 1}), dict(specials, **{"I[i>=(n-1)/2]": 1})],
        {"I[i<=(n-1)/2 & w_i=1]": [1, 0], "I[i>=(n-1)/2 & w_i=1]": [0, 1]},
    )
    # Layer 2 (§3.2.3): CLS scores key i (head 1) or n-1-i (head 2) with weight c: softmax weights
    # 2^i / (2^n - 1) for c = ln 2; head 1 adds the left-half 1s, head 2 subtracts the right-half 1s.
    q = {"I[w_i=CLS]": c * math.sqrt(d)}
    b.query_key(1, 0, q, {"i": 1})
    b.value(1, 0, {("s", "I[i<=(n-1)/2 & w_i=1]"): 1})
    b.query_key(1, 1, q, {"n-1-i": 1})
    b.value(1, 1, {("s", "I[i>=(n-1)/2 & w_i=1]"): -1})
    b.readout({"s": 1})
    return b.model


def palindrome_signal(ids: torch.Tensor, c: float = PALINDROME_C) -> torch.Tensor:
    """Appendix A's closed form of s in float64 for words ids [batch, |w|] (n = |w| + 2).

    s = sum_{i <= (n-1)/2} (I[w_i=1] - I[w_(n-1-i)=1]) e^{ci} / sum_j e^{cj}, positions with
    CLS at 0; for c = ln 2 this is the paper's (1/(2^n - 1)) sum (-1)^I[w_i=0] 2^i over mismatches.
    """
    batch, length = ids.shape
    n = length + 2
    bits = torch.zeros(batch, n, dtype=torch.float64)
    bits[:, 1 : n - 1] = ids.double()
    i = torch.arange(n, dtype=torch.float64)
    # Normalize with the largest exponent first so that e^{c i} cannot overflow float64.
    weights = torch.exp(c * (i - (n - 1)))
    weights = weights / weights.sum()
    left = 2 * i <= n - 1
    diff = bits - bits.flip(1)
    return (diff * weights * left).sum(dim=1)


def palindrome_tolerance(n_positions: torch.Tensor) -> torch.Tensor:
    """2^-n: half the smallest nonzero |s| of Appendix A (2 / (2^n - 1), one mismatch at i = 1)."""
    return torch.pow(2.0, -n_positions.to(torch.float64))


def decide_palindrome(logits: torch.Tensor, n_positions: torch.Tensor) -> torch.Tensor:
    """§3.2.4's output y = I[s = 0], read as I[|s| < 2^-n].

    In exact arithmetic s = 0 for palindromes and |s| >= 2/(2^n - 1) > 2^(1-n) otherwise,
    so any threshold in between decides; 2^-n is at distance >= 2^-n from both, so a
    decision is wrong only if rounding moves s by at least 2^-n. A literal s == 0 test
    fails on palindromes as soon as the two heads round differently (|w| = 2 in float64).
    """
    return logits.double().abs() < palindrome_tolerance(n_positions)


def palindrome_evidence(logits: torch.Tensor, n_positions: torch.Tensor) -> torch.Tensor:
    """1 - 2^n |s|: a logit that is positive exactly when decide_palindrome accepts."""
    return 1 - logits.abs() * torch.pow(2.0, n_positions.to(logits.dtype))


PALINDROME_RULE = DecisionRule(
    "abs-below-2^-n",
    decide_palindrome,
    summary="accept iff |s| < 2^-n (Nowak et al. §3.2.4's y = I[s = 0], with room for rounding)",
    logits=True,  # s is also read as a sigmoid logit (cross-entropy), as the paper's output layer does
    evidence=palindrome_evidence,
)

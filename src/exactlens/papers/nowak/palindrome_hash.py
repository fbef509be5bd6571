"""PALINDROME by layer-norm-hash lookup of the mirrored position (our design, built only
from Transformer Cookbook recipes: §5.1.2 uniform averages, §5.3.3 layer-norm hash and
lookup, §4.8 Boolean FFN).

Tokens are [CLS] w [EOS], positions 0..n-1 with n = |w| + 2; symbol i (1 <= i <= |w|) has
its mirror at m(i) = n-1-i (and m swaps [CLS] and [EOS]). No positional encoding is used.

Layer 0 (causal uniform average of I[CLS]): key_inv = 1/(j+1) at j.
Layer 1 ("past" mask j >= i, uniform average of I[EOS]): query_inv = 1/(n-i) at i.
Layer 2 (selective pre-LN): phi(1, key_inv) = phi(j+1) (scale invariance, §5.3.3).
Layer 3 (selective pre-LN): phi(1, query_inv) = phi(n-i).
Layer 4 (LN-free, no mask, average-hard): score phi(n-i) . phi(j+1) = 4 cos angle((n-i, 1),
    (j+1, 1)) is maximal exactly at j+1 = n-i, i.e. j = m(i); the head copies I[w_j = 1]
    into mirror. FFN: mismatch = XOR(I[w_i = 1], mirror) (§4.8).
Layer 5 (no mask, uniform average): M/n = mean of mismatch and 1/n = mean of I[CLS].
Readout at [CLS]: logit = (1 - M)/n with M = #mismatched positions. Mismatches come in
    pairs (i and m(i) mismatch together, the middle never), so M is 0 for palindromes and
    >= 2 otherwise: logit = 1/n (accept) or <= -1/n (reject); margin |logit| >= 1/n.

Limit: the hash targets run over 1..n, the smallest gap being gap(n-1) ~ 2/(n-1)^4 (key n
exists; the target n itself has only the runner-up n-1, gap(n, "previous") is larger).
When it falls to a few ulps of the top score 4, rounding ties or flips the mirror with
its neighbour. Measured (tests/constructions/test_palindrome_hash.py): float32 lookups exact
for |w| <= 40, margin 0 at 41-42, first wrong decision at |w| = 43; float64 lookups exact for
|w| <= 5770, first wrong lookup at 5771 (a tie at [CLS], decisions still right there).
"""

from __future__ import annotations

from exactlens.constructions.cookbook import Layer, Program, Readout, compile
from exactlens.constructions.cookbook import attention as att
from exactlens.constructions.cookbook import ffn as ff
from exactlens.constructions.cookbook import layer_norm_hash as H
from exactlens.model import ExactTransformer
from exactlens.tasks import CLS, EOS, Palindrome

KEY_HASH = H.hash_labels("phi(j+1)")
QUERY_HASH = H.hash_labels("phi(n-i)")
LOOKUP_LAYER = 4  # index of the mirror-lookup layer (its hook_pattern shows the mirror)


def palindrome_hash_program() -> Program:
    """The six-layer program described in the module docstring."""
    lang = Palindrome()
    embedding = {s: {"one": 1.0, "I[w=1]": float(s == "1")} for s in lang.alphabet}
    embedding[CLS] = {"one": 1.0, "I[CLS]": 1.0}
    embedding[EOS] = {"one": 1.0, "I[EOS]": 1.0}
    key_count = att.uniform_average({"1/(j+1)": "I[CLS]"}, name="key-count")
    query_count = att.uniform_average({"1/(n-i)": "I[EOS]"}, name="query-count")
    mirror = H.lookup(QUERY_HASH, KEY_HASH, {"mirror": "I[w=1]"}, name="mirror-lookup")
    mismatch = ff.boolean(lambda a, b: a != b, ["I[w=1]", "mirror"], "mismatch", inputs_encoding="01", name="xor")
    average = att.uniform_average({"M/n": "mismatch", "1/n": "I[CLS]"}, name="mismatch-average")
    layers = (
        Layer(heads=(key_count,), mask="causal", weighting="average_hard"),
        Layer(heads=(query_count,), mask="past", weighting="average_hard"),
        H.hash_layer({"one": 1.0}, {"1/(j+1)": 1.0}, KEY_HASH, name="hash-key"),
        H.hash_layer({"one": 1.0}, {"1/(n-i)": 1.0}, QUERY_HASH, name="hash-query"),
        Layer(heads=(mirror,), ffns=(mismatch,), mask="none", weighting="average_hard"),
        Layer(heads=(average,), mask="none", weighting="average_hard"),
    )
    readout = Readout({"accept": {"1/n": 1.0, "M/n": -1.0}}, kind="sigmoid", position=0)
    return Program(vocab=lang.vocab, embedding=embedding, layers=layers, readout=readout, name="palindrome-hash")


def palindrome_hash(dtype: str = "float32") -> ExactTransformer:
    """Compile ``palindrome_hash_program``; accept iff logit (1 - M)/n > 0."""
    model = compile(palindrome_hash_program(), dtype)
    model.cfg.metadata.update({"paper": "ours, from Yang et al. 2025 §5.1.2, §5.3.3, §4.8", "margin": "1/n"})
    return model

"""Nowak et al. ONE and PALINDROME, and palindrome-robust: closed forms, membership, precision."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest
import torch

from exactlens.analysis.verify import precision, readout_logits, verify
from exactlens.constructions import build, get
from exactlens.errors import ExactLensError
from exactlens.papers.nowak.constructions import decide_palindrome, palindrome_signal
from exactlens.tasks import One, Palindrome

DTYPES = ("float32", "float64")
ONE, PAL = One(), Palindrome()


def one_closed_form(word: list[int]) -> float:
    """§3.1: s = (I[k = 1] - 1/2) / n, n = |w| + 1."""
    return ((sum(word) == 1) - 0.5) / (len(word) + 1)


def appendix_a(word: list[int]) -> Fraction:
    """App. A with c = ln 2, exactly: s = (1/(2^n - 1)) sum over left-half mismatches of (-1)^I[w_i=0] 2^i,
    positions counted with [CLS] at 0 and [EOS] at n - 1."""
    symbols = [None, *word, None]
    n = len(symbols)
    total = 0
    for i in range(n):
        mirror = symbols[n - 1 - i]
        if 2 * i <= n - 1 and symbols[i] != mirror:
            total += (1 if symbols[i] == 1 else -1) * 2**i
    return Fraction(total, 2**n - 1)


def logits(name: str, dtype: str, ids: torch.Tensor) -> torch.Tensor:
    return readout_logits(build(name, dtype=dtype), get(name).lang().encode(ids).tokens)


# ---- ONE ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
def test_one_closed_form_exhaustive(dtype):
    tol = 1e-5 if dtype == "float32" else 1e-13  # cancellation of terms up to k/n
    for length in range(0, 11):
        ids = ONE.all_words(length)
        s = logits("one", dtype, ids).double()
        expected = torch.tensor([one_closed_form(w) for w in ids.tolist()], dtype=torch.float64)
        assert torch.allclose(s, expected, rtol=tol, atol=0), length
        assert torch.equal(s > 0, ONE.membership(ids))


@pytest.mark.parametrize("dtype", DTYPES)
def test_one_long_words(dtype):
    result = verify("one", [64, 257, 1000], strings=24, dtype=dtype)
    assert all(r["accuracy"] == 1.0 for r in result["results"])
    for r in result["results"]:  # |s| = 1/(2n)
        assert r["min_abs_logit"] == pytest.approx(0.5 / (r["length"] + 1), rel=1e-5)


def test_one_residual_stream_is_labelled():
    model = build("one", dtype="float64")
    _, cache = model.run_with_cache(ONE.tokenize(["00100"]).tokens)
    labels = model.cfg.residual_labels
    mid = cache["blocks.0.hook_resid_mid"][0, 0]
    assert mid[labels.index("k/n")].item() == pytest.approx(1 / 6)
    assert mid[labels.index("1/n")].item() == pytest.approx(1 / 6)
    post = cache["blocks.0.hook_resid_post"][0, 0]
    assert post[labels.index("s")].item() == pytest.approx(0.5 / 6)


# ---- PALINDROME (faithful) -------------------------------------------------------------------------------------


def test_palindrome_matches_appendix_a_exhaustive():
    model = build("palindrome", dtype="float64")
    for length in range(0, 11):
        ids = PAL.all_words(length)
        s = readout_logits(model, PAL.encode(ids).tokens)
        exact = torch.tensor([float(appendix_a(w)) for w in ids.tolist()], dtype=torch.float64)
        n = length + 2
        # float64 rounding is far below the smallest nonzero |s| = 2/(2^n - 1)
        assert (s - exact).abs().max().item() < 1e-6 * 2.0**-n, length
        assert torch.allclose(palindrome_signal(ids), exact, rtol=1e-12, atol=1e-300)
        assert ((exact == 0) == PAL.membership(ids)).all()


@pytest.mark.parametrize("dtype", DTYPES)
def test_palindrome_exact_on_short_words(dtype):
    result = verify("palindrome", range(0, 13), dtype=dtype)
    assert all(r["accuracy"] == 1.0 and r["exhaustive"] for r in result["results"])
    result = verify("palindrome", [20, 30, 37], strings=300, dtype=dtype, exhaustive_limit=0)
    assert all(r["accuracy"] == 1.0 for r in result["results"])


def test_palindrome_heads_are_the_papers():
    model = build("palindrome", dtype="float64")
    _, cache = model.run_with_cache(PAL.tokenize(["1101"]).tokens)  # n = 6
    pattern = cache["blocks.1.attn.hook_pattern"][0, :, 0]  # CLS query, heads x keys
    weights = torch.tensor([2.0**i for i in range(6)], dtype=torch.float64) / 63
    assert torch.allclose(pattern[0], weights.double(), rtol=1e-12)
    assert torch.allclose(pattern[1], weights.flip(0).double(), rtol=1e-12)
    labels = model.cfg.residual_labels
    post = cache["blocks.0.hook_resid_post"][0]
    # I[i <= (n-1)/2 & w_i = 1]: positions 1, 2 (w = 1, 1); I[i >= (n-1)/2 & w_i = 1]: position 4
    assert post[:, labels.index("I[i<=(n-1)/2 & w_i=1]")].tolist() == [0, 1, 1, 0, 0, 0]
    assert post[:, labels.index("I[i>=(n-1)/2 & w_i=1]")].tolist() == [0, 0, 0, 0, 1, 0]


def test_decision_threshold():
    n = torch.tensor([10, 10, 10])
    s = torch.tensor([0.0, 2.0**-10 * 0.99, 2.0 / (2**10 - 1)])
    assert decide_palindrome(s, n).tolist() == [True, True, False]


@pytest.mark.parametrize("dtype, unit_roundoff", [("float32", 2.0**-24), ("float64", 2.0**-53)])
def test_precision_cliff_where_rounding_meets_the_signal(dtype, unit_roundoff):
    """The heads' outputs are about 2^(-n/2) (binary numbers of one half over 2^n - 1), so their rounding
    error is about u 2^(-n/2); the threshold is 2^-n. They meet near n = 2 log2(1/u). The measured cliff
    must lie within a few positions of that (and not below the paper's 37)."""
    predicted_n = 2 * math.log2(1 / unit_roundoff)
    result = precision("palindrome", dtype=dtype, max_length=int(predicted_n) + 20, strings=32)
    first = result["first_failure_length"]
    assert first is not None and result["max_exact_length"] == first - 1
    assert 37 <= first and abs((first + 2) - predicted_n) <= 6, (first, predicted_n)


# ---- palindrome-robust -------------------------------------------------------------------------------------------


def mismatched_positions(ids: torch.Tensor) -> torch.Tensor:
    return (ids != ids.flip(1)).sum(dim=1)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("lookup", ["softmax", "average_hard"])
def test_robust_closed_form_exhaustive(dtype, lookup):
    model = build("palindrome-robust", dtype=dtype, lookup=lookup)
    for length in range(0, 13):
        ids = PAL.all_words(length)
        s = readout_logits(model, PAL.encode(ids).tokens).double()
        n = length + 2
        expected = (0.5 - mismatched_positions(ids).double()) / n  # (1/2 - M) / n
        assert torch.allclose(s, expected, rtol=1e-6, atol=0), length
        assert torch.equal(s > 0, PAL.membership(ids))


@pytest.mark.parametrize("dtype", DTYPES)
def test_robust_lookup_is_exactly_one_hot(dtype):
    model = build("palindrome-robust", dtype=dtype)
    ids = PAL.sample(300, 2, torch.Generator().manual_seed(0))
    _, cache = model.run_with_cache(PAL.encode(ids).tokens)
    pattern = cache["blocks.0.attn.hook_pattern"][:, 0]  # [batch, query, key]
    mirror = torch.eye(302, dtype=pattern.dtype).flip(1)
    assert torch.equal(pattern, mirror.expand_as(pattern))  # e^-gap underflows: soft == hard, bit for bit


@pytest.mark.parametrize("dtype, lengths", [("float32", [100, 999, 1000]), ("float64", [1500])])
def test_robust_long_words(dtype, lengths):
    result = verify("palindrome-robust", lengths, strings=12, dtype=dtype)
    for r in result["results"]:
        assert r["accuracy"] == 1.0
        assert r["min_abs_logit"] == pytest.approx(0.5 / (r["length"] + 2), rel=1e-5)  # margin 1/(2n)


def test_robust_hard_words_at_1000_float32():
    length = 1000
    ids = torch.cat([PAL.hard_words(length)[::6], PAL.one_flip_negatives(length, 4, torch.Generator().manual_seed(1))])
    s = logits("palindrome-robust", "float32", ids)
    assert torch.equal(s > 0, PAL.membership(ids))


@pytest.mark.slow
def test_robust_float32_limit_is_the_exact_integer_range():
    """Scores are exact while n^2 < 2^24 (n <= 4096); well beyond, lookups tie or flip."""
    assert verify("palindrome-robust", [4094], strings=16)["results"][0]["accuracy"] == 1.0
    assert verify("palindrome-robust", [5000], strings=16)["results"][0]["accuracy"] < 1.0


@pytest.mark.slow
def test_robust_float64_at_10000():
    result = verify("palindrome-robust", [10000], strings=4, dtype="float64")
    assert result["results"][0]["accuracy"] == 1.0


@pytest.mark.parametrize(
    "params, message",
    [
        ({"lookup": "argmax"}, "lookup='argmax' is not allowed"),
        ({"gap_scale": -1.0}, "gap_scale must be a finite number > 0"),
        ({"gap_scale": float("nan")}, "gap_scale must be a finite number > 0"),
    ],
)
def test_robust_bad_parameters(params, message):
    with pytest.raises(ExactLensError, match=message):
        build("palindrome-robust", **params)

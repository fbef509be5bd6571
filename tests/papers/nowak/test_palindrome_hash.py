"""palindrome-hash: PALINDROME by layer-norm-hash lookup of the mirrored position.

References are independent of the model: membership by plain Python reversal (and
Palindrome.contains), the mismatch count M by Python indexing, hashes by the closed form
phi of layer_norm_hash, mirrors as n-1-i. Float limits are measured, not assumed."""

from __future__ import annotations

import itertools

import pytest
import torch

from exactlens.analysis.verify import precision, verify
from exactlens.constructions import get
from exactlens.constructions.cookbook import layer_norm_hash as H
from exactlens.constructions.cookbook import read
from exactlens.papers.nowak.palindrome_hash import KEY_HASH, LOOKUP_LAYER, QUERY_HASH, palindrome_hash
from exactlens.tasks import Palindrome

DTYPES = ("float32", "float64")
LANG = Palindrome()
PATTERN = f"blocks.{LOOKUP_LAYER}.attn.hook_pattern"
# measured (test_float32_limit..., test_float64_lookup_limit...): the last |w| with every lookup exact
FLOAT32_LAST_EXACT = 40
FLOAT64_LAST_EXACT = 5770


def ids_of(words: list[str]) -> torch.Tensor:
    length = len(words[0])
    return torch.tensor([[int(c) for c in w] for w in words], dtype=torch.long).reshape(len(words), length)


def mismatches(word: str) -> int:
    return sum(a != b for a, b in zip(word, reversed(word), strict=True))


def logits_of(model, ids: torch.Tensor) -> torch.Tensor:
    return model.readout_logits(LANG.encode(ids).tokens).double()


def first_wrong_lookup(model, length: int) -> int | None:
    """First query position whose lookup row is not one-hot at the mirror n-1-i (None: all right)."""
    n = length + 2
    tokens = LANG.encode(torch.zeros(1, length, dtype=torch.long)).tokens
    _, cache = model.run_with_cache(tokens, names_filter=PATTERN)
    pattern = cache[PATTERN][0, 0]
    i = torch.arange(n)
    wrong = i[pattern[i, n - 1 - i] != 1]
    return int(wrong[0]) if wrong.numel() else None


@pytest.fixture(scope="module", params=DTYPES)
def model(request):
    return palindrome_hash(request.param)


# ----------------------------------------------------------------------------- correctness


def test_exhaustive_up_to_length_10_against_reversal(model):
    for length in range(11):
        words = ["".join(w) for w in itertools.product("01", repeat=length)]
        ids = ids_of(words) if length else torch.zeros(1, 0, dtype=torch.long)
        s = logits_of(model, ids)
        truth = torch.tensor([w == w[::-1] for w in words])
        assert truth.tolist() == [LANG.contains(w) for w in words]
        assert torch.equal(s > 0, truth), length
        n = length + 2
        want = torch.tensor([(1 - mismatches(w)) / n for w in words], dtype=torch.float64)
        tol = 1e-6 if model.cfg.dtype == "float32" else 1e-14
        assert torch.allclose(s, want, atol=tol, rtol=0)  # logit = (1 - M) / n
        assert (s.abs() >= 1 / n - tol).all()  # the stated margin
        assert set(mismatches(w) for w in words) <= {0} | set(range(2, length + 1, 2))  # pairs


@pytest.mark.parametrize("length", [23, 64, 151, 300])
def test_random_long_palindromes_and_one_flip_negatives_float64(length):
    model = palindrome_hash("float64")
    gen = torch.Generator().manual_seed(length)
    pos, neg = LANG.palindromes(length, 6, gen), LANG.one_flip_negatives(length, 6, gen)
    for ids, member in ((pos, True), (neg, False)):
        words = ["".join(map(str, row.tolist())) for row in ids]
        assert [w == w[::-1] for w in words] == [member] * len(words)
        s = logits_of(model, ids)
        want = torch.tensor([(1 - mismatches(w)) / (length + 2) for w in words], dtype=torch.float64)
        assert torch.allclose(s, want, atol=1e-13, rtol=0)
        assert torch.equal(s > 0, torch.full((len(words),), member))


def test_intermediate_values_are_the_closed_forms(model):
    word = "0110100111"
    n = len(word) + 2
    _, cache = model.run_with_cache(LANG.encode(ids_of([word])).tokens)
    j = torch.arange(n, dtype=torch.float64)
    tol = 1e-6 if model.cfg.dtype == "float32" else 1e-14

    def close(hook: str, label: str, want: torch.Tensor) -> bool:
        return torch.allclose(read(cache, model, hook, label)[0].double(), want.double(), atol=tol, rtol=0)

    assert close("blocks.0.hook_resid_post", "1/(j+1)", 1 / (j + 1))
    assert close("blocks.1.hook_resid_post", "1/(n-i)", 1 / (n - j))
    for k in range(4):
        assert close("blocks.3.hook_resid_post", KEY_HASH[k], H.phi(j + 1)[:, k])
        assert close("blocks.3.hook_resid_post", QUERY_HASH[k], H.phi(n - j)[:, k])
    symbols = [0.0, *map(float, word), 0.0]  # [CLS] w [EOS]: I[w = 1]
    assert close(f"blocks.{LOOKUP_LAYER}.hook_resid_post", "mirror", torch.tensor(symbols[::-1], dtype=torch.float64))
    assert close("blocks.5.hook_resid_post", "M/n", torch.full((n,), mismatches(word) / n, dtype=torch.float64))


@pytest.mark.parametrize("length", [0, 1, 2, 7, 20, FLOAT32_LAST_EXACT])
def test_lookup_attends_exactly_to_the_mirrored_position(model, length):
    """Through the hook: query i puts weight exactly 1 on key n-1-i and 0 elsewhere."""
    gen = torch.Generator().manual_seed(length)
    ids = torch.randint(0, 2, (2, length), generator=gen)
    _, cache = model.run_with_cache(LANG.encode(ids).tokens, names_filter=PATTERN)
    n = length + 2
    mirror = torch.eye(n, dtype=cache[PATTERN].dtype).flip(1)
    assert torch.equal(cache[PATTERN][:, 0], mirror.expand(2, n, n))


# ----------------------------------------------------------------------------- float limits


def test_float32_limit_where_the_gap_reaches_rounding():
    """Measured: every lookup exact up to |w| = 40; the first wrong one at |w| = 41
    (n = 43, query 1, hash target t = 42 ties its neighbour 43: gap(42) ~ 1.3 ulps of the
    top score 4). A tie averages two symbols and the XOR of a half is 0, but a one-sided
    mismatch gives M = 1, logit 0: the margin 1/n is lost from |w| = 41 on; decisions first go
    wrong at |w| = 43 ([CLS] reads the last symbol instead of [EOS]: palindromes rejected)."""
    model = palindrome_hash("float32")
    first = next(length for length in range(30, 80) if first_wrong_lookup(model, length) is not None)
    assert 38 <= first <= 46  # measured here: FLOAT32_LAST_EXACT + 1 = 41
    n = first + 2
    t = n - first_wrong_lookup(model, first)
    ulps = float(H.gap(t)) / (4 * torch.finfo(torch.float32).eps)
    assert 0.25 <= ulps <= 16 and t >= n - 2
    assert first_wrong_lookup(palindrome_hash("float64"), first) is None
    result = precision("palindrome-hash", dtype="float32", max_length=60, strings=16, lengths=range(1, 61))
    assert FLOAT32_LAST_EXACT < result["first_failure_length"] <= 50


def hash_scores_by_injection(model, max_target: int, window: int = 8) -> torch.Tensor:
    """Lookup scores of targets t = 1..max_target against keys t-3..t+3, in the real model:
    1/(j+1) and 1/(n-i) (exactly fl(1/t) in the model, checked below) are injected after
    layer 1 for overlapping windows of positions holding t = start + p + 1. An estimate, not
    bit for bit: the hash layers' LN reductions round differently in different rows (e.g. in
    float32 the full model's query 0 at |w| = 43 flips to key t-1 where the injection ties),
    so the full model confirms the float64 result (slow test)."""
    labels = model.cfg.residual_labels
    t = torch.arange(0, max_target, window - 2, dtype=torch.float64)[:, None] + torch.arange(window) + 1
    inv = (1.0 / t).to(model.cfg.torch_dtype)

    def put(x, hook):
        x = x.clone()
        x[..., labels.index("1/(j+1)")] = inv
        x[..., labels.index("1/(n-i)")] = inv
        return x

    scores_hook = f"blocks.{LOOKUP_LAYER}.attn.hook_attn_scores"
    with model.hooks(fwd_hooks=[("blocks.1.hook_resid_post", put)]):
        _, cache = model.run_with_cache(torch.zeros(t.shape, dtype=torch.long), names_filter=scores_hook)
    return t, cache[scores_hook][:, 0]


def first_failing_length_by_injection(model, max_target: int) -> int:
    """Smallest |w| = n - 2 whose keys 1..n hold a target t and a neighbour t +- 1 that scores >= it."""
    t, s = hash_scores_by_injection(model, max_target)
    p = torch.arange(1, t.shape[1] - 1)
    inner = t[:, 1:-1]
    diag = s[:, p, p]
    lefts = inner[s[:, p, p - 1] >= diag]  # key t-1 wins: present once n >= t
    rights = inner[s[:, p, p + 1] >= diag]  # key t+1 wins: present once n >= t+1
    return int(min(lefts.min(), rights.min() + 1)) - 2


def test_injected_counts_equal_the_models_own():
    model = palindrome_hash("float64")
    _, cache = model.run_with_cache(LANG.encode(torch.zeros(1, 500, dtype=torch.long)).tokens)
    j = torch.arange(502, dtype=torch.float64)
    assert torch.equal(read(cache, model, "blocks.1.hook_resid_post", "1/(j+1)")[0], 1.0 / (j + 1))
    assert torch.equal(read(cache, model, "blocks.1.hook_resid_post", "1/(n-i)")[0], 1.0 / (502 - j))


def test_float32_limit_by_injection_matches_the_full_model():
    assert 38 <= first_failing_length_by_injection(palindrome_hash("float32"), 200) <= 46  # measured: 41


def test_float64_lookup_limit_by_injection():
    """Measured: the first float64 target that ties a present neighbour is t = 5773 (vs key
    5772, at query 0 of |w| = 5771), with gap ~ 1-2 ulps of 4; the full model agrees (slow test)."""
    first = first_failing_length_by_injection(palindrome_hash("float64"), 20000)
    assert 4500 <= first <= 7000  # measured here: FLOAT64_LAST_EXACT + 1 = 5771
    ulps = float(H.gap(first + 2, "previous")) / (4 * torch.finfo(torch.float64).eps)
    assert 0.25 <= ulps <= 16


@pytest.mark.slow
def test_float64_limit_on_the_full_model():
    """The measured bracket on the full model (two runs, n ~ 5772, ~1.8 GB, ~15 s): every
    lookup exact at |w| = 5770; at 5771 query 0 ([CLS], hash target n = 5773) ties key 5772."""
    model = palindrome_hash("float64")
    assert first_wrong_lookup(model, FLOAT64_LAST_EXACT) is None
    assert first_wrong_lookup(model, FLOAT64_LAST_EXACT + 1) == 0


# ----------------------------------------------------------------------------- registry


def test_registered_and_verified():
    construction = get("palindrome-hash")
    assert construction.language == "palindrome" and "layer-norm-hash" in construction.tags
    for dtype in DTYPES:
        result = verify("palindrome-hash", [0, 5, 12, 33], dtype=dtype, strings=64)
        assert [r["accuracy"] for r in result["results"]] == [1.0] * 4
        assert all(r["min_abs_logit"] >= 1 / (r["length"] + 2) - 1e-6 for r in result["results"])

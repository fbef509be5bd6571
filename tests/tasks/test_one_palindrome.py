"""ONE and PALINDROME (Nowak et al. 2022): membership, Appendix B samplers, hard words, bad input."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from exactlens.errors import ExactLensError
from exactlens.tasks import CLS, EOS, One, Palindrome, get


def words(length: int) -> list[str]:
    return ["".join(bits) for bits in itertools.product("01", repeat=length)]


def gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def test_registered_with_vocabularies():
    assert isinstance(get("one"), One) and isinstance(get("palindrome"), Palindrome)
    assert get("one").vocab == ("0", "1", CLS)
    assert get("palindrome").vocab == ("0", "1", CLS, EOS)


@pytest.mark.parametrize("length", range(0, 11))
def test_membership_matches_definitions(length):
    one, pal = One(), Palindrome()
    ws = words(length)
    assert [one.contains(w) for w in ws] == [w.count("1") == 1 for w in ws]
    assert [pal.contains(w) for w in ws] == [w == w[::-1] for w in ws]
    ids = one.all_words(length)
    assert one.membership(ids).tolist() == [w.count("1") == 1 for w in ws]
    assert pal.membership(ids).tolist() == [w == w[::-1] for w in ws]


def test_palindrome_tokens_end_with_eos():
    batch = Palindrome().tokenize(["01", ""])
    assert batch.tokens.tolist() == [[2, 0, 1, 3], [2, 3, 0, 0]]
    assert batch.n_positions.tolist() == [4, 2]


def test_one_sampler_is_poisson_with_uniform_positions():
    ids = One().sample(40, 20000, gen())
    counts = ids.sum(dim=1).double()
    # Poisson(1.5) truncated at 40 is Poisson(1.5) to double precision.
    assert abs(counts.mean().item() - 1.5) < 0.05 and abs(counts.var().item() - 1.5) < 0.08
    for k in range(4):
        expected = math.exp(-1.5) * 1.5**k / math.factorial(k)
        assert abs((counts == k).double().mean().item() - expected) < 0.015
    per_position = ids.double().mean(dim=0)  # 1.5 / 40 at every position
    assert (per_position - 1.5 / 40).abs().max().item() < 0.012


def test_one_sampler_never_exceeds_the_length():
    for length in (0, 1, 2):
        ids = One().sample(length, 2000, gen(length))
        assert ids.shape == (2000, length) and int(ids.sum(dim=1).max()) <= length
    assert set(One().sample(1, 2000, gen()).sum(dim=1).tolist()) == {0, 1}


@pytest.mark.parametrize("length", [2, 3, 8, 9, 31])
def test_palindrome_samplers(length):
    pal = Palindrome()
    positives = pal.palindromes(length, 500, gen(length))
    assert pal.membership(positives).all()
    negatives = pal.one_flip_negatives(length, 500, gen(length))
    mismatched = (negatives != negatives.flip(1)).sum(dim=1)
    assert (mismatched == 2).all()  # exactly one flipped symbol: one mismatched pair
    if length % 2:
        # the flip is never the middle symbol: the only mismatched pair is not (middle, middle)
        assert (mismatched == 2).all()
    mixed = pal.sample(length, 4000, gen(length + 1))
    share = pal.membership(mixed).double().mean().item()
    assert abs(share - 0.5) < 0.04


def test_flip_positions_are_uniform():
    pal = Palindrome()
    negatives = pal.one_flip_negatives(7, 30000, gen())
    # 6 flippable positions in 3 mirror pairs: each pair is the mismatched one with probability 1/3
    pairs = (negatives[:, :3] != negatives.flip(1)[:, :3]).double().mean(dim=0)
    assert (pairs - 1 / 3).abs().max().item() < 0.02


def test_short_palindrome_samples():
    pal = Palindrome()
    assert pal.sample(0, 3, gen()).shape == (3, 0)
    assert pal.membership(pal.sample(1, 50, gen())).all()
    with pytest.raises(ExactLensError, match="every word of length 1 is a palindrome"):
        pal.one_flip_negatives(1, 3, gen())


@pytest.mark.parametrize("length", [0, 1, 2, 5, 12])
def test_palindrome_hard_words(length):
    pal = Palindrome()
    hard = pal.hard_words(length)
    assert hard.shape[1] == length and torch.equal(hard, pal.hard_words(length))
    if length >= 2:
        truth = pal.membership(hard)
        assert truth.any() and (~truth).any()
        outer = hard[~truth]
        # every negative differs from a palindrome by one flip, many of them at the outermost pair
        assert ((outer != outer.flip(1)).sum(dim=1) == 2).all()
        assert bool((outer[:, 0] != outer[:, -1]).any())


def test_one_hard_words_straddle_the_boundary():
    counts = One().hard_words(6).sum(dim=1).tolist()
    assert {0, 1, 2, 6} <= set(counts)


@pytest.mark.parametrize("bad", [-1, 1.5, True])
def test_bad_counts(bad):
    with pytest.raises(ExactLensError, match="count must be an integer >= 0"):
        One().sample(4, bad, gen())
    with pytest.raises(ExactLensError, match="count must be an integer >= 0"):
        Palindrome().sample(4, bad, gen())


def test_zero_count_is_an_empty_sample():
    assert One().sample(4, 0, gen()).shape == (0, 4)
    assert Palindrome().sample(4, 0, gen()).shape == (0, 4)


def test_bad_lengths_and_symbols():
    with pytest.raises(ExactLensError, match="below the minimum"):
        Palindrome().sample(-1, 2, gen())
    with pytest.raises(ExactLensError, match="not in the alphabet"):
        Palindrome().contains("01x")
    with pytest.raises(ExactLensError, match="special tokens are added by the tokenizer"):
        One().tokenize([["1", CLS]])

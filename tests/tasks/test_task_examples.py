"""Majority, Dyck-k(-D) and the induction tasks: targets against hand-written cases,
vectorized against per-word versions, samplers and hard words."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from exactlens.errors import ExactLensError
from exactlens.tasks import CLS, get
from exactlens.tasks.dyck import Dyck, count_members

SETTINGS = settings(max_examples=60, deadline=None)


# ---- majority ------------------------------------------------------------------------------------------------------


def test_majority_paper_example_and_ties():
    lang = get("majority")
    assert lang.alphabet == tuple("abcdefghijklmnopqrst") and lang.vocab[-1] == CLS
    assert lang.target("aabbbcc") == 1  # Brody et al. §4.1: a, a, b, b, b, c, c -> b
    assert lang.target("ccaa") == 0 and lang.target("tst") == 19  # tie -> smallest index
    ids = torch.tensor(lang.to_ids(["ccaab", "aabbb"]))
    assert lang.targets(ids).tolist() == [0, 1]
    assert lang.is_tied(ids).tolist() == [True, False]


@pytest.mark.parametrize("bad", [1, 27, "3", True])
def test_majority_rejects_bad_class_counts(bad):
    with pytest.raises(ExactLensError, match="num_classes"):
        get("majority", num_classes=bad)


def test_majority_rejects_empty_words_and_membership():
    lang = get("majority", num_classes=4)
    with pytest.raises(ExactLensError, match="empty word"):
        lang.target("")
    with pytest.raises(ExactLensError, match="classification task"):
        lang.membership(torch.zeros(1, 3, dtype=torch.long))
    with pytest.raises(ExactLensError, match="below the minimum"):
        lang.sample(0, 3, torch.Generator())


@SETTINGS
@given(words=st.lists(st.text(alphabet="abcd", min_size=6, max_size=6), min_size=1, max_size=8))
def test_majority_vectorized_matches_per_word(words):
    lang = get("majority", num_classes=4)
    ids = torch.tensor(lang.to_ids(words))
    assert lang.targets(ids).tolist() == [lang.target(w) for w in words]


def test_majority_sampler_avoids_ties_unless_asked():
    gen = torch.Generator().manual_seed(1)
    lang = get("majority")
    words = lang.sample(50, 3000, gen)
    assert words.shape == (3000, 50) and not lang.is_tied(words).any()
    tied = get("majority", allow_ties=True).sample(50, 3000, gen)
    assert lang.is_tied(tied).float().mean() > 0.1  # uniform words tie often; the default rejects them


@pytest.mark.parametrize("length", [1, 2, 3, 4, 5, 20, 21, 22, 50])
def test_majority_hard_words_are_near_ties_won_by_the_last_class(length):
    lang = get("majority")
    hard = lang.hard_words(length)
    assert hard.shape[1] == length and hard.shape[0] >= 2 if length >= 2 else True
    assert (lang.targets(hard) == 19).all() and not lang.is_tied(hard).any()
    counts = lang.counts(hard).sort(dim=1, descending=True).values
    if length >= 3:  # some hard word leads the runner-up by exactly one
        assert ((counts[:, 0] - counts[:, 1]) == 1).any()


# ---- Dyck --------------------------------------------------------------------------------------------------------


def test_dyck_examples_from_the_cookbook():
    d1 = get("dyck")
    assert d1.alphabet == ("(", ")")
    assert d1.contains("()(())") and not d1.contains("())(()") and d1.contains("")
    d12 = get("dyck", k=1, max_depth=2)
    assert d12.contains("(())(()())") and not d12.contains("((()))")
    d22 = get("dyck", k=2, max_depth=2)
    assert d22.contains("([])[]") and not d22.contains("([)]") and not d22.contains("[(])")


@pytest.mark.parametrize(("k", "depth"), [(1, None), (1, 2), (2, None), (2, 1), (3, 2)])
def test_dyck_vectorized_membership_and_counts(k, depth):
    lang = Dyck(k, depth)
    for length in range(0, 9 if k == 1 else 7 if k == 2 else 5):
        ids = lang.all_words(length)
        vec = lang.membership(ids)
        assert vec.tolist() == [lang.contains(w) for w in lang.decode(ids)]
        assert int(vec.sum()) == count_members(length, k, depth)


def test_dyck_counts_match_closed_forms():
    for m in range(8):  # Catalan numbers; Dyck-1-2 has 2^(m-1) words of length 2m
        assert count_members(2 * m) == math.comb(2 * m, m) // (m + 1)
        assert count_members(2 * m, 1, 2) == (2 ** (m - 1) if m else 1)
        assert count_members(2 * m, 2) == math.comb(2 * m, m) // (m + 1) * 2**m


def test_dyck_member_sampler_is_uniform_over_members():
    lang = Dyck(1, 3)
    words = lang.sample_members(8, 14000, torch.Generator().manual_seed(0))
    assert lang.membership(words).all()
    _, counts = torch.unique(words, dim=0, return_counts=True)
    assert len(counts) == count_members(8, 1, 3) == 13
    expected = 14000 / 13
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < 36.4  # chi-square, 12 degrees of freedom, p = 0.0003


def test_dyck_sampler_mixes_members_and_non_members():
    lang = Dyck(2, 3)
    words = lang.sample(12, 400, torch.Generator().manual_seed(3))
    rate = float(lang.membership(words).float().mean())
    assert 0.3 < rate < 0.7


@pytest.mark.parametrize("length", list(range(0, 13)))
def test_dyck_hard_words_include_members_and_late_failures(length):
    lang = Dyck(1, 2)
    hard = lang.hard_words(length)
    assert hard.shape[1] == length
    if length >= 4 and length % 2 == 0:
        labels = lang.membership(hard)
        assert labels.any() and (~labels).any()


def test_dyck_rejects_bad_parameters():
    with pytest.raises(ExactLensError, match="k"):
        get("dyck", k=5)
    with pytest.raises(ExactLensError, match="max_depth"):
        get("dyck", max_depth=0)
    with pytest.raises(ExactLensError, match="takes the parameters"):
        get("dyck", depth=2)
    with pytest.raises(ExactLensError, match="not in the alphabet"):
        get("dyck").contains("(]")


# ---- induction ---------------------------------------------------------------------------------------------------


def test_induction_hand_cases():
    recent, frequent = get("induction-recent"), get("induction-frequent")
    # a prediction task: one answer per position; the last one is the classic induction answer
    assert recent.target("abcab")[-1] == 2  # b was last followed by c
    assert recent.target("abacab")[-1] == 0  # ... then by a
    assert recent.target("cab")[-1] == 1  # no earlier b: the current symbol
    assert recent.target("aa")[-1] == 0
    assert recent.target("abab") == [0, 1, 1, 0]  # a: none -> a; b: none -> b; a -> b; b -> a
    assert frequent.target("bbcbcbab")[-1] == 2  # b -> b, c, c, a: c twice
    assert frequent.target("cacbc")[-1] == 0  # c -> a, b: tie -> alphabetically first, a
    assert frequent.target("cbcacbc")[-1] == 1  # c -> b, a, b
    assert frequent.target("cab")[-1] == 0  # no earlier b: every count 0 -> first letter
    assert len(frequent.target("cab")) == 3


@pytest.mark.parametrize("name", ["induction-recent", "induction-frequent"])
@SETTINGS
@given(words=st.lists(st.text(alphabet="abc", min_size=7, max_size=7), min_size=1, max_size=8))
def test_induction_vectorized_matches_per_word(name, words):
    lang = get(name)
    assert lang.targets(torch.tensor(lang.to_ids(words))).tolist() == [lang.target(w) for w in words]


@pytest.mark.parametrize("name", ["induction-recent", "induction-frequent"])
def test_induction_hard_words_and_errors(name):
    lang = get(name, num_symbols=4)
    for length in range(1, 15):
        hard = lang.hard_words(length)
        assert hard.shape[1] == length
        assert lang.targets(hard).tolist() == [lang.target(w) for w in lang.decode(hard)]
    with pytest.raises(ExactLensError, match="num_symbols"):
        get(name, num_symbols=1)
    with pytest.raises(ExactLensError, match="empty word"):
        lang.target("")
    with pytest.raises(ExactLensError, match="prediction task"):
        lang.contains("ab")

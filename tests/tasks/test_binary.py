"""Property tests of the formal languages: tokenization, membership, enumeration and sampling."""

from __future__ import annotations

import itertools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from exactlens.errors import ExactLensError
from exactlens.tasks import CLS, EOS, TASKS, First, Parity, get

SETTINGS = settings(max_examples=50, deadline=None)
NAMES = sorted(TASKS)
BITS = ("parity", "first")

bit_words = st.text(alphabet="01", max_size=12)
word_lists = st.lists(bit_words, min_size=1, max_size=6)


def id_rows(length: int, count: int | None = None):
    """Lists of `count` (or 1 to 5) words of the given length, as symbol ids."""
    row = st.lists(st.integers(0, 1), min_size=length, max_size=length)
    return st.lists(row, min_size=count or 1, max_size=count or 5)


equal_length_ids = st.integers(0, 6).flatmap(id_rows)


def test_registry():
    assert isinstance(get("parity"), Parity) and isinstance(get("first"), First)
    with pytest.raises(ExactLensError, match="unknown task 'nope'; known: .*first.*parity"):
        get("nope")


@pytest.mark.parametrize("name", BITS)
def test_vocabulary(name):
    language = get(name)
    assert language.alphabet == ("0", "1")
    assert language.vocab == ("0", "1", CLS)
    assert EOS not in language.vocab and language.n_specials == 1
    assert language.token_id(CLS) == 2


# ---- tokenization ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", BITS)
@SETTINGS
@given(words=word_lists)
def test_tokenize_round_trip_and_layout(name, words):
    language = get(name)
    batch = language.tokenize(words)
    cls = language.token_id(CLS)
    assert len(batch) == len(words)
    assert batch.n_positions.tolist() == [len(w) + 1 for w in words]
    assert batch.tokens.dtype == torch.long and batch.n_positions.dtype == torch.long
    assert batch.tokens.shape == (len(words), max(len(w) for w in words) + 1)
    for row, word in enumerate(words):
        n = len(word) + 1
        tokens = batch.tokens[row]
        assert int(tokens[0]) == cls
        # [CLS] at position 0 and nowhere else; the rest of the real positions are the word's symbols
        real = tokens[1:n]
        assert (real != cls).all()
        assert language.decode(real.unsqueeze(0)) == [word]
        assert real.tolist() == [language.alphabet.index(s) for s in word]
        # right padding: the row equals the word tokenized alone, followed by valid ids
        alone = language.tokenize([word])
        assert alone.tokens.shape == (1, n) and alone.n_positions.tolist() == [n]
        assert torch.equal(tokens[:n], alone.tokens[0])
        assert ((tokens[n:] >= 0) & (tokens[n:] < len(language.vocab))).all()


@pytest.mark.parametrize("name", BITS)
@SETTINGS
@given(words=word_lists)
def test_symbol_sequences_tokenize_like_strings(name, words):
    language = get(name)
    as_lists = language.tokenize([list(w) for w in words])
    as_strings = language.tokenize(words)
    assert torch.equal(as_lists.tokens, as_strings.tokens)
    assert torch.equal(as_lists.n_positions, as_strings.n_positions)


@pytest.mark.parametrize("name", BITS)
@SETTINGS
@given(ids=equal_length_ids)
def test_encode_matches_tokenize(name, ids):
    language = get(name)
    symbol_ids = torch.tensor(ids, dtype=torch.long).reshape(len(ids), -1)
    encoded = language.encode(symbol_ids)
    tokenized = language.tokenize(language.decode(symbol_ids))
    assert torch.equal(encoded.tokens, tokenized.tokens)
    assert torch.equal(encoded.n_positions, tokenized.n_positions)


foreign_symbol = st.one_of(
    st.text(min_size=1, max_size=3).filter(lambda s: s not in ("0", "1")),
    st.integers(),
    st.none(),
    st.just(CLS),
    st.just(EOS),
    st.just(["1"]),
)


@pytest.mark.parametrize("name", BITS)
@SETTINGS
@given(prefix=st.lists(st.sampled_from("01"), max_size=4), bad=st.lists(foreign_symbol, min_size=1, max_size=3))
def test_foreign_symbols_raise(name, prefix, bad):
    language = get(name)
    word = prefix + bad
    with pytest.raises(ExactLensError, match="not in the alphabet"):
        language.tokenize(["01", word])
    with pytest.raises(ExactLensError, match="not in the alphabet"):
        language.contains(word)


@pytest.mark.parametrize("name", BITS)
@SETTINGS
@given(word=st.text(min_size=1, max_size=8).filter(lambda w: set(w) - {"0", "1"}))
def test_foreign_characters_are_named(name, word):
    language = get(name)
    with pytest.raises(ExactLensError) as info:
        language.tokenize([word])
    bad = sorted(set(word) - {"0", "1"})
    assert repr(bad[0]) in str(info.value)


@pytest.mark.parametrize("name", BITS)
def test_tokenize_bad_batches(name):
    language = get(name)
    with pytest.raises(ExactLensError, match="empty batch"):
        language.tokenize([])
    with pytest.raises(ExactLensError, match="list of words"):
        language.tokenize("0110")
    for item in (5, None, 1.5):
        with pytest.raises(ExactLensError):
            language.tokenize(["01", item])


@pytest.mark.parametrize("name", BITS)
def test_encode_bad_input(name):
    language = get(name)
    with pytest.raises(ExactLensError, match=r"\[batch, length\]"):
        language.encode(torch.zeros(3, dtype=torch.long))
    with pytest.raises(ExactLensError, match="empty batch"):
        language.encode(torch.zeros(0, 3, dtype=torch.long))
    with pytest.raises(ExactLensError, match=r"\[0, 2\)"):
        language.encode(torch.tensor([[0, 2]]))
    with pytest.raises(ExactLensError, match=r"\[0, 2\)"):
        language.encode(torch.tensor([[-1, 0]]))


@pytest.mark.parametrize("name", BITS)
def test_empty_word(name):
    batch = get(name).tokenize(["", "1"])
    assert batch.n_positions.tolist() == [1, 2]
    assert batch.tokens[:, 0].tolist() == [2, 2]


# ---- membership ------------------------------------------------------------------------------------------------


def parity_of(word: str) -> bool:
    return word.count("1") % 2 == 1


def first_of(word: str) -> bool:
    return word[:1] == "1"


DEFINITIONS = {"parity": parity_of, "first": first_of}


@pytest.mark.parametrize("name", BITS)
@SETTINGS
@given(data=st.data(), length=st.integers(0, 40), count=st.integers(1, 12))
def test_membership_matches_contains(name, data, length, count):
    language = get(name)
    rows = data.draw(id_rows(length, count))
    ids = torch.tensor(rows, dtype=torch.long).reshape(count, length)
    words = language.decode(ids)
    vectorized = language.membership(ids)
    assert vectorized.dtype == torch.bool and vectorized.shape == (count,)
    assert vectorized.tolist() == [language.contains(w) for w in words]
    assert vectorized.tolist() == [DEFINITIONS[name](w) for w in words]
    assert language.labels(words).tolist() == vectorized.tolist()


@pytest.mark.parametrize("name", BITS)
@pytest.mark.parametrize("length", range(0, 9))
def test_membership_exhaustive(name, length):
    language = get(name)
    words = language.all_words(length)
    decoded = language.decode(words)
    assert language.membership(words).tolist() == [DEFINITIONS[name](w) for w in decoded]
    if length:
        assert int(language.membership(words).sum()) == 2 ** (length - 1)  # half of all words, for both


# ---- enumeration, sampling, hard words -----------------------------------------------------------------------------


@pytest.mark.parametrize("name", BITS)
@pytest.mark.parametrize("length", range(0, 11))
def test_all_words_enumerates_every_word_once(name, length):
    words = get(name).all_words(length)
    assert words.shape == (2**length, length)
    assert ((words == 0) | (words == 1)).all()
    assert {tuple(w) for w in words.tolist()} == set(itertools.product((0, 1), repeat=length))


def test_all_words_bad_lengths():
    with pytest.raises(ExactLensError, match="too many"):
        get("parity").all_words(23)
    with pytest.raises(ExactLensError, match="below the minimum"):
        get("parity").all_words(-1)
    with pytest.raises(ExactLensError, match="must be an integer"):
        get("parity").all_words(2.0)


@pytest.mark.parametrize("name", BITS)
@SETTINGS
@given(seed=st.integers(0, 2**32), length=st.integers(0, 30), count=st.integers(1, 20))
def test_sample_is_reproducible_from_the_seed(name, seed, length, count):
    language = get(name)
    a = language.sample(length, count, torch.Generator().manual_seed(seed))
    b = language.sample(length, count, torch.Generator().manual_seed(seed))
    assert torch.equal(a, b)
    assert a.shape == (count, length)
    assert ((a == 0) | (a == 1)).all()


@pytest.mark.parametrize("name", BITS)
def test_sample_depends_on_the_seed(name):
    language = get(name)
    a = language.sample(20, 10, torch.Generator().manual_seed(0))
    b = language.sample(20, 10, torch.Generator().manual_seed(1))
    assert not torch.equal(a, b)


@pytest.mark.parametrize("name", BITS)
def test_sample_is_roughly_uniform(name):
    language = get(name)
    length, count = 3, 16000
    words = language.sample(length, count, torch.Generator().manual_seed(1234))
    index = (words * torch.tensor([4, 2, 1])).sum(1)
    counts = torch.bincount(index, minlength=8).double()
    expected = count / 8
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < 30, counts.tolist()  # 7 degrees of freedom: P(chi2 > 30) < 1e-4
    ones = language.sample(50, 2000, torch.Generator().manual_seed(99)).double().mean(0)
    assert ((ones > 0.44) & (ones < 0.56)).all()  # each position is a fair bit
    members = language.membership(language.sample(40, 4000, torch.Generator().manual_seed(5)))
    assert 0.47 < float(members.double().mean()) < 0.53  # both languages hold half of all words


@pytest.mark.parametrize("name", BITS)
def test_sample_bad_length(name):
    with pytest.raises(ExactLensError, match="below the minimum"):
        get(name).sample(-2, 3, torch.Generator().manual_seed(0))


@pytest.mark.parametrize("name", BITS)
@pytest.mark.parametrize("length", [0, 1, 2, 3, 5, 8, 13, 40, 101])
def test_hard_words_are_valid_words_of_the_length(name, length):
    language = get(name)
    words = language.hard_words(length)
    assert words.ndim == 2 and words.shape[1] == length
    assert ((words == 0) | (words == 1)).all()
    if length:
        assert words.shape[0] >= 2
        language.tokenize(language.decode(words))  # valid words: no error
        members = language.membership(words)
        assert members.any() and not members.all()  # both classes appear
    if name == "parity":
        # 1^k 0^(L-k), distinct counts k including 0 and L
        counts = words.sum(1).tolist()
        assert len(set(counts)) == len(counts) and {0, length} <= set(counts)
        for row, k in zip(words.tolist(), counts, strict=True):
            assert row == [1] * k + [0] * (length - k)
    if name == "first" and length >= 2:
        rows = words.tolist()
        assert [1] + [0] * (length - 1) in rows and [0] + [1] * (length - 1) in rows


def test_hard_words_bad_length():
    with pytest.raises(ExactLensError, match="below the minimum"):
        get("first").hard_words(-1)
    with pytest.raises(ExactLensError, match="must be an integer"):
        get("parity").hard_words(3.5)

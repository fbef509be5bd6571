"""Cookbook §9 examples and Brody et al.'s MAJORITY: exhaustive and random verification
against the languages' independent targets, closed forms of the read-out quantities,
intermediate residual values, and the nonuniform constructions' length limit."""

from __future__ import annotations

import pytest
import torch

from exactlens.analysis.verify import precision, verify
from exactlens.constructions import build, get
from exactlens.errors import ExactLensError
from exactlens.tasks import get as language

DTYPES = ("float32", "float64")


def outputs(model, lang, ids):
    """The read-out values [batch, outputs] (or [batch] for a sigmoid readout); for a per-position
    readout [batch, |w|, outputs], one row per symbol (the [CLS] position dropped)."""
    out = model.readout(lang.encode(ids).tokens)
    return out[:, 1:] if model.cfg.readout == "per_position" else out


def label(model, cache, hook, name):
    return cache[hook][..., model.cfg.residual_labels.index(name)]


# ---- exhaustive verification (the slow marks go to length 10-12 and to long random words) ----------------------

EXHAUSTIVE = [
    ("majority", {"num_classes": 3}, range(1, 9)),
    ("induction-recent", {}, range(1, 9)),
    ("induction-frequent", {}, range(1, 9)),
    ("dyck1", {}, range(0, 13)),
    ("dyck1", {"max_length": 12}, range(0, 13)),
    ("dyck1-depth2", {}, range(0, 13)),
    ("dyck1-depth2", {"max_length": 12, "weighting": "average_hard"}, range(0, 13)),
    ("dyck-k-D", {"k": 2, "D": 2}, range(0, 7)),
    ("dyck-k-D", {"k": 2, "D": 3, "max_length": 6}, range(0, 7)),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("name", "params", "lengths"), EXHAUSTIVE)
def test_exhaustive(name, params, lengths, dtype):
    result = verify(name, lengths, dtype=dtype, params=params, exhaustive_limit=2**13)
    assert all(r["exhaustive"] for r in result["results"])
    assert [r["accuracy"] for r in result["results"]] == [1.0] * len(lengths)
    assert min(r["min_abs_logit"] for r in result["results"]) > 0


SLOW = [
    ("majority", {"num_classes": 3}, [10, 11, 12], [50, 200]),
    ("majority", {}, [], [50, 500]),
    ("induction-recent", {}, [10, 11, 12], [100, 1000]),
    ("induction-frequent", {}, [10, 11, 12], [100, 1000]),
    ("dyck1", {}, [], [100, 1000]),
    ("dyck1-depth2", {}, [], [100, 1000]),
    ("dyck-k-D", {"k": 2, "D": 2}, [8, 10], [100, 1000]),
    ("dyck-k-D", {"k": 3, "D": 4}, [], [100, 1000]),
]


@pytest.mark.slow
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("name", "params", "exhaustive", "random"), SLOW)
def test_exhaustive_long_and_random_long(name, params, exhaustive, random, dtype):
    result = verify(name, exhaustive + random, dtype=dtype, params=params, strings=500, exhaustive_limit=2**20)
    assert [r["exhaustive"] for r in result["results"]] == [True] * len(exhaustive) + [False] * len(random)
    assert [r["accuracy"] for r in result["results"]] == [1.0] * len(exhaustive + random)


@pytest.mark.parametrize("name", ["majority", "induction-frequent", "dyck1", "dyck1-depth2"])
def test_precision_sweep_with_hard_words(name):
    result = precision(name, dtype="float32", max_length=200, strings=16, lengths=[1, 2, 3, 5, 9, 17, 33, 64, 200])
    assert result["first_failure_length"] is None and result["max_exact_length"] == 200


# ---- closed forms of the read-out quantities --------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
def test_majority_logits_closed_form(dtype):
    k, length = 5, 13
    lang = language("majority", num_classes=k)
    ids = lang.sample(length, 200, torch.Generator().manual_seed(0))
    got = outputs(build("majority", dtype=dtype, num_classes=k), lang, ids).double()
    n = length + 1
    expected = (lang.counts(ids).double() - torch.arange(k, dtype=torch.float64) / k) / n  # (count_c - c/k) / n
    tol = 1e-6 if dtype == "float32" else 1e-14
    assert torch.allclose(got, expected, atol=tol, rtol=0)


def test_majority_breaks_ties_like_the_task():
    lang = language("majority", num_classes=4)
    ids = torch.tensor(lang.to_ids(["dcdcd", "bbaac", "ddccb"]))
    model = build("majority", dtype="float64", num_classes=4)
    assert outputs(model, lang, ids).argmax(-1).tolist() == [3, 0, 2] == lang.targets(ids).tolist()


def test_majority_uniform_attention_pattern():
    lang = language("majority")
    model = build("majority", dtype="float64")
    _, cache = model.run_with_cache(lang.tokenize(["abcab"]).tokens)
    assert torch.equal(cache["blocks.0.attn.hook_pattern"][0, 0], torch.full((6, 6), 1 / 6, dtype=torch.float64))


def test_induction_recent_copies_the_follower_of_the_latest_match():
    lang = language("induction-recent")
    model = build("induction-recent", dtype="float64")
    words = ["abcab", "abacab", "cab", "aa", "bcacbab"]
    tokens = lang.tokenize(words).tokens[:1]
    _, cache = model.run_with_cache(lang.tokenize(words[:1]).tokens)
    prev = torch.stack([label(model, cache, "blocks.0.hook_resid_post", f"prev_{s}")[0] for s in "abc"], -1)
    assert prev.tolist() == [[0, 0, 0], [0, 0, 0], [1, 0, 0], [0, 1, 0], [0, 0, 1], [1, 0, 0]]  # CLS a b c a b
    pattern = cache["blocks.1.attn.hook_pattern"][0, 0]
    assert pattern[5].tolist() == [0, 0, 0, 1, 0, 0]  # last b attends to the c after the earlier b
    del tokens
    for word in words:
        ids = torch.tensor(lang.to_ids([word]))
        got = outputs(model, lang, ids)
        assert got.tolist() == [torch.nn.functional.one_hot(torch.tensor(lang.target(word)), 3).double().tolist()]
        assert got.shape == (1, len(word), 3)


@pytest.mark.parametrize("dtype", DTYPES)
def test_induction_frequent_logits_closed_form(dtype):
    lang = language("induction-frequent", num_symbols=4)
    length = 15
    ids = lang.sample(length, 300, torch.Generator().manual_seed(2))
    got = outputs(build("induction-frequent", dtype=dtype, num_symbols=4), lang, ids).double()[:, -1]  # last symbol
    x = ids[:, -1:]
    follows = torch.nn.functional.one_hot(ids[:, 1:], 4) * (ids[:, :-1] == x).unsqueeze(-1)
    # (count_y - y/k) / n
    expected = (follows.sum(1).double() - torch.arange(4, dtype=torch.float64) / 4) / (length + 1)
    tol = 1e-6 if dtype == "float32" else 1e-13
    assert torch.allclose(got, expected, atol=tol, rtol=0)


@pytest.mark.parametrize("dtype", DTYPES)
def test_dyck1_outputs_closed_form(dtype):
    lang = language("dyck")
    length = 16
    ids = lang.sample(length, 300, torch.Generator().manual_seed(4))
    got = outputs(build("dyck1", dtype=dtype), lang, ids).double()
    steps = 1 - 2 * ids.double()  # ( -> +1, ) -> -1
    prefix = torch.cat([torch.zeros(len(ids), 1, dtype=torch.float64), steps.cumsum(1)], 1)  # position 0 = CLS
    positions = torch.arange(length + 1, dtype=torch.float64) + 1
    e = torch.relu(-prefix / positions)
    n = length + 1
    tol = 1e-6 if dtype == "float32" else 1e-14
    assert torch.allclose(got[:, 0], prefix[:, -1] / n, atol=tol, rtol=0)
    assert torch.allclose(got[:, 1], e.mean(1), atol=tol, rtol=0)
    assert torch.allclose(got[:, 2], torch.full((len(ids),), 1 / n, dtype=torch.float64), atol=tol, rtol=0)


def _remaining_after_rounds(word: str, rounds: int) -> int:
    """Positions left after `rounds` rounds of deleting every adjacent matched pair
    (reference for the construction's unmatched count, written on strings)."""
    pairs = {")": "(", "]": "[", "}": "{"}
    items = list(word)
    for _ in range(rounds):
        keep = [True] * len(items)
        for a in range(len(items) - 1):
            if pairs.get(items[a + 1]) == items[a]:
                keep[a] = keep[a + 1] = False
        items = [s for s, k in zip(items, keep, strict=True) if k]
    return len(items)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("k", "depth"), [(1, 2), (2, 3), (3, 2)])
def test_dyck_kd_unmatched_count_closed_form(k, depth, dtype):
    lang = language("dyck", k=k, max_depth=depth)
    length = 14
    ids = lang.sample(length, 200, torch.Generator().manual_seed(k + depth))
    got = outputs(build("dyck-k-D", dtype=dtype, k=k, D=depth), lang, ids).double()
    remaining = torch.tensor([_remaining_after_rounds(w, depth) for w in lang.decode(ids)], dtype=torch.float64)
    assert torch.allclose(got[:, 0], remaining / (length + 1), atol=1e-6, rtol=0)
    assert ((remaining == 0) == lang.membership(ids)).all()


# ---- uniform vs nonuniform --------------------------------------------------------------------------------------


def test_metadata_states_the_kind_of_decision():
    assert build("dyck1").cfg.metadata["decision"] == "uniform external check"
    nonuniform = build("dyck1", max_length=10)
    assert nonuniform.cfg.metadata["decision"] == "nonuniform 0/1 decision"
    assert nonuniform.cfg.metadata["max_length"] == 10 and nonuniform.cfg.readout == "sigmoid"
    task = {"name": "dyck", "kind": "membership", "params": {"k": 2, "max_depth": 3}}
    assert build("dyck-k-D", k=2, D=3).cfg.task == task


def test_nonuniform_refuses_and_fails_beyond_its_length():
    with pytest.raises(ExactLensError, match="built for"):
        verify("dyck1", [11], params={"max_length": 10})
    # Used anyway on longer words, the tolerance 1/(N+1)^2 is too coarse for a late violation.
    lang = language("dyck")
    model = build("dyck1", dtype="float64", max_length=4)
    ids = lang.hard_words(20)
    n_positions = torch.full((len(ids),), ids.shape[1] + 1)  # [CLS] + the word
    decided = get("dyck1").decide(outputs(model, lang, ids), n_positions)
    assert (decided != lang.membership(ids)).any()


def test_bad_parameters():
    with pytest.raises(ExactLensError, match="max_length"):
        build("dyck1", max_length=0)
    with pytest.raises(ExactLensError, match="weighting"):
        build("dyck-k-D", weighting="softmax")
    with pytest.raises(ExactLensError, match="num_classes"):
        build("majority", num_classes=1)
    with pytest.raises(ExactLensError, match="length 0 is below the minimum 1"):
        verify("majority", [0])

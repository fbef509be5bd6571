"""exactlens.analysis.verify: verify(), precision(), parse_lengths().

Numbers are checked against independent computations: the model's logits on the same words,
the languages' definitions written inline, and cross-entropy from math.log on each logit.
"""

from __future__ import annotations

import json
import math

import pytest
import torch

from exactlens.analysis.verify import parse_lengths, precision, verify, words_for_length
from exactlens.constructions import build, get
from exactlens.errors import ExactLensError
from exactlens.tasks import Parity, kinds
from exactlens.tasks import get as get_language

VERIFY_KEYS = {"name", "dtype", "seed", "results", "task", "decision_rule", "device"}
VERIFY_OPTIONAL = {"params"}
ROW_KEYS = {"length", "strings", "accuracy", "cross_entropy_bits", "min_abs_logit"}
ROW_OPTIONAL = {"exhaustive", "non_finite_words"}
PRECISION_KEYS = {"name", "dtype", "max_exact_length", "first_failure_length", "checked", "task"}


def ce_bits_reference(logit: float, member: bool) -> float:
    """-log2 P(correct) under sigmoid, computed stably from one float."""
    z = logit if member else -logit  # P(correct) = sigmoid(z)
    nats = math.log1p(math.exp(-z)) if z > 0 else -z + math.log1p(math.exp(z))
    return nats / math.log(2)


def all_words(length: int) -> list[str]:
    return [format(i, f"0{length}b") if length else "" for i in range(2**length)]


def check_shape(result: dict) -> None:
    assert VERIFY_KEYS <= set(result) <= VERIFY_KEYS | VERIFY_OPTIONAL
    for row in result["results"]:
        assert ROW_KEYS <= set(row), row
        assert set(row) - ROW_KEYS <= ROW_OPTIONAL, f"unexpected row fields {set(row) - ROW_KEYS}"
        assert isinstance(row["length"], int) and isinstance(row["strings"], int)
        for key in ("accuracy", "cross_entropy_bits", "min_abs_logit"):
            assert isinstance(row[key], float)
    json.loads(json.dumps(result))  # plain JSON types only


# ----------------------------------------------------------------------------- verify


def test_verify_fields_and_exhaustive_short_lengths():
    result = verify("parity", [1, 3, 12, 13], strings=40, dtype="float64", seed=5)
    check_shape(result)
    assert result["name"] == "parity" and result["dtype"] == "float64" and result["seed"] == 5
    rows = result["results"]
    assert [r["length"] for r in rows] == [1, 3, 12, 13]
    assert [r["strings"] for r in rows] == [2, 8, 4096, 40]  # 2^|w| up to 4096 words, then samples
    if "exhaustive" in rows[0]:
        assert [r["exhaustive"] for r in rows] == [True, True, True, False]
    assert all(r["accuracy"] == 1.0 for r in rows)
    for r in rows:  # even n: every logit is ±2 tanh(1)/n^2
        n = r["length"] + 1
        if n % 2 == 0:
            assert r["min_abs_logit"] == pytest.approx(2 * math.tanh(1.0) / n**2, rel=1e-9)


@pytest.mark.parametrize("name, params", [("first-flawed", {"c": 1.0}), ("parity", {}), ("first-ln", {"eps": 1e-5})])
def test_verify_numbers_match_independent_computation(name, params):
    lengths = [1, 2, 3, 5, 8]
    result = verify(name, lengths, dtype="float64", params=params)
    check_shape(result)
    if "params" in result:
        assert result["params"] == params
    model = build(name, dtype="float64", **params)
    lang = get_language(get(name).language)
    for row, length in zip(result["results"], lengths, strict=True):
        texts = all_words(length)
        with torch.no_grad():
            logits = model.readout_logits(lang.tokenize(texts).tokens).double().tolist()
        member = [t.count("1") % 2 == 1 for t in texts] if name == "parity" else [t[:1] == "1" for t in texts]
        accuracy = sum((s > 0) == m for s, m in zip(logits, member, strict=True)) / len(texts)
        ce = sum(ce_bits_reference(s, m) for s, m in zip(logits, member, strict=True)) / len(texts)
        assert row["strings"] == len(texts)
        assert row["accuracy"] == pytest.approx(accuracy, abs=1e-15)
        assert row["cross_entropy_bits"] == pytest.approx(ce, rel=1e-12)
        assert row["min_abs_logit"] == pytest.approx(min(abs(s) for s in logits), rel=1e-12)
    if name == "first-flawed":  # e = 2.718 < 3: wrong at |w| = 3 (on 1 0 0) and beyond
        accs = [r["accuracy"] for r in result["results"]]
        assert accs[:2] == [1.0, 1.0] and all(a < 1 for a in accs[2:])
        assert result["results"][2]["accuracy"] == pytest.approx(7 / 8)


def test_cross_entropy_bits_helper():
    logits = torch.tensor([0.0, 2.0, -2.0, 40.0, -40.0, 800.0], dtype=torch.float64)
    labels = torch.tensor([True, True, True, False, True, True])
    got = kinds.cross_entropy_bits(Parity(), logits, labels, torch.zeros(6, dtype=torch.long)).tolist()
    expected = [ce_bits_reference(float(s), bool(m)) for s, m in zip(logits, labels, strict=True)]
    assert got == pytest.approx(expected, rel=1e-12)
    assert got[0] == 1.0 and got[-1] == 0.0 and math.isfinite(got[3])


def test_verify_prop2_cross_entropy_is_eta():
    result = verify("parity-ln-eta", [2, 7, 20], strings=16, dtype="float64", params={"eta": 0.05})
    for row in result["results"]:
        assert row["accuracy"] == 1.0
        assert row["cross_entropy_bits"] == pytest.approx(0.05, rel=1e-9)


def test_verify_seeds_are_reproducible():
    kwargs = dict(name="first-flawed", lengths=[15, 30], strings=32, dtype="float64", params={"c": 2.0})
    a = verify(seed=3, **kwargs)
    b = verify(seed=3, **kwargs)
    c = verify(seed=4, **kwargs)
    assert a == b
    assert c["seed"] == 4 and a["results"] != c["results"]
    task = get("first").task_of()
    w1, ex = words_for_length(task, 30, 10, seed=3, exhaustive_limit=4096)
    w2, _ = words_for_length(task, 30, 10, seed=3, exhaustive_limit=4096)
    w3, _ = words_for_length(task, 30, 10, seed=4, exhaustive_limit=4096)
    assert not ex and torch.equal(w1, w2) and not torch.equal(w1, w3)


def test_verify_accepts_a_prebuilt_model_and_rejects_bad_input():
    model = build("first", dtype="float64", c=2.0)
    result = verify("first", [4], model=model, dtype="float64")
    assert result["results"][0]["min_abs_logit"] == pytest.approx(math.exp(2) / (math.exp(2) + 4) / 2, rel=1e-12)
    with pytest.raises(ExactLensError):
        verify("nope", [1])
    with pytest.raises(ExactLensError):
        verify("parity", [1], strings=0)
    with pytest.raises(ExactLensError):
        verify("parity", [1], params={"c": -1})
    with pytest.raises(ExactLensError):
        verify("parity", [1], params={"gamma": 1})


# ----------------------------------------------------------------------------- precision


def test_precision_first_flawed_c3():
    """e^3 = 20.09: every word with |w| <= 20 is right, 1 0^20 is wrong."""
    result = precision("first-flawed", dtype="float64", max_length=40, strings=16, params={"c": 3.0})
    assert PRECISION_KEYS <= set(result) <= PRECISION_KEYS | {"params", "device"}
    assert result["name"] == "first-flawed" and result["dtype"] == "float64"
    assert result["max_exact_length"] == 20
    assert result["first_failure_length"] == 21
    checked = {row["length"]: row for row in result["checked"]}
    assert all(checked[k]["errors"] == 0 for k in range(1, 21))
    assert checked[21]["errors"] > 0
    assert [row["length"] for row in result["checked"]] == sorted(checked)
    json.loads(json.dumps(result))
    result32 = precision("first-flawed", dtype="float32", max_length=40, strings=16, params={"c": 3.0})
    assert (result32["max_exact_length"], result32["first_failure_length"]) == (20, 21)


@pytest.mark.parametrize("c, boundary", [(1.0, 2), (2.0, 7), (math.log(10) + 1e-6, 10)])
def test_precision_first_flawed_boundary_is_floor_exp_c(c, boundary):
    result = precision("first-flawed", dtype="float64", max_length=60, strings=8, params={"c": c})
    assert result["max_exact_length"] == boundary == math.floor(math.exp(c))
    assert result["first_failure_length"] == boundary + 1


def test_precision_parity_float64_exact_on_short_lengths():
    result = precision("parity", dtype="float64", max_length=40, strings=16)
    assert result["first_failure_length"] is None
    assert result["max_exact_length"] == 40
    lengths = [row["length"] for row in result["checked"]]
    assert lengths[: 32] == list(range(1, 33)) and lengths[-1] == 40
    assert all(row["errors"] == 0 for row in result["checked"])


def test_precision_given_lengths_and_errors():
    result = precision("first", dtype="float64", max_length=50, strings=4, lengths=[5, 50, 17])
    assert [row["length"] for row in result["checked"]] == [5, 17, 50]
    assert result["max_exact_length"] == 50 and result["first_failure_length"] is None
    with pytest.raises(ExactLensError):
        precision("first", max_length=0)
    with pytest.raises(ExactLensError):
        precision("no-such-construction")


# ----------------------------------------------------------------------------- parse_lengths


@pytest.mark.parametrize("spec, expected", [
    ("1:5", [1, 2, 3, 4, 5]),
    ("2:10:3", [2, 5, 8]),
    ("7:7", [7]),
    ("0:2", [0, 1, 2]),
    ("3,1,7", [3, 1, 7]),
    ("12", [12]),
    ("1:1000:250", [1, 251, 501, 751]),
])
def test_parse_lengths_accepts(spec, expected):
    assert parse_lengths(spec) == expected


@pytest.mark.parametrize("spec", ["", "a:b", "5:1", "1:5:0", "1:5:-1", "1:2:3:4", "-1,2", "-3:2", "1,,2", "1.5",
                                  "1:", ":5", "x", "1;2"])
def test_parse_lengths_rejects(spec):
    with pytest.raises(ExactLensError):
        parse_lengths(spec)


def test_precision_narrows_a_wide_gap_to_the_exact_first_failure():
    # e^6 = 403.43: first-flawed (c = 6) is exact up to |w| = 403 and fails at 404; the log
    # grid brackets this with a gap that is narrowed by bisection and then scanned.
    result = precision("first-flawed", max_length=1000, params={"c": 6.0})
    assert (result["max_exact_length"], result["first_failure_length"]) == (403, 404)
    checked = {row["length"]: row["errors"] for row in result["checked"]}
    assert checked[403] == 0 and checked[404] > 0

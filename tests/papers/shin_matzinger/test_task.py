"""The category-pair task of Shin & Matzinger: targets, masks, seeded generator, bad input."""

from __future__ import annotations

import pytest
import torch

from exactlens.errors import ExactLensError
from exactlens.papers.shin_matzinger.task import PairGenerator, make_q, pair_targets, target_mask
from exactlens.tasks import get


def test_targets_and_mask() -> None:
    q = make_q("code", 4)
    x = torch.tensor([[0, 2, 1, 1]])  # the paper's (1, 3, 2, 2), counted from 0
    assert pair_targets(x, q).tolist() == [[0.0, 13.0, 32.0, 22.0]]
    assert target_mask(4).tolist() == [False, True, True, True]


def test_generator_is_seeded() -> None:
    q = make_q("normal", 5, seed=1)
    a = PairGenerator(q, 7, seed=3).batch(20)
    b = PairGenerator(q, 7, seed=3).batch(20)
    c = PairGenerator(q, 7, seed=4).batch(20)
    assert torch.equal(a.categories, b.categories) and not torch.equal(a.categories, c.categories)
    assert a.categories.min() >= 0 and a.categories.max() < 5
    assert torch.equal(a.targets[:, 1:], q[a.categories[:, :-1], a.categories[:, 1:]])
    assert torch.equal(make_q("normal", 5, seed=1), q) and not torch.equal(make_q("normal", 5, seed=2), q)


def test_bad_input() -> None:
    with pytest.raises(ExactLensError, match="positions"):
        PairGenerator(make_q("code", 3), 1)
    with pytest.raises(ExactLensError, match="categories"):
        make_q("code", 0)
    with pytest.raises(ExactLensError, match="kind"):
        make_q("uniform", 3)
    with pytest.raises(ExactLensError, match="square"):
        PairGenerator(torch.zeros(2, 3), 4)
    with pytest.raises(ExactLensError, match="finite"):
        PairGenerator(torch.tensor([[float("nan")]]), 4)
    with pytest.raises(ExactLensError, match="batch size"):
        PairGenerator(make_q("code", 3), 4).batch(0)


def test_language_has_no_membership() -> None:
    lang = get("pairs", categories=3, q="code")
    assert lang.alphabet == ("0", "1", "2") and not lang.use_cls
    with pytest.raises(ExactLensError, match="regression task"):
        lang.membership(torch.zeros(1, 3, dtype=torch.long))
    assert lang.targets(torch.tensor([[0, 1]])).tolist() == [[0.0, 12.0]]

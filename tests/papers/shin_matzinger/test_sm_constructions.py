"""Shin & Matzinger §2 constructions: exact for any q_true, the paper's matrices, the large constant."""

from __future__ import annotations

import itertools

import pytest
import torch

from exactlens.analysis.verify import verify
from exactlens.constructions import build, get, names
from exactlens.errors import ExactLensError
from exactlens.papers.shin_matzinger import constructions as sm
from exactlens.papers.shin_matzinger.task import make_q

BUILDERS = {"solution1": sm.build_solution1, "solution2": sm.build_solution2, "solution3": sm.build_solution3}


def expected(words: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Independent targets: a Python loop over the pairs."""
    out = torch.zeros(words.shape, dtype=torch.float64)
    for row, word in enumerate(words.tolist()):
        for i in range(1, len(word)):
            out[row, i] = float(q[word[i - 1], word[i]])
    return out


def tolerance(model, q: torch.Tensor) -> float:
    scale = max(float(q.abs().max()), float(model.cfg.metadata.get("large", 1.0)))
    return 16 * torch.finfo(model.cfg.torch_dtype).eps * scale


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("kind", ["normal", "code"])
@pytest.mark.parametrize("solution", list(BUILDERS))
def test_exact_on_all_short_and_random_long_sequences(solution: str, kind: str, dtype: str) -> None:
    for n, m in [(1, 3), (3, 4), (10, 50)]:
        q = make_q(kind, n, seed=n)
        model = BUILDERS[solution](q, m, dtype=dtype)
        short = torch.tensor(list(itertools.product(range(n), repeat=min(m, 4) if n < 10 else 3)))
        gen = torch.Generator().manual_seed(5)
        long = torch.randint(0, n, (64, m), generator=gen)
        for words in (short, long):
            pred = model(words)[..., 0].double()
            err = (pred[:, 1:] - expected(words, q)[:, 1:]).abs().max().item()
            assert err <= tolerance(model, q), (solution, kind, dtype, n, m, err)


def test_code_is_eq_2_15() -> None:
    q = make_q("code", 4)
    assert q.tolist() == [[11, 12, 13, 14], [21, 22, 23, 24], [31, 32, 33, 34], [41, 42, 43, 44]]


def test_solutions_2_and_3_give_identical_outputs() -> None:
    """§2.3.1: diagonal(S X_C^T A_2 X_C) = diagonal(X_C^T A_2^T X_C D_-1), at every position."""
    for seed in range(3):
        q = make_q("normal", 6, seed)
        words = torch.randint(0, 6, (50, 20), generator=torch.Generator().manual_seed(seed))
        two = sm.build_solution2(q, 20, dtype="float64")(words)
        three = sm.build_solution3(q, 20, dtype="float64")(words)
        assert torch.allclose(two, three, atol=1e-12, rtol=0)


def test_paper_matrices() -> None:
    n, m = 3, 5
    q = make_q("normal", n, 1)
    d_minus = torch.tensor([[float(r == c - 1) for c in range(m)] for r in range(m)], dtype=torch.float64)
    for solution, block, kq_expected in [
        ("solution1", slice(n, None), 2 * d_minus),
        ("solution2", slice(None, n), None),
        ("solution3", slice(n, None), d_minus),
    ]:
        model = BUILDERS[solution](q, m, dtype="float64")
        attn = model.blocks[0].attn
        kq = (attn.W_Q[0] @ attn.W_K[0].T).T  # paper's k^T q: x_j^T (k^T q) x_i is the score of key j, query i
        other = slice(None, n) if block.start == n else slice(n, None)
        assert torch.all(kq[other, :] == 0) and torch.all(kq[:, other] == 0)
        if kq_expected is not None:
            assert torch.equal(kq[block, block], kq_expected)
        else:  # A_2 (+ the shift c for negative entries)
            shift = model.cfg.metadata["shift"]
            assert torch.allclose(kq[block, block], q + shift)
    v1 = sm.build_solution1(q, m, dtype="float64").blocks[0].attn.W_V[0].T
    assert torch.equal(v1[:n, :n], torch.eye(n, dtype=torch.float64)) and v1[n:].abs().sum() == 0
    model3 = sm.build_solution3(q, m, dtype="float64")
    v3 = model3.blocks[0].attn.W_V[0].T
    big, shift = model3.cfg.metadata["large"], model3.cfg.metadata["shift"]
    assert torch.allclose(v3[:n, :n] * big, (q + shift).T)


def test_solution1_paper_readout_is_not_exact_but_ours_is() -> None:
    """The paper's C (q values in B's row order) fails when X_(i-1) = X_i: row (a, b) also fires."""
    n = 3
    q = make_q("normal", n, 2)
    model = sm.build_solution1(q, 4, dtype="float64")
    words = torch.tensor(list(itertools.product(range(n), repeat=4)))
    with torch.no_grad():
        model.blocks[0].mlp.W_out[:, 0] = torch.tensor([float(q[a, b]) for a, b in sm.solution1_pairs(n)])
    paper = model(words)[..., 0]
    err = (paper[:, 1:] - expected(words, q)[:, 1:]).abs()
    repeated = words[:, 1:] == words[:, :-1]
    assert err[repeated].max() > 0.1
    assert err[~repeated].max() > 0.1  # the diagonal rows' C_aa leaks into (a, b) too


@pytest.mark.parametrize("solution", ["solution2", "solution3"])
def test_large_constant_bound(solution: str) -> None:
    q = torch.tensor([[2.0, -1.0], [0.5, 3.0]], dtype=torch.float64)
    bound = 3.0 + 1.0  # max q + max(0, -min q)
    with pytest.raises(ExactLensError, match="must exceed"):
        BUILDERS[solution](q, 6, large=bound)
    with pytest.raises(ExactLensError, match="must exceed"):
        BUILDERS[solution](q, 6, large=3.5)  # larger than every |q| entry is not enough with negative entries
    words = torch.tensor(list(itertools.product(range(2), repeat=6)))
    model = BUILDERS[solution](q, 6, large=bound * 1.001, dtype="float64")
    assert (model(words)[..., 0][:, 1:] - expected(words, q)[:, 1:]).abs().max() < 1e-9
    positive = q.abs()  # non-negative q: the paper's bound, L > max q
    BUILDERS[solution](positive, 6, large=3.01)
    with pytest.raises(ExactLensError):
        BUILDERS[solution](positive, 6, large=3.0)


def test_registry_lists_them_and_verify_scores_regression() -> None:
    for name in ("sm-solution1", "sm-solution2", "sm-solution3"):
        assert name in names()
        assert "regression" in get(name).tags
        model = build(name, categories=3, positions=5, q="code")
        assert model.cfg.d_model == 8 and model.cfg.attention_weighting == "none"
        report = verify(name, [2], params={"categories": 3, "positions": 5, "q": "code"})
        assert report["task"]["kind"] == "regression"
        row = report["results"][0]
        assert row["accuracy"] == 1.0 and row["max_abs_error"] <= row["tolerance"]

"""The construction builder: weights written by residual label mean what the paper's matrices say."""

from __future__ import annotations

import pytest
import torch

from exactlens.constructions.builder import LabelledModel
from exactlens.errors import ExactLensError
from exactlens.model import ExactConfig

LABELS = ("a", "b", "p0", "p1", "p2")


def _builder() -> LabelledModel:
    cfg = ExactConfig(
        d_model=5, n_layers=1, d_vocab=2, n_heads=1, d_head=5, d_mlp=3, d_vocab_out=1, attention_mask="causal",
        attention_weighting="none", attn_scale=1.0, attn_bias=False, positional_features=("learned",), n_ctx=3,
        readout="per_position", residual_labels=LABELS, vocab=("0", "1"), dtype="float64",
    )
    return LabelledModel(cfg)


def test_full_scores_are_the_papers_bilinear_form():
    b = _builder()
    kq = {("a", "b"): 2.0, ("p0", "p1"): -3.0, ("b", "p2"): 0.5}  # (key, query) -> (K^T Q)[key, query]
    b.scores(0, 0, kq)
    attn = b.model.blocks[0].attn
    x = torch.randn(7, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    got = x @ attn.W_Q[0] @ attn.W_K[0].T @ x.T  # [query, key]
    matrix = torch.zeros(5, 5, dtype=torch.float64)
    for (key, query), w in kq.items():
        matrix[LABELS.index(key), LABELS.index(query)] = w
    assert torch.allclose(got, (x @ matrix @ x.T).T)  # x_key^T (K^T Q) x_query


def test_positions_ffn_biases_and_wrapping_an_existing_model():
    b = _builder()
    b.learned_position(2, {"p2": 1.0, "a": -1.0})
    assert b.model.pos_embed.W_pos[2].tolist() == [-1.0, 0.0, 0.0, 0.0, 1.0]
    b.ffn(0, [{"a": 1.0}, {"b": 2.0}], {"a": [3.0, 4.0]}, hidden_bias=-1.5, output_bias={"p1": 0.25})
    mlp = b.model.blocks[0].mlp
    assert mlp.b_in.tolist() == [-1.5, -1.5, 0.0], "the bias of the listed units only"
    assert mlp.b_out.tolist() == [0.0, 0.0, 0.0, 0.25, 0.0]
    assert mlp.W_out[:, 0].tolist() == [3.0, 4.0, 0.0]
    wrapped = LabelledModel.around(b.model)
    assert wrapped.model is b.model and wrapped.dim("p1") == 3
    wrapped.identity_output(0, 0)
    assert torch.equal(b.model.blocks[0].attn.W_O[0], torch.eye(5, dtype=torch.float64))
    with pytest.raises(ExactLensError, match="no residual dimension named 'c'"):
        wrapped.scores(0, 0, {("c", "a"): 1.0})

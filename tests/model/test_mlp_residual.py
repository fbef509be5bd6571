"""mlp_residual=False: the FFN output replaces the residual stream (no add, no post-LN after it)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from exactlens.errors import ExactLensError
from exactlens.model import ExactConfig, ExactTransformer


def _model(normalization: str, mlp_residual: bool) -> ExactTransformer:
    cfg = ExactConfig(
        d_model=6,
        n_layers=1,
        d_vocab=4,
        d_mlp=5,
        d_vocab_out=2,
        normalization=normalization,
        mlp_residual=mlp_residual,
        positional_features=("learned",),
        n_ctx=7,
        readout="per_position",
        dtype="float64",
    )
    return ExactTransformer(cfg).init_weights(seed=1)


def _naive(model: ExactTransformer, tokens: torch.Tensor) -> torch.Tensor:
    """Re-implementation: x -> attention (softmax, no mask) -> [LN] -> FFN -> readout."""
    b = model.blocks[0]
    a, mlp = b.attn, b.mlp
    x = model.embed.W_E[tokens] + model.pos_embed.W_pos[: tokens.shape[1]]
    q, k, v = x @ a.W_Q[0] + a.b_Q[0], x @ a.W_K[0] + a.b_K[0], x @ a.W_V[0] + a.b_V[0]
    w = torch.softmax(q @ k.transpose(-1, -2) / model.cfg.d_head**0.5, -1)
    mid = x + (w @ v) @ a.W_O[0] + a.b_O
    if model.cfg.normalization == "post":
        mid = F.layer_norm(mid, (6,), b.ln1.w, b.ln1.b, eps=model.cfg.ln_eps)
    if model.cfg.normalization == "pre":
        raise AssertionError("not used here")
    out = F.relu(mid @ mlp.W_in + mlp.b_in) @ mlp.W_out + mlp.b_out
    return out @ model.unembed.W_U + model.unembed.b_U


@pytest.mark.parametrize("normalization", ["none", "post"])
def test_ffn_output_is_the_stream(normalization: str) -> None:
    model = _model(normalization, mlp_residual=False)
    tokens = torch.randint(0, 4, (3, 7), generator=torch.Generator().manual_seed(0))
    assert torch.allclose(model(tokens), _naive(model, tokens), atol=1e-12)
    assert not hasattr(model.blocks[0], "ln2")  # no Add & Norm after an FFN without skip
    _, cache = model.run_with_cache(tokens)
    assert torch.equal(cache["blocks.0.hook_resid_post"], cache["blocks.0.hook_mlp_out"])
    with_skip = _model(normalization, mlp_residual=True)
    assert not torch.allclose(with_skip(tokens), model(tokens))


def test_pre_ln_keeps_ln2_before_the_ffn() -> None:
    model = _model("pre", mlp_residual=False)
    assert hasattr(model.blocks[0], "ln2")
    tokens = torch.randint(0, 4, (2, 5), generator=torch.Generator().manual_seed(1))
    _, cache = model.run_with_cache(tokens)
    assert torch.equal(cache["blocks.0.hook_resid_post"], cache["blocks.0.hook_mlp_out"])


def test_config_checks_save_load_and_export(tmp_path) -> None:
    with pytest.raises(ExactLensError, match="mlp_residual"):
        ExactConfig(d_model=4, n_layers=1, d_vocab=2, mlp_residual="no")
    model = _model("post", mlp_residual=False)
    loaded = ExactTransformer.load(model.save(tmp_path / "m"))
    assert loaded.cfg.mlp_residual is False
    tokens = torch.randint(0, 4, (2, 7), generator=torch.Generator().manual_seed(2))
    assert torch.equal(loaded(tokens), model(tokens))
    from exactlens.model.export import export_problems

    problems = export_problems(_model("none", mlp_residual=False), "bridge", length=7)
    assert any("mlp_residual=False" in p for p in problems)
    assert not any("mlp_residual" in p for p in export_problems(_model("none", True), "bridge", length=7))

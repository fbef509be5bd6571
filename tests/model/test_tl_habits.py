"""TransformerLens habits on exactlens models: to_tokens on words of different lengths, the full residual
decomposition (accumulated_bias), attributions of post-LN models, and what an export's length counts."""

from __future__ import annotations

import warnings

import pytest
import torch

import exactlens as el
from exactlens.errors import ExactLensError
from exactlens.model.export import transformer_lens_major


def test_to_tokens_refuses_words_of_different_lengths() -> None:
    model = el.build("dyck1")
    with pytest.raises(ExactLensError, match="different lengths.*to_tokens_and_positions"):
        model.to_tokens(["()", "(())()"])
    tokens, n_positions = model.to_tokens_and_positions(["()", "(())()"])
    decided = el.tasks.reader(model).decide(model.readout(tokens, n_positions), n_positions)
    assert decided.tolist() == [True, True]  # padding masked: both words are balanced


def test_full_resid_decomposition_sums_to_the_stream() -> None:
    model = el.build("first", dtype="float64")
    _, cache = model.run_with_cache(model.to_tokens(["0110", "1011"]))
    parts = cache.get_full_resid_decomposition(layer=model.cfg.n_layers, expand_neurons=False)
    stream = cache[f"blocks.{model.cfg.n_layers - 1}.hook_resid_post"]
    assert torch.allclose(parts.sum(0), stream, atol=1e-9)
    with pytest.raises(ExactLensError, match="accumulated_bias: layer"):
        model.accumulated_bias(model.cfg.n_layers + 1)


def test_post_ln_attributions_warn_once() -> None:
    model = el.build("first-ln", dtype="float64")
    assert "post" in model.cfg.per_layer("normalization")
    _, cache = model.run_with_cache(model.to_tokens(["0110"]))
    stack, _ = cache.decompose_resid(return_labels=True)
    with pytest.warns(UserWarning, match="post-LN.*not additive"):
        cache.logit_attrs(stack, tokens=torch.tensor([0]))
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # once per model
        cache.logit_attrs(stack, tokens=torch.tensor([0]))


@pytest.mark.export
def test_export_positions_and_symbols() -> None:
    model = el.build("parity", dtype="float64")  # positional features of (i, n): one table per length
    export = model.to_bridge if transformer_lens_major() >= 4 else model.to_hooked_transformer
    by_symbols = export(symbols=4)
    by_positions = export(positions=5)
    tokens = model.to_tokens(["0110", "1011"])
    assert tokens.shape[1] == 5
    assert torch.allclose(by_symbols(tokens), by_positions(tokens))
    with pytest.raises(ExactLensError, match="for 5 positions.*got 4"):
        by_symbols(model.to_tokens(["011"]))
    with pytest.raises(ExactLensError, match="one of positions"):
        export(positions=5, symbols=4)

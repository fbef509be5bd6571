"""The MAJORITY preset's counted training loss (exactlens.papers.brody.counted) against the training
loop's default path: the same losses, gradients and right-word counts from token counts, for every
layer norm variant, padded batches, a second layer, and the underflow fallback; the same training
trajectory through the loop."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from exactlens.errors import ExactLensError
from exactlens.model import ExactConfig, ExactTransformer
from exactlens.model.stacked import training_runs
from exactlens.papers.brody import counted
from exactlens.papers.brody.counted import check_countable, counted_logits, counted_losses, token_counts
from exactlens.papers.brody.majority_training import paper_variant
from exactlens.plugins import load_plugins
from exactlens.train.data import sample_batch
from exactlens.train.loop import new_model, run_losses, seed_generators, stack_batches
from exactlens.train.presets import get_preset

load_plugins()


def _runs_and_batch(layer_norm: str, dtype: str, lengths: tuple[int, int] = (50, 50), seeds=(0, 1, 2), sharp=3.0):
    spec = get_preset("majority-per-position").spec(dict(layer_norm=layer_norm, dtype=dtype))
    models = []
    for seed in seeds:
        model = new_model(spec, seed_generators(seed)["init"])
        with torch.no_grad():  # sharper attention than at initialisation: the weights are far from uniform
            model.blocks[0].attn.W_Q.mul_(sharp)
            model.blocks[0].attn.W_K.mul_(sharp)
        models.append(model)
    parts = [sample_batch(spec.task, 64, lengths, seed_generators(seed)["train"]) for seed in seeds]
    return spec, training_runs(models), stack_batches(parts)


def _grads(loss: torch.Tensor, params: list[torch.Tensor]) -> list[torch.Tensor]:
    grads = torch.autograd.grad(loss.sum(), params, allow_unused=True)
    return [torch.zeros_like(p) if g is None else g for p, g in zip(params, grads, strict=True)]


@pytest.mark.parametrize("layer_norm", ["full", "scale_only", "none"])
@pytest.mark.parametrize(("dtype", "tol"), [("float64", 1e-12), ("float32", 2e-5)])
@pytest.mark.parametrize("lengths", [(50, 50), (6, 50)])
def test_counted_loss_equals_the_per_position_loss(layer_norm, dtype, tol, lengths):
    spec, runs, (tokens, n_positions, targets) = _runs_and_batch(layer_norm, dtype, lengths)
    assert runs.readout(tokens, n_positions).shape[:2] == tokens.shape[:2]
    want, want_right = run_losses(spec.task, runs.readout(tokens, n_positions), targets, n_positions)
    want_grads = _grads(want, runs.trainable)
    got, got_right = counted_losses(spec, runs.params, tokens, n_positions, targets)
    got_grads = _grads(got, runs.trainable)
    assert torch.allclose(got, want, rtol=tol, atol=0)
    assert got_right.tolist() == want_right.tolist()
    scale = max(float(g.abs().max()) for g in want_grads if g.numel())
    for name, g_want, g_got in zip(spec_names(runs), want_grads, got_grads, strict=True):
        assert torch.allclose(g_got, g_want, rtol=0, atol=tol * scale), name


def spec_names(runs) -> list[str]:
    return [name for name, p in runs.params.items() if p.requires_grad]


@pytest.mark.parametrize(("normalization", "ln_final"), [("pre", False), ("pre", True), ("post", None)])
def test_counted_logits_match_the_model_at_every_position_and_a_second_layer(normalization, ln_final):
    """Two layers (keys then differ per word: the per-word softmax path), a final LN, post-LN,
    against the model's forward."""
    spec = get_preset("majority-per-position").spec(dict(dtype="float64"))
    config = ExactConfig.from_dict({**spec.config.to_dict(), "n_layers": 2, "normalization": normalization,
                                    "ln_final": ln_final})
    model = ExactTransformer(config)
    model.init_weights(generator=torch.Generator().manual_seed(3))
    words = sample_batch(spec.task, 40, (6, 30), torch.Generator().manual_seed(4))
    per_position = model(words.tokens, n_positions=words.n_positions)  # [B, pos, classes]
    params = {name: p.detach()[None] for name, p in model.named_parameters()}
    counts = token_counts(words.tokens[None], words.n_positions[None], config.d_vocab)
    by_token = counted_logits(params, config, counts)[0]  # [B, V, classes]
    for b in range(len(words)):
        n = int(words.n_positions[b])
        expected = per_position[b, :n]
        got = by_token[b, words.tokens[b, :n]]
        assert torch.allclose(got, expected, rtol=0, atol=1e-12)


def test_underflowing_shared_form_falls_back_to_the_per_word_softmax(monkeypatch):
    """A key that scores 2000 above the others but is absent from every word: exp(S - max S) of the
    present keys underflows to 0 in the shared form; the fallback gives the right (finite) loss."""
    spec, runs, (tokens, n_positions, targets) = _runs_and_batch("none", "float64", seeds=(0,), sharp=1.0)
    tokens = tokens % 10  # words over classes 0..9 only (targets recomputed below)
    targets = spec.task.targets(tokens[0])[None]
    with torch.no_grad():
        params = runs.params
        params["embed.W_E"][0, 19] = 0.0
        params["embed.W_E"][0, 19, 0] = 50.0  # token 19's key: k = W_K^T e, its score with every query huge
        params["blocks.0.attn.W_Q"][0].zero_()
        params["blocks.0.attn.b_Q"][0].fill_(40.0)
        params["blocks.0.attn.W_K"][0].zero_()
        params["blocks.0.attn.W_K"][0, 0, 0, :] = 1.0
    want, _ = run_losses(spec.task, runs.readout(tokens, n_positions), targets, n_positions)
    shared = []
    original = counted._shared_key_attention
    monkeypatch.setattr(counted, "_shared_key_attention", lambda *args: shared.append(original(*args)) or shared[-1])
    got, _ = counted_losses(spec, runs.params, tokens, n_positions, targets)
    assert shared == [None]  # the shared form refused: the loss below is the fallback's
    assert torch.isfinite(got).all()
    assert torch.allclose(got, want, rtol=1e-12, atol=0)


def test_training_through_the_loop_is_the_same_with_and_without_counts():
    settings = dict(steps=12, batch=200, lr=1e-2, lr_schedule="constant", runs=2, eval_every=6, test_strings=100)
    counted = paper_variant("full", settings)
    direct = paper_variant("full", dict(settings, counted_loss=False))
    a = np.array([r["train_loss_nats"] for r in counted["per_run"]])
    b = np.array([r["train_loss_nats"] for r in direct["per_run"]])
    assert a.shape == (2, 12)
    assert np.abs(a - b).max() < 1e-5  # float32 rounding only
    assert a[:, -1].max() < a[:, 0].min()  # it trains
    assert counted["test_accuracy"]["mean"] == pytest.approx(direct["test_accuracy"]["mean"], abs=1e-3)


def test_counted_loss_refuses_what_it_cannot_compute():
    preset = get_preset("majority-per-position")
    with pytest.raises(ExactLensError, match="counted_loss must be True or False"):
        preset.spec(dict(counted_loss="yes"))
    positional = ExactConfig.from_dict({**preset.spec({}).config.to_dict(), "positional_features": ["i/n"]})
    with pytest.raises(ExactLensError, match="position-free, unmasked softmax model"):
        check_countable(positional)
    spec = preset.spec(dict(counted_loss=False))
    assert counted_losses(spec, {}, torch.zeros(1, 1, 1), torch.ones(1, 1), torch.zeros(1, 1, 1)) is None

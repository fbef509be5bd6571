"""The training loop's fast paths (issue 44): each computes what the plain path does."""

from __future__ import annotations

import pytest
import torch

from exactlens.errors import ExactLensError
from exactlens.model.positional import evaluate_features
from exactlens.model.stacked import FlatLeaves, StackedRuns, check_drawn, flat_or_not
from exactlens.train.data import sample_batch
from exactlens.train.loop import new_model, seed_generators
from exactlens.train.presets import get_preset


def _model(name="first", **options):
    spec = get_preset(name).spec(dict(train_length=6, epochs=2, **options))
    gens = seed_generators(0)
    return spec, new_model(spec, gens["init"]), gens


def test_flat_leaves_share_one_buffer_and_give_it_back():
    _, model, _ = _model()
    params = [p for p in model.parameters() if p.requires_grad]
    before = [p.detach().clone() for p in params]
    flat = FlatLeaves(params)
    assert all(p.untyped_storage().data_ptr() == flat.flat.untyped_storage().data_ptr() for p in params)
    assert all(torch.equal(p, b) for p, b in zip(params, before, strict=True))
    params[0].grad.add_(1.0)  # a leaf's gradient is a view of the flat one
    assert float(flat.flat.grad[: params[0].numel()].sum()) == params[0].numel()
    with torch.no_grad():
        flat.flat.add_(0.5)  # the optimizer's update reaches every leaf
    assert all(torch.equal(p, b + 0.5) for p, b in zip(params, before, strict=True))
    flat.zero_grad()
    assert all(float(p.grad.abs().sum()) == 0 for p in params)
    params[1].grad.add_(2.0)
    flat.release()
    assert all(p.untyped_storage().data_ptr() != flat.flat.untyped_storage().data_ptr() for p in params)
    assert torch.equal(params[0], before[0] + 0.5) and float(params[1].grad.min()) == 2.0
    assert flat_or_not(params[:1]) is None and flat_or_not([params[0], params[1].double()]) is None


def test_checks_of_drawn_words_run_once_per_shape():
    spec, model, gens = _model()
    batch = sample_batch(spec.task, 8, (6, 6), gens["train"])
    seen: set = set()
    bad = batch.tokens.clone()
    bad[0, 1] = model.cfg.d_vocab  # out of the vocabulary
    with pytest.raises(ExactLensError, match="token ids must lie in"):
        check_drawn(model, bad, batch.n_positions, seen)
    assert not check_drawn(model, batch.tokens, batch.n_positions, seen)  # checked, then remembered
    assert seen == {((8, batch.tokens.shape[1]), False)}
    short = batch.n_positions.clone()
    short[0] -= 1
    assert check_drawn(model, batch.tokens, short, seen) and len(seen) == 2


def test_positional_features_cached_per_length_equal_the_formula_and_never_hold_a_mapped_tensor():
    spec, model, gens = _model("parity")
    pos = model.pos_embed
    for n_pos in (4, 9, 4):
        expected = evaluate_features(model.cfg.positional_features, n_pos, torch.tensor([n_pos]), pos.W_feat.dtype)
        assert torch.equal(pos._unpadded_features(n_pos), expected)
    assert len(pos._features) == 2
    runs = StackedRuns([model, new_model(spec, seed_generators(1)["init"])])
    batch = sample_batch(spec.task, 5, (7, 7), gens["train"])
    runs.readout(batch.tokens.expand(2, -1, -1), batch.n_positions.expand(2, -1))
    assert not any(torch._C._functorch.is_batchedtensor(t) for t in pos._features.values())


@pytest.mark.parametrize("name", ["first", "parity"])
def test_fused_products_and_a_fixed_readout_row_equal_the_einsums(name):
    spec, model, gens = _model(name)
    batch = sample_batch(spec.task, 16, (6, 6), gens["train"])
    model.set_fused(False)
    plain = model.readout(batch.tokens, batch.n_positions)
    model.set_fused(True)
    fused = model.readout(batch.tokens, batch.n_positions, readout_only=True)  # a slice at the readout row
    torch.testing.assert_close(fused, plain, rtol=1e-5, atol=1e-5)

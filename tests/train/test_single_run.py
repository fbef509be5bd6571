"""One run trains through SingleRun (the model called directly, no torch.func.functional_call) and
gets exactly what StackedRuns([model]) gives: the same losses and weights, bit for bit, here for
every kind of option the loop has (Adam in one or many steps per epoch, clipping, a schedule,
float64, LBFGS with gradient masks and a penalty, Adam with masks)."""

from __future__ import annotations

import pytest
import torch

from exactlens.errors import ExactLensError
from exactlens.model import StackedRuns
from exactlens.model.stacked import SingleRun, training_runs
from exactlens.train import loop, train
from exactlens.train.data import sample_batch
from exactlens.train.loop import new_model, seed_generators, stack_batches

SMALL = dict(strings_per_epoch=40, test_strings=20, eval_every=3)

CASES = {
    "first, one step per epoch": ("first", dict(epochs=6, train_length=6)),
    "first, variable lengths, 4 steps, clipping": ("first", dict(epochs=4, train_length=[1, 8], batch_size=10,
                                                                  grad_clip=0.05)),
    "parity float64, linear schedule": ("parity", dict(epochs=5, train_length=5, dtype="float64",
                                                       lr_schedule="linear")),
    "majority-per-position": ("majority-per-position", dict(epochs=4, train_length=9, batch_size=40)),
    "pairs, LBFGS, masks and penalty": ("pairs", dict(epochs=3, system="combined", flavour="solution2", lean=0.1,
                                                      strings_per_epoch=64, test_strings=16)),
    "pairs, Adam, masks, clipping": ("pairs", dict(epochs=3, optimizer="adam", lr=1e-2, grad_clip=0.5,
                                                   strings_per_epoch=64, test_strings=16)),
}


def trained(preset: str, options: dict, runner, monkeypatch) -> tuple[loop.TrainRun, list[type]]:
    used: list[type] = []

    def spy(models):
        runs = runner(models)
        used.append(type(runs))
        return runs

    with monkeypatch.context() as m:
        m.setattr(loop, "training_runs", spy)
        return train(preset, seed=3, **{**SMALL, **options}), used


@pytest.mark.parametrize("case", CASES)
def test_single_run_equals_stacked_runs(case, monkeypatch):
    preset, options = CASES[case]
    fast, used_fast = trained(preset, options, training_runs, monkeypatch)
    stacked, used_stacked = trained(preset, options, lambda models: StackedRuns(models), monkeypatch)
    assert used_fast == [SingleRun] and used_stacked == [StackedRuns]
    assert len(fast.history) == len(stacked.history)
    for a, b in zip(fast.history, stacked.history, strict=True):
        a, b = dict(a, wall_s=None), dict(b, wall_s=None)
        assert a == b, f"{case}: history records differ at epoch {a['epoch']}"
    for (name, p), q in zip(fast.model.named_parameters(), stacked.model.parameters(), strict=True):
        assert torch.equal(p, q), f"{case}: {name} differs by {float((p - q).abs().max()):.3e}"
        assert p.requires_grad == q.requires_grad, f"{case}: {name}: the model's flags are restored"
    assert fast.info["n_parameters"] == stacked.info["n_parameters"]
    start = new_model(loop.get_preset(preset).spec({**SMALL, **options}), seed_generators(3)["init"])
    assert any(not torch.equal(p, q) for p, q in zip(start.parameters(), fast.model.parameters(), strict=True)), \
        "training changed nothing: the comparison would be vacuous"


def _model_and_batch(dtype: str = "float64"):
    spec = loop.get_preset("first").spec(dict(dtype=dtype, train_length=[2, 7], strings_per_epoch=12))
    gens = seed_generators(1)
    model = new_model(spec, gens["init"]).set_fused(False)
    batch = sample_batch(spec.task, 12, (2, 7), gens["train"])
    return model, stack_batches([batch])


def test_single_run_is_the_model_with_a_run_axis():
    model, (tokens, n_positions, _) = _model_and_batch()
    runs = SingleRun(model)
    assert len(runs) == 1 and runs.models == [model]
    own = dict(model.named_parameters())
    assert list(runs.params) == list(own)
    for name, view in runs.params.items():
        assert view.shape == (1, *own[name].shape) and view.data_ptr() == own[name].data_ptr(), name
    assert runs.trainable == [p for p in model.parameters() if p.requires_grad]
    out = runs.readout(tokens, n_positions)
    want = model.readout(tokens[0], n_positions[0], readout_only=True)
    assert out.shape == (1, *want.shape) and torch.equal(out[0], want)
    # gradients: the model's own, seen through grad(name) with the run axis; the same as StackedRuns'
    out.square().sum().backward()
    stacked = StackedRuns([model])
    stacked.readout(tokens, n_positions).square().sum().backward()
    for name in own:
        got, ref = runs.grad(name), stacked.grad(name)
        assert (got is None) == (ref is None), name
        if got is not None:
            assert got.shape == ref.shape and torch.equal(got, ref), name
    with pytest.raises(ExactLensError, match="stacked input"):
        runs.readout(tokens[0], n_positions[0])
    with pytest.raises(ExactLensError, match="token ids"):
        runs.readout(tokens + 10, n_positions)


def test_freeze_until_close():
    model, _ = _model_and_batch()
    runs = SingleRun(model)
    runs.freeze("embed.W_E")
    assert not model.embed.W_E.requires_grad and all(p is not model.embed.W_E for p in runs.trainable)
    runs.close()
    assert model.embed.W_E.requires_grad, "close gives the model its flags back"
    assert isinstance(training_runs([model]), SingleRun)
    assert isinstance(training_runs([model, _model_and_batch()[0]]), StackedRuns)

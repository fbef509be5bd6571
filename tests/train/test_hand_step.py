"""The training step with no autograd at all (train/loop.py ``by_hand``): a membership task's loss gradient in
closed form (exactlens.tasks.kinds.mean_loss_gradient) fed to the hand-written readout's backward
(exactlens.model.fastpath.HandReadout). It must be the autograd step's arithmetic exactly: the same gradient bit
for bit, so the same weights and history; and it must be taken only where it applies."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from exactlens import tasks
from exactlens.model.stacked import SingleRun
from exactlens.tasks import kinds
from exactlens.train import train, train_many


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("batch", [1, 7, 100, 1000])
def test_the_closed_form_gradient_is_autogrades_bit_for_bit(batch, dtype):
    task = tasks.get("first")
    for seed, spread in enumerate((0.01, 1.0, 30.0, 200.0)):  # 200: sigmoid saturates to exactly 0 or 1
        gen = torch.Generator().manual_seed(seed)
        z = (torch.randn(batch, generator=gen, dtype=dtype) * spread).requires_grad_()
        y = torch.rand(batch, generator=gen) < 0.5
        n = torch.full((batch,), 5)
        per_word = kinds.loss(task, z, y, n)
        per_word.view(1, batch).mean(1).sum().backward()  # what the loop differentiates for one run
        got = kinds.mean_loss_gradient(task, z.detach(), y)
        assert got is not None and torch.equal(got, z.grad), (batch, spread)
        assert torch.equal(per_word, F.binary_cross_entropy_with_logits(z, y.to(dtype), reduction="none"))


def test_no_closed_form_for_the_other_kinds_and_shapes():
    assert kinds.mean_loss_gradient(tasks.get("first"), torch.zeros(4, 2), torch.zeros(4)) is None  # two logits
    for name in ("majority", "majority-margin", "induction-recent", "pairs"):
        task = tasks.get(name)
        assert task.kind != "membership"
        assert kinds.mean_loss_gradient(task, torch.zeros(4), torch.zeros(4)) is None


def _steps_by_hand(monkeypatch) -> list[bool]:
    """Patch SingleRun.by_hand to record, per call, whether it gave the hand-written step."""
    taken: list[bool] = []
    original = SingleRun.by_hand

    def spy(self, tokens, n_positions):
        hand = original(self, tokens, n_positions)
        taken.append(hand is not None)
        return hand

    monkeypatch.setattr(SingleRun, "by_hand", spy)
    return taken


CASES = {
    "first, one step per epoch": ("first", dict(epochs=8, train_length=9)),
    "first, 4 steps per epoch, clipping, warm-up schedule": (
        "first", dict(epochs=5, train_length=7, strings_per_epoch=40, batch_size=10, grad_clip=0.05,
                      lr_schedule="warmup_linear", warmup_steps=3)),
    "parity": ("parity", dict(epochs=6, train_length=6)),
}


@pytest.mark.parametrize("case", CASES)
def test_the_hand_step_trains_what_autograd_trains(case, monkeypatch):
    preset, options = CASES[case]
    options = dict(options, test_strings=20, eval_every=2)
    taken = _steps_by_hand(monkeypatch)
    hand = train(preset, seed=4, **options)
    steps = hand.history[-1]["step"]
    assert taken == [True] * steps, "every step of a float32 membership run takes the hand-written step"
    monkeypatch.setattr(SingleRun, "by_hand", lambda self, tokens, n_positions: None)
    auto = train(preset, seed=4, **options)
    for a, b in zip(hand.history, auto.history, strict=True):
        assert dict(a, wall_s=None) == dict(b, wall_s=None), f"{case}: epoch {a['epoch']}"
    for (name, p), q in zip(hand.model.named_parameters(), auto.model.parameters(), strict=True):
        assert torch.equal(p, q), f"{case}: {name} differs by {float((p - q).abs().max()):.3e}"
    assert hand.history[0]["train_loss_bits"] != hand.history[-1]["train_loss_bits"], "training moved nothing"


def test_the_hand_step_is_not_taken_where_it_does_not_apply(monkeypatch):
    taken = _steps_by_hand(monkeypatch)
    small = dict(epochs=2, strings_per_epoch=20, test_strings=10)
    train("first", seed=0, dtype="float64", train_length=6, **small)  # float64: no hand-written readout
    assert taken and not any(taken)
    taken.clear()
    train("first", seed=0, train_length=[2, 6], **small)  # padded words
    assert taken and not any(taken)
    taken.clear()
    train("majority", seed=0, **small)  # classification: no closed form here
    train_many("first", seeds=[0, 1], train_length=6, **small)  # stacked runs
    assert taken == []


def test_outputs_with_no_closed_form_fall_back_once_and_train_the_same(monkeypatch):
    """A readout whose loss gradient has no closed form (e.g. two class logits for a membership task): the step
    runs autograd, and the loop stops asking for the hand-written readout after the first step."""
    options = dict(epochs=4, train_length=6, strings_per_epoch=20, test_strings=10)
    auto_weights = None
    with monkeypatch.context() as m:
        m.setattr(SingleRun, "by_hand", lambda self, tokens, n_positions: None)
        auto_weights = list(train("first", seed=2, **options).model.parameters())
    taken = _steps_by_hand(monkeypatch)
    monkeypatch.setattr(kinds, "mean_loss_gradient", lambda *a: None)
    run = train("first", seed=2, **options)
    assert taken == [True], "asked once, then never again"
    for p, q in zip(run.model.parameters(), auto_weights, strict=True):
        assert torch.equal(p, q)

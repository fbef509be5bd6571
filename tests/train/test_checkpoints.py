"""Checkpoints during training (exactlens.train.checkpoints): the schedules, what is kept, that keeping them
changes nothing of the run, and the errors."""

from __future__ import annotations

import json

import pytest
import torch

from exactlens.errors import ExactLensError
from exactlens.train import train, train_many
from exactlens.train.checkpoints import Schedule, checkpoint_steps, read_checkpoints

FAST = dict(epochs=4, strings_per_epoch=40, test_strings=20, dtype="float64")


def _without_time(history: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if k != "wall_s"} for r in history]


@pytest.mark.parametrize("every, schedule, total, expected", [
    (3, None, 10, [0, 3, 6, 9, 10]),
    (None, "every:5", 10, [0, 5, 10]),
    (None, "log:4", 100, [0, 1, 10, 100]),
    (None, "log:2", 7, [0, 7]),
    (None, "3,1", 5, [0, 1, 3, 5]),
    (None, None, 5, []),
])
def test_schedules(every, schedule, total, expected) -> None:
    assert checkpoint_steps(every, schedule, total) == expected


def test_log_schedule_is_log_spaced() -> None:
    steps = checkpoint_steps(None, "log:11", 10**5)
    assert steps[:2] == [0, 1] and steps[-1] == 10**5 and len(steps) == 11
    # 10 points over [1, 10^5]: each step 10^(5/9) times the one before, up to rounding to whole steps
    ratios = [b / a for a, b in zip(steps[1:], steps[2:], strict=False) if a >= 30]
    assert len(ratios) >= 6 and all(abs(r / 10 ** (5 / 9) - 1) < 0.02 for r in ratios), steps


@pytest.mark.parametrize("bad", ["log:1", "every:0", "sometimes:3", "1,x", "", "-1", True, 3.5, []])
def test_bad_schedules_are_refused(bad) -> None:
    with pytest.raises(ExactLensError, match="checkpoints takes"):
        Schedule().check("checkpoints", bad)


def test_both_ways_at_once_and_late_steps_are_refused() -> None:
    with pytest.raises(ExactLensError, match="give one"):
        checkpoint_steps(2, "log:3", 10)
    with pytest.raises(ExactLensError, match="after the run's last step 10"):
        checkpoint_steps(None, "0,11", 10)


def test_checkpoints_change_nothing_of_the_run_and_hold_its_weights(tmp_path) -> None:
    kept = train("first", out=tmp_path / "run", checkpoint_every=2, **FAST)
    plain = train("first", **FAST)
    assert _without_time(kept.history) == _without_time(plain.history)
    for (name, a), b in zip(kept.model.state_dict().items(), plain.model.state_dict().values(), strict=True):
        assert torch.equal(a, b), name
    assert [c.step for c in kept.checkpoints] == [0, 2, 4]
    last = read_checkpoints(tmp_path / "run")[-1].model()
    for name, value in kept.model.state_dict().items():
        assert torch.equal(last.state_dict()[name], value), name
    first = read_checkpoints(tmp_path / "run")[0]
    assert first.metrics["train_loss_bits"] is None and first.metrics["strings_seen"] == 0
    untrained = train("first", **{**FAST, "epochs": 1, "lr": 1e-12}).model  # the same initialization
    assert torch.allclose(first.model().W_E, untrained.W_E, atol=1e-9)
    info = json.loads((tmp_path / "run" / "run.json").read_text())
    assert info["checkpoints"]["steps"] == [0, 2, 4] and info["checkpoints"]["bytes_each"] > 0


def test_test_numbers_at_each_checkpoint_are_the_models(tmp_path) -> None:
    """The index's test accuracy is that step's model's, on one fixed set of words: the final checkpoint's
    equals the final model's accuracy on those words (recomputed here)."""
    from exactlens import tasks
    from exactlens.train.data import sample_batch
    from exactlens.train.loop import evaluate, seed_generators

    run = train("first", out=tmp_path / "run", checkpoints="log:3", **FAST)
    words = sample_batch(tasks.get("first"), FAST["test_strings"], run.options["test_length"],
                         seed_generators(0)["checkpoint"], held_out=True)
    for checkpoint in read_checkpoints(tmp_path / "run"):
        assert checkpoint.metrics["test_accuracy"] == evaluate(checkpoint.model(), words)["accuracy"]


def test_seeds_keep_their_own_and_memory_runs_keep_states(tmp_path) -> None:
    runs = train_many("first", [0, 1], out=tmp_path / "many", checkpoint_every=4, **FAST)
    for seed, run in zip((0, 1), runs, strict=True):
        assert [c.path.parent.parent for c in run.checkpoints] == [tmp_path / "many" / f"seed{seed}"] * 2
        assert [c.step for c in read_checkpoints(tmp_path / "many" / f"seed{seed}")] == [0, 4]
    with pytest.raises(ExactLensError, match="give one of seed0, seed1"):
        read_checkpoints(tmp_path / "many")
    in_memory = train("first", checkpoint_every=4, **FAST)
    assert all(c.path is None for c in in_memory.checkpoints)
    assert torch.equal(in_memory.checkpoints[-1].model().W_U, in_memory.model.W_U.cpu())


def test_bad_uses_are_refused(tmp_path) -> None:
    with pytest.raises(ExactLensError, match="no checkpoints; train with --checkpoint-every"):
        read_checkpoints(train("first", out=tmp_path / "plain", **FAST).checkpoint)
    with pytest.raises(ExactLensError, match="lbfgs"):
        train("first", out=tmp_path / "l", optimizer="lbfgs", checkpoint_every=1, **FAST)
    assert not (tmp_path / "l").exists()
    (tmp_path / "broken" / "checkpoints").mkdir(parents=True)
    (tmp_path / "broken" / "checkpoints" / "index.jsonl").write_text("{not json\n")
    with pytest.raises(ExactLensError, match="line 1 is not a checkpoint record"):
        read_checkpoints(tmp_path / "broken")


def test_a_schedule_given_both_as_a_flag_and_as_an_option_is_refused(tmp_path, capsys) -> None:
    """--checkpoints log:3 --option checkpoints='"every:1"' keeps neither silently: one line, nothing written."""
    from exactlens.cli import main

    out = tmp_path / "run"
    assert main(["train", "first", "--out", str(out), "--checkpoints", "log:3", "--option",
                 'checkpoints="every:1"']) == 2
    assert "checkpoints is given twice with two values (--checkpoints 'log:3' and --option checkpoints='every:1')" \
        in capsys.readouterr().err
    assert not out.exists()


def test_huge_schedules_are_refused_by_arithmetic() -> None:
    """The count comes first: every:1 over 10^15 steps or log:10^11 never lists a step."""
    with pytest.raises(ExactLensError, match="at most 10,000"):
        checkpoint_steps(None, "every:1", 10**15)
    with pytest.raises(ExactLensError, match="at most 10000"):
        train("first", checkpoints="log:100000000000", **FAST)

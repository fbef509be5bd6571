"""The alignment's speed-ups pin their behaviour (issue 41, "any program, any size"): each stacked pass starting
at its own sites' layer gives the fits of passes that all start at the earliest layer, and a task variable's values
are computed once per run and words. Their timings are benchmarks/'s, not these tests'."""

from __future__ import annotations

import pytest
import torch

from exactlens import tasks
from exactlens.analysis.diff import diff
from exactlens.analysis.diff.alignment import fit, patch
from exactlens.analysis.diff.alignment.variables import remembered, task_variables
from exactlens.analysis.diff.runs import make_side, run_both
from exactlens.constructions import build

SMALL = dict(parts=("alignment",), das_max_dim=2, das_steps=30, alignment_pairs=16, untrained_baseline=True)
KEY = ("variable", "site", "position", "position_index", "dim", "iia_changed", "changed_pairs", "verdict",
       "random_iia_changed", "untrained_iia_changed", "validation_iia")


def test_layer_passes_split_at_layer_changes_and_size() -> None:
    assert fit.layer_passes([0, 0, 0, 1, 1, 2], 10) == [(0, 3), (3, 5), (5, 6)]
    assert fit.layer_passes([0, 0, 0, 1, 1, 2], 2) == [(0, 2), (2, 3), (3, 5), (5, 6)]
    assert fit.layer_passes([1, 0, 1], 5) == [(0, 1), (1, 2), (2, 3)]  # unsorted: never two layers in one pass
    assert fit.layer_passes([], 4) == []


def test_passes_from_each_sites_layer_give_the_same_alignment(monkeypatch: pytest.MonkeyPatch) -> None:
    """first-ln-eta (3 layers) against itself: the fits run with every pass starting at its sites' own layer (the
    default) and with every pass of a batch starting at the batch's earliest layer (as before: layers 0 and 1
    from layer 0, the last layer's sites apart) give the same rows and verdicts; only the default starts a
    training pass at layer 1 (the copies patched in layer 1 skip layer 0)."""
    starts: list[int] = []
    outputs = patch.Patcher._outputs

    def counted(self, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        if torch.is_grad_enabled():  # a training pass (scores run without gradients)
            starts.append(self.start)
        return outputs(self, *args, **kwargs)

    monkeypatch.setattr(patch.Patcher, "_outputs", counted)
    kwargs = dict(lengths=[3, 4, 5], **SMALL)
    own = diff("first-ln-eta", "first-ln-eta", **kwargs)
    assert {0, 1, 2} <= set(starts), sorted(set(starts))
    starts.clear()
    monkeypatch.setattr(fit, "LAYER_PASSES", False)
    earliest = diff("first-ln-eta", "first-ln-eta", **kwargs)
    assert set(starts) == {0, 2}, sorted(set(starts))
    assert [[r[k] for k in KEY] for r in own["alignment"]] == [[r[k] for k in KEY] for r in earliest["alignment"]]
    assert own["summary"]["verdicts"] == earliest["summary"]["verdicts"]


def test_task_values_are_computed_once_per_run_and_words() -> None:
    """The remembered values equal a fresh computation, for each run and set of words, and the computation runs
    once per (run, words)."""
    model = build("first", dtype="float64")
    task = tasks.of_model(model)
    side = make_side(model, {}, tasks.reader(model), model.cfg.readout_position, True)
    runs = run_both(task, [3, 4], 16, 0, side, side)
    calls: list[int] = []

    def values(run, b):  # noqa: ANN001, ANN202
        calls.append(run.length)
        return run.ids[b].double() * 2

    memo = remembered(values)
    for run in runs:
        for b in (torch.tensor([0, 1, 2]), torch.tensor([2, 1]), torch.tensor([0, 1, 2])):
            assert torch.equal(memo(run, b), values(run, b))
    assert len(calls) == 2 * 2 + 2 * 3  # memo: twice per run (two distinct word sets); direct: three times per run
    variable = task_variables(task)[0]
    b = torch.arange(len(runs[0].ids))
    assert variable.values(runs[0], b) is variable.values(runs[0], b)  # task variables are remembered

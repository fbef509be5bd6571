"""Designed pairs with power (issue 41): more words where effective pairs are scarce, answers decided by
rounding left out (a membership logit at 0, a post-LN of rounding noise), and one criterion of the latter for
the alignment's counterfactuals and the probes' settled sites."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import torch
from test_position_variables import _exact

from exactlens.analysis.diff import diff
from exactlens.analysis.diff.alignment import grow
from exactlens.analysis.diff.alignment.designed import (
    GROWN_POOL_FACTOR,
    changed_units,
    design_pairs,
    pool_summary,
    split_targets,
    untestable_reason,
)
from exactlens.analysis.diff.alignment.variables import TIED, HighLevel, NormWatch, exact_variables, position_variables
from exactlens.analysis.diff.runs import degenerate_rows, pool, recorded_hook, zero_eps_norms

SMALL = dict(parts=("alignment",), das_max_dim=1, das_steps=40, alignment_pairs=16, untrained_baseline=False)


def _rare(task) -> HighLevel:
    """A planted variable whose swap flips the answer only where the source word has one 1 or one 0 (16 of the
    256 words of length 8)."""
    def rare(ids):
        return (ids.sum(1) == 1) | (ids.sum(1) == ids.shape[1] - 1)

    def counterfactual(run, b, s):
        return torch.where(rare(run.ids[s]), ~run.truth[b].bool(), run.truth[b].bool())

    return HighLevel("one 1 or one 0", "task", "word", counterfactual, lambda run, b: run.truth[b].bool(),
                     values=lambda run, b: rare(run.ids[b]).double().reshape(-1, 1, 1).expand(
                         -1, run.tokens.shape[1], 1))


def test_scarce_effective_pairs_draw_more_words_with_the_splits_still_disjoint() -> None:
    """At 64 sampled words of length 8 the planted variable's test split holds fewer effective pairs than asked
    although every pair of its words was searched; it is scarce, the length grows to all 256 words, and the
    search on them keeps the 16 asked, every kept pair effective, test words unseen in the other splits."""
    task, side, runs, _ = _exact("parity", [8])
    rare = _rare(task)
    before = design_pairs(task, runs, [rare], 16, seed=0)
    test = before.pools[2][0]
    assert test.exhaustive and test.kept_units == test.effective_units < 16, test
    pools, reasons = [pool_summary(before, 0)], [untestable_reason(rare, [p[0] for p in before.pools], runs)]
    assert grow.scarce(pools, reasons, 16, True) == [0]
    grown, notes = grow.grow_runs(task, runs, side, side, seed=0)
    distinct = len(torch.unique(runs[0].ids, dim=0))
    assert notes == [{"length": 8, "words": distinct, "grown_to": 256, "every_word": True}]
    assert grown[0].exhaustive and len(grown[0].ids) == 256 and grown[0].trained_outputs is not None
    after = design_pairs(task, grown, [rare], 16, seed=0, pool_factor=GROWN_POOL_FACTOR)
    for split, target in zip(after.splits, split_targets(16), strict=True):
        units = torch.cat([changed_units(task, p.cf[0], p.base_answers[0], p.run.n_positions[p.base]) for p in split])
        assert bool((units > 0).all()) and int(units.sum()) >= target  # nothing ineffective, the target met
    words = [{tuple(p.run.ids[i].tolist()) for p in split for i in (*p.base.tolist(), *p.source.tolist())}
             for split in after.splits]
    assert not words[0] & words[2] and not words[1] & words[2] and not words[0] & words[1]
    # a variable no pair moves is untestable, not scarce: more words of the same law are not drawn for it
    still = HighLevel("never", "task", "word", lambda run, b, s: run.truth[b], lambda run, b: run.truth[b])
    none = design_pairs(task, runs, [still], 16, seed=0)
    reason = untestable_reason(still, [p[0] for p in none.pools], runs)
    assert reason is not None and grow.scarce([pool_summary(none, 0)], [reason], 16, True) == []


def test_a_sampled_growth_keeps_the_run_words_first(monkeypatch) -> None:
    """Where a length has more words than ALL_WORDS, the grown run is its words followed by a new sample."""
    task, side, runs, _ = _exact("parity", [8])
    monkeypatch.setattr(grow, "ALL_WORDS", 0)
    monkeypatch.setattr(grow, "GROW_FACTOR", 2)
    (run,), (note,) = grow.grow_runs(task, runs, side, side, seed=0)
    assert torch.equal(run.ids[:len(runs[0].ids)], runs[0].ids) and not run.exhaustive
    assert note["every_word"] is False and note["grown_to"] > note["words"]
    assert np.array_equal(run.exact_acts["blocks.0.hook_resid_post"][:len(runs[0].ids)],
                          runs[0].exact_acts["blocks.0.hook_resid_post"])
    assert grow.grow_runs(task, [replace(runs[0], exhaustive=True)], side, side, seed=0) is None


def test_the_diff_grows_a_scarce_length_and_decides_the_position_resolved_count() -> None:
    """parity at lengths 8, 10: with 64 sampled words each the test split holds too few words with one 1 for
    k/n@1; the diff draws all 256 and 1024 words (``split.grown``) and its line rests on the changed pairs asked."""
    result = diff("parity", "parity", lengths=[8, 10], **SMALL)
    split = result["alignment_details"]["split"]
    assert [(g["length"], g["grown_to"], g["every_word"]) for g in split["grown"]] == [(8, 256, True), (10, 1024, True)]
    assert "k/n@1" in split["grown_for"]
    line = result["summary"]["verdicts"]["k/n@1"]
    assert line["changed_pairs"] >= 16 and line["verdict"] == "computed", line


def test_a_membership_logit_at_zero_has_no_counterfactual() -> None:
    """parity-ln (no confidence layer): swapping k/n at position 1 from a word with k = 1 to one with another k
    leaves no position with i = k, and the accept logit is s = 0 up to rounding (|logit| ~1e-17); its bit was the
    residue's sign, counted as changed on every such pair. It is TIED now, and no designed pair."""
    task, side, runs, features = _exact("parity-ln", [4, 6])
    assert zero_eps_norms(side)  # its norms have eps = 0, but none normalizes a zero input here
    variables, _ = exact_variables(side, features, runs)
    (resolved,) = position_variables(side, [v for v in variables if v.name == "k/n"], [1.0], 0.99, 1, runs)
    run = runs[1]
    ones = run.ids.sum(1)
    pairs = torch.cartesian_prod(torch.nonzero(ones == 1).flatten(), torch.nonzero(ones != 1).flatten())
    cf = resolved.counterfactual(run, pairs[:, 0], pairs[:, 1])
    assert len(pairs) >= 300 and bool((cf == TIED).all()), torch.unique(cf)
    other = torch.cartesian_prod(torch.nonzero(ones == 2).flatten(), torch.nonzero(ones == 1).flatten())
    moved = resolved.counterfactual(run, other[:, 0], other[:, 1])  # a source with k = 1 sets i = k at 1 too
    assert not bool((moved == TIED).any())
    design = design_pairs(task, runs, [resolved], 16, seed=0)
    for split in design.splits:
        for pset in split:
            assert not bool((pset.run.ids[pset.base].sum(1) == 1).any())  # no base with k = 1 is kept


def test_one_rounding_criterion_for_counterfactuals_and_settled_sites() -> None:
    """NormWatch (a forward's readout rows) and degenerate_rows (every row of the runs) apply the same
    criterion: on parity-ln-eta's words, at every position, they flag the same rows (its confidence layer
    clears the positions other than [CLS]). A planted run whose every norm input is rounding noise is flagged
    everywhere (a threshold relative to the largest scale of the runs flagged none of it)."""
    _, side, runs, _ = _exact("parity-ln-eta", [4, 6])
    last = side.sites[-1]
    flagged = degenerate_rows(runs, side, last)
    rows = pool(runs, side)
    assert 0 < flagged.sum() < len(flagged)
    offset = 0
    for run in runs:
        count = run.tokens.numel()
        mine, position = flagged[offset:offset + count], rows.position[offset:offset + count]
        with NormWatch(side) as watch:
            side.model(run.tokens)
        for p in range(run.tokens.shape[1]):
            undecided = watch.undecided(torch.full((len(run.ids),), p))
            assert torch.equal(undecided, torch.as_tensor(mine[position == p])), (run.length, p)
        offset += count
    noise = dict(runs[0].exact_acts)
    for scale, residual, component in zero_eps_norms(side):
        shape = runs[0].exact_acts[scale].shape
        noise[scale] = np.full(shape, 1e-17)
        noise[recorded_hook(residual)] = np.ones((*shape[:2], side.d_model))
        noise[component] = -np.ones((*shape[:2], side.d_model))
    planted = replace(runs[0], exact_acts=noise)
    assert degenerate_rows([planted], side, last).all()

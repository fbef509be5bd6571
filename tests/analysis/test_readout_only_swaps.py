"""The exact variables' stacked swaps run the exact model's last layer at the readout position only (issue 44,
interventions.READOUT_ONLY): the counterfactual answers, the alignment's rows and its verdicts are those of full
passes, a swap inside the last layer and a norm watched there included; where a readout-only pass would not give a
full pass's outputs (a per-position readout, a site of the attention's inside in the last layer, a model that is
not an ExactTransformer) the passes run in full. Timings are benchmarks/'s, not these tests'."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from exactlens import tasks
from exactlens.analysis.diff import diff, interventions
from exactlens.analysis.diff.alignment.variables import (
    counterfactuals,
    exact_variables,
    position_variables,
    task_variables,
)
from exactlens.analysis.diff.runs import make_side, run_both, zero_eps_norms
from exactlens.constructions import build
from exactlens.model import ExactTransformer

KEY = ("variable", "site", "position", "position_index", "dim", "iia_changed", "changed_pairs", "verdict")


def _side(name: str, lengths: list[int], strings: int = 64):
    model = build(name, dtype="float64")
    task = tasks.of_model(model)
    side = make_side(model, {}, tasks.reader(model), model.cfg.readout_position, True)
    return task, side, run_both(task, lengths, strings, 0, side, side)


def _passes(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Records readout_only of every ExactTransformer forward pass from here on."""
    seen: list[bool] = []
    forward = ExactTransformer.forward

    def spy(self, *args, readout_only: bool = False, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        seen.append(readout_only)
        return forward(self, *args, readout_only=readout_only, **kwargs)

    monkeypatch.setattr(ExactTransformer, "forward", spy)
    return seen


@pytest.mark.parametrize(("name", "lengths"), [("majority", [9, 10]), ("parity-ln-eta", [3, 4, 5]),
                                               ("dyck1", [4, 6]), ("palindrome", [4, 6])])
def test_readout_only_swaps_give_the_full_passes_answers(name: str, lengths: list[int],
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Every exact variable's counterfactual answers (position-resolved ones and the task's variables beside them)
    with the stacked swaps' last layer at the readout row only equal those of full passes (the answers, not the
    raw outputs, which may differ by rounding): MAJORITY
    (one layer: every swap is inside the last layer, after its attention), parity-ln-eta (its zero-eps post norms
    of the last layer watched, NormWatch), Dyck-1 (readout at the last position, -1), palindrome."""
    task, side, runs = _side(name, lengths)
    features = diff(side.model, name, lengths=lengths, parts=("probes",), untrained_baseline=False)
    variables = exact_variables(side, features["probes"]["features"], runs)[0]
    variables += position_variables(side, variables, [0.0] * len(variables), 1.0, 3, runs)
    variables += task_variables(task)
    last = side.n_layers - 1
    sites = {w.site for v in variables if v.swap is not None for run in runs if (w := v.swap(run)) is not None}
    assert len(sites) >= 1 and interventions.readout_only_for(side, sorted(sites)), sites
    if name == "majority":
        assert all(s.startswith(f"blocks.{last}.") and not s.endswith("resid_pre") for s in sites), sites
    if name == "parity-ln-eta":
        assert any(f"blocks.{last}." in hook for hooks in zero_eps_norms(side) for hook in hooks)
    passes = _passes(monkeypatch)
    gen = torch.Generator().manual_seed(0)
    changed = 0
    for run in runs:
        b, s = torch.randint(len(run.ids), (40,), generator=gen), torch.randint(len(run.ids), (40,), generator=gen)
        passes.clear()
        fast = counterfactuals(variables, run, b, s)
        assert True in passes, passes  # the swaps did run readout-only
        monkeypatch.setattr(interventions, "READOUT_ONLY", False)
        passes.clear()
        full = counterfactuals(variables, run, b, s)
        assert True not in passes and passes, passes
        monkeypatch.setattr(interventions, "READOUT_ONLY", True)
        for v, x, y in zip(variables, fast, full, strict=True):
            assert torch.equal(x, y), (name, v.name, run.length)
            changed += int((y != v.base_answer(run, b)).sum()) if v.swap is not None else 0
    assert changed > 0  # the swaps moved answers: the comparison is not of unpatched outputs


def test_readout_only_swaps_give_the_same_alignment(monkeypatch: pytest.MonkeyPatch) -> None:
    """`one` against itself (designed pairs; one layer, so its variables' swaps at hook_attn_out are inside the last
    layer): the alignment's rows and verdicts with READOUT_ONLY on equal those with it off, and the swaps did run
    readout-only."""
    allowed: list[bool] = []
    decide = interventions.readout_only_for

    def seen(side, sites):  # noqa: ANN001, ANN202
        allowed.append(decide(side, sites))
        return allowed[-1]

    monkeypatch.setattr(interventions, "readout_only_for", seen)
    kwargs = dict(lengths=[3, 4, 5], parts=("alignment",), das_max_dim=1, das_steps=20, alignment_pairs=16,
                  untrained_baseline=False)
    fast = diff("one", "one", **kwargs)
    assert True in allowed
    monkeypatch.setattr(interventions, "READOUT_ONLY", False)
    allowed.clear()
    full = diff("one", "one", **kwargs)
    assert allowed and True not in allowed
    assert any(r["verdict"] == "computed" and r["site"] == "blocks.0.hook_attn_out" for r in fast["alignment"])
    assert [[r.get(k) for k in KEY] for r in fast["alignment"]] == [[r.get(k) for k in KEY] for r in full["alignment"]]
    assert fast["summary"]["verdicts"] == full["summary"]["verdicts"]


def test_where_the_last_layer_must_run_in_full(monkeypatch: pytest.MonkeyPatch) -> None:
    """Readout-only is refused where a full pass's outputs would not come back: a per-position readout (every
    position is read), a site of the attention's inside in the last layer (its queries, pattern and mix are one
    row there, or not [batch, pos, d] at all), the switch off, a model that is not an ExactTransformer; allowed for
    the residual stream and component outputs of the last layer, and anything before it."""
    _, side, runs = _side("first-ln-eta", [4], 16)
    last = side.n_layers - 1
    for site in ("hook_resid_pre", "hook_attn_out", "hook_resid_mid", "hook_mlp_out", "hook_resid_post"):
        assert interventions.readout_only_for(side, [f"blocks.{last}.{site}"]), site
    assert interventions.readout_only_for(side, [f"blocks.{last - 1}.attn.hook_pattern", "blocks.0.hook_resid_mid"])
    for site in ("attn.hook_q", "attn.hook_pattern", "attn.hook_z", "attn.hook_result"):
        assert not interventions.readout_only_for(side, [f"blocks.{last}.{site}", f"blocks.{last}.hook_resid_mid"])
    _, per_position, _ = _side("induction-recent", [4], 16)
    assert not interventions.readout_only_for(per_position, ["blocks.0.hook_resid_pre"])

    class Foreign(torch.nn.Module):  # another model (HookedTransformer and the like): its own hooks, no readout-only
        cfg = side.model.cfg

    foreign = make_side(side.model, {}, side.reader, side.readout_position, False)
    foreign.model = Foreign()
    assert not foreign.exact and not interventions.readout_only_for(foreign, ["blocks.0.hook_resid_pre"])
    monkeypatch.setattr(interventions, "READOUT_ONLY", False)
    assert not interventions.readout_only_for(side, ["blocks.0.hook_resid_pre"])


def test_a_last_layer_patch_is_applied_at_the_readout_row(monkeypatch: pytest.MonkeyPatch) -> None:
    """first-ln-eta: a patch of the whole stream at the last layer's resid_mid (every position, the readout
    position, another position) in a readout-only pass gives a full pass's outputs, and a patch of the last layer's
    attention pattern runs a full pass (readout-only is not asked of the model)."""
    _, side, runs = _side("first-ln-eta", [5], 16)
    run, last = runs[0], side.n_layers - 1
    b, s = torch.arange(8), torch.arange(8, 16)
    site = f"blocks.{last}.hook_resid_mid"
    eye = np.eye(side.d_model)
    patches = [(site, eye, run.exact_acts[site][s.numpy()], p) for p in (None, np.array([0]), np.array([3]))]
    passes = _passes(monkeypatch)
    fast = interventions.stacked_patched_outputs(side, run.tokens[b], patches, run.n_positions[b], readout_only=True)
    assert passes == [True]
    full = interventions.stacked_patched_outputs(side, run.tokens[b], patches, run.n_positions[b])
    assert passes == [True, False]
    assert torch.equal(fast, full)
    base = side.outputs(side.model(run.tokens[b]), run.n_positions[b])
    assert not torch.equal(fast[:8], base) and torch.equal(fast[16:], base)  # position 3 reaches no readout here
    pattern = f"blocks.{last}.attn.hook_pattern"
    acts = side.model.run_with_cache(run.tokens[s], names_filter=pattern)[1][pattern].numpy()
    n = acts.shape[-1]
    passes.clear()
    interventions.stacked_patched_outputs(side, run.tokens[b], [(pattern, np.eye(n), acts, None)],
                                          run.n_positions[b], readout_only=True)
    assert passes == [False]

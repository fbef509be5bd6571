"""Counterfactual pairs designed from the exact circuit (issue 41): every variable decided where the exact
circuit has effective pairs, one-hot groups swapped whole, "untestable" with its reason, "in the input",
and the number of changed pairs that would decide a verdict."""

from __future__ import annotations

import math

import pytest
import torch

from exactlens import tasks
from exactlens.analysis.diff import diff
from exactlens.analysis.diff.alignment.designed import (
    changed_units,
    constant_within_length,
    design_pairs,
    token_function,
    untestable_reason,
)
from exactlens.analysis.diff.alignment.variables import HighLevel, group_key, task_variables
from exactlens.analysis.diff.alignment.verdicts import (
    COMPUTED_IIA,
    MIN_CHANGED_PAIRS,
    format_verdict_line,
    pairs_needed,
    row_verdict,
    variable_verdicts,
    wilson,
)
from exactlens.analysis.diff.runs import make_side, run_both
from exactlens.constructions import build
from exactlens.errors import ExactLensError

SMALL = dict(parts=("alignment",), das_max_dim=1, das_steps=40, alignment_pairs=16, untrained_baseline=False)


def _side(name: str, lengths: list[int]):
    model = build(name, dtype="float64")
    task = tasks.of_model(model)
    side = make_side(model, {}, tasks.reader(model), model.cfg.readout_position, True)
    return task, side, run_both(task, lengths, 64, 0, side, side)


def test_designed_pairs_decide_where_random_pairs_are_too_few() -> None:
    """FIRST at 16 pairs: random pairs leave 6 changed test pairs (its variables undecided, "indistinguishable"
    at the readout and too few for their localization); designed pairs hold the 16 asked, each effective, and
    the variables are "computed" at the circuit's site."""
    random = diff("first", "first", lengths=[3, 4, 5, 6], pairs="random", **SMALL)["summary"]["verdicts"]
    designed = diff("first", "first", lengths=[3, 4, 5, 6], **SMALL)["summary"]["verdicts"]
    for name in ("first symbol", "I[w_i=1 & i=1]"):
        assert random[name]["changed_pairs"] < MIN_CHANGED_PAIRS, random[name]
        assert random[name]["verdict"] != "computed" and random[name]["pairs"] == "random"
        line = designed[name]
        assert line["verdict"] == "computed" and line["changed_pairs"] >= 16 and line["iia"] == 1.0, line
        assert line["site"] == "blocks.0.hook_mlp_out", line
        assert line["pairs"] == "designed" and line["pool"] >= line["changed_pairs"]
        assert 0.3 < line["effective_share"] < 0.7, line  # the first symbols differ on about half of the pairs
        assert line["untestable_reason"] is None


def test_design_keeps_only_effective_pairs_and_meets_its_targets() -> None:
    task, side, runs = _side("first", [4, 5, 6, 7])
    variables = task_variables(task)
    design = design_pairs(task, runs, variables, 20, seed=0)
    assert design.notes["word_disjoint"]
    for split, target in zip(design.splits, (60, 20, 20), strict=True):
        units = [changed_units(task, p.cf[0], p.base_answers[0], p.run.n_positions[p.base]) for p in split]
        joined = torch.cat(units)
        assert bool((joined > 0).all())  # nothing ineffective fills the target
        assert int(joined.sum()) >= target
    words = [{tuple(p.run.ids[i].tolist()) for p in split for i in (*p.base.tolist(), *p.source.tolist())}
             for split in design.splits]
    assert not words[0] & words[2] and not words[1] & words[2]  # test words unseen in fitting
    pool = design.pools[2][0]
    assert pool.searched >= pool.effective >= 20 and pool.kept_units >= 20


def test_an_ineffective_pool_is_reported_and_untestable() -> None:
    """A planted variable whose swap never changes the answer: every candidate searched, none effective, no
    pair kept (never filled up), and the reason says how many were searched."""
    task, side, runs = _side("first", [3, 4])
    still = HighLevel("never moves", "task", "word", lambda run, b, s: run.truth[b], lambda run, b: run.truth[b],
                      values=lambda run, b: torch.rand(len(b), run.tokens.shape[1], 1, dtype=torch.float64))
    design = design_pairs(task, runs, [still], 10, seed=0)
    assert not any(design.splits[2]) and not any(design.splits[1])
    pools = [design.pools[k][0] for k in range(3)]
    assert all(p.effective == 0 and p.searched > 0 for p in pools)
    reason = untestable_reason(still, pools, runs)
    assert reason is not None and str(sum(p.searched for p in pools)) in reason


def test_a_variable_constant_within_a_length_is_untestable() -> None:
    """parity's 1/n and Dyck-1's 1/(i+1) take one value on every word of a length: "untestable" with the
    reason, in both pair designs, and never fitted."""
    for design in ("designed", "random"):
        result = diff("parity", "parity", lengths=[3, 4, 5], pairs=design, **SMALL)
        line = result["summary"]["verdicts"]["1/n"]
        assert line["verdict"] == "untestable", line
        assert line["untestable_reason"].startswith("constant within a length"), line
        assert not [r for r in result["alignment"] if r["variable"] == "1/n"]
        assert "untestable (constant within a length" in format_verdict_line("1/n", line)
    dyck = diff("dyck1", "dyck1", lengths=[4, 6], **SMALL)["summary"]["verdicts"]
    assert dyck["1/(i+1)"]["verdict"] == "untestable", dyck["1/(i+1)"]
    task, _, runs = _side("first", [3, 4])
    length = HighLevel("n", "task", "word", lambda run, b, s: run.truth[b], lambda run, b: run.truth[b],
                       values=lambda run, b: torch.full((len(b), run.tokens.shape[1], 1), float(run.length)))
    assert constant_within_length(length, runs)
    assert not constant_within_length(task_variables(task)[0], runs)


def test_a_one_hot_group_is_one_variable_swapped_whole() -> None:
    """induction-recent's next_a, next_b, next_c: swapped alone each leaves a tie (no answer); as the group
    next_* they are one variable with its members listed, whose swap is the answer's (indistinguishable);
    prev_* is computed at the circuit's site."""
    assert group_key("next_a") == ("next", "_") and group_key("hist_2:3") == ("hist_2", ":")
    assert group_key("I[w_i=1 & i=1]") is None and group_key("1/(i+1)") is None
    result = diff("induction-recent", "induction-recent", lengths=[6, 8], **{**SMALL, "das_max_dim": 3})
    lines = result["summary"]["verdicts"]
    described = {v["variable"]: v for v in result["alignment_details"]["variables"]}
    assert described["next_*"]["members"] == ["next_a", "next_b", "next_c"]
    assert not {"next_a", "next_b", "next_c", "prev_a"} & set(lines)
    assert lines["next_*"]["verdict"] == "indistinguishable from the answer" and lines["next_*"]["changed_pairs"] >= 16
    assert lines["prev_*"]["verdict"] == "computed" and lines["prev_*"]["site"] == "blocks.0.hook_attn_out"


def test_in_the_input_and_pairs_needed() -> None:
    row = {"iia_changed": 1.0, "iia_ci": wilson(40, 40), "changed_pairs": 40, "random_iia_changed": 0.1,
           "random_iia_p95": 0.2, "do_nothing_iia": 0.0, "converged": True, "site": "blocks.0.hook_resid_pre"}
    assert row_verdict(row, 0.0, True, 0.99) == "in the input"
    assert row_verdict({**row, "site": "blocks.0.hook_attn_out"}, 0.0, True, 0.99) == "computed"
    later = {**row, "site": "blocks.0.hook_attn_out", "verdict": "computed", "origin": "task", "variable": "v",
             "position": "all", "dim": 1, "validation_iia_changed": 1.0}
    first = {**later, "site": "blocks.0.hook_resid_pre", "verdict": "in the input"}
    sites = ["blocks.0.hook_resid_pre", "blocks.0.hook_attn_out"]
    # a function of the token at its position: the embedding carries it, whatever later sites hold
    line = variable_verdicts([later, first], sites, token_functions=frozenset({("task", "v")}))["v"]
    assert line["verdict"] == "in the input" and line["site"] == "blocks.0.hook_resid_pre"
    # else swapping the input at every position realizes any per-position variable: the later site is the finding
    line = variable_verdicts([later, first], sites)["v"]
    assert line["verdict"] == "computed" and line["site"] == "blocks.0.hook_attn_out"
    assert variable_verdicts([first], sites)["v"]["verdict"] == "in the input"  # nothing else passes
    _, _, runs = _side("dyck1", [4, 6])
    token = HighLevel("open?", "task", "position", None, None,  # type: ignore[arg-type]
                      values=lambda run, b: (run.tokens[b] == run.tokens[0, 1]).double()[..., None])
    depth = HighLevel("depth", "task", "position", None, None,  # type: ignore[arg-type]
                      values=lambda run, b: run.tokens[b].double().cumsum(1)[..., None])
    assert token_function(token, runs) and not token_function(depth, runs)
    # all right on 16: [0.81, 1] straddles 0.9, and 35 all right would decide it
    needed = pairs_needed(1.0, 16)
    assert needed == 35 and wilson(35, 35)[0] > COMPUTED_IIA > wilson(34, 34)[0]
    assert pairs_needed(1.0, 64) is None  # decided
    assert pairs_needed(0.5, 20) is None  # [0.30, 0.70]: below 0.9 already
    assert pairs_needed(0.9, 50) is None  # at the threshold no count decides
    assert pairs_needed(None, 0) is None and pairs_needed(1.0, 0) is None
    assert math.isclose(wilson(35, 35)[0], wilson(35, 35)[0])


def test_bad_pair_design_is_refused() -> None:
    with pytest.raises(ExactLensError, match="pairs"):
        diff("first", "first", lengths=[3], pairs="clever", **SMALL)


def test_stacked_fits_split_in_passes_give_the_same_alignment(monkeypatch: pytest.MonkeyPatch) -> None:
    """A memory budget of one copy per pass (every stacked fit, score and random draw in its own forward
    pass, each pass's loss backpropagated alone) gives the alignment of one pass for all."""
    from exactlens.analysis.diff import interventions
    from exactlens.analysis.diff.alignment import patch

    kwargs = dict(lengths=[3, 4, 5], **SMALL)
    whole = diff("first", "first", **kwargs)
    monkeypatch.setattr(interventions, "PASS_BYTES", 1)
    assert patch.copies_per_pass(_side("first", [3])[1], 32, 6) == 1
    split = diff("first", "first", **kwargs)
    key = ("variable", "site", "position", "dim", "iia_changed", "changed_pairs", "verdict")
    assert [[r[k] for k in key] for r in split["alignment"]] == [[r[k] for k in key] for r in whole["alignment"]]


@pytest.mark.parametrize("name", ["parity-ln-eta", "tracr-dedup", "tracr-hist", "induction-recent"])
def test_stacked_counterfactuals_are_each_variables_own(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The exact variables' swaps run stacked in one forward pass (and split in passes of one copy under a tiny
    memory budget) give each variable's counterfactual answers as its own forward does, ties, leak (tracr-dedup's
    undefined outputs), norms of rounding noise (parity-ln-eta's confidence layer) and position-resolved
    variables included."""
    from exactlens.analysis.diff import interventions
    from exactlens.analysis.diff.alignment.variables import counterfactuals, exact_variables, position_variables

    task, side, runs = _side(name, [3, 4, 5])
    features = diff(side.model, name, lengths=[3, 4, 5], parts=("probes",), untrained_baseline=False)
    variables = exact_variables(side, features["probes"]["features"], runs)[0]
    variables += position_variables(side, variables, [0.0] * len(variables), 1.0, 3, runs)
    variables += task_variables(task)
    assert sum(v.swap is not None for v in variables) >= 2
    gen = torch.Generator().manual_seed(0)
    for run in runs:
        b, s = torch.randint(len(run.ids), (40,), generator=gen), torch.randint(len(run.ids), (40,), generator=gen)
        alone = [v.counterfactual(run, b, s) for v in variables]
        stacked = counterfactuals(variables, run, b, s)
        assert all(torch.equal(x, y) for x, y in zip(alone, stacked, strict=True)), name
        with monkeypatch.context() as tiny:
            tiny.setattr(interventions, "PASS_BYTES", 1)
            split = counterfactuals(variables, run, b, s)
        assert all(torch.equal(x, y) for x, y in zip(alone, split, strict=True)), name


def test_stacked_swaps_keep_to_the_models_memory_check(monkeypatch: pytest.MonkeyPatch) -> None:
    """Under a 64 MiB memory limit each swap alone fits the model's own check of a hooked forward pass (every
    layer's activations counted); the stacked swaps are sized by that check too, so the diff runs where it ran one
    swap at a time (it was refused: "a forward pass on 896 x 10 tokens needs about 80.2 MiB"), and the stacked
    pass keeps no graph for a gradient."""
    from exactlens.analysis.diff.interventions import stacked_patched_outputs

    monkeypatch.setenv("EXACTLENS_MEMORY_LIMIT", "64M")
    result = diff("palindrome-hash", "palindrome-hash", lengths=[4, 6, 8], parts=("alignment",), das_max_dim=1,
                  das_steps=5, alignment_pairs=16, untrained_baseline=False)
    assert result["summary"]["verdicts"]
    task, side, runs = _side("first", [4])
    run = runs[0]
    words = torch.arange(8)
    site = "blocks.0.hook_resid_mid"
    patches = [(site, torch.eye(side.d_model)[:, :1].numpy(), run.exact_acts[site][words.flip(0).numpy()], None)] * 2
    with torch.enable_grad():
        out = stacked_patched_outputs(side, run.tokens[words], patches, run.n_positions[words])
    assert out.shape[0] == 16 and not out.requires_grad


def test_cli_pairs_flag_text_and_errors(capsys: pytest.CaptureFixture[str]) -> None:
    """``--pairs random|designed`` on the command line: the JSON echoes it, the text shows "untestable" with its
    reason; a bad design exits 2, its error line naming what is allowed."""
    import json

    from exactlens.cli import main

    args = ["diff", "parity", "--against", "parity", "--lengths", "3,4", "--parts", "alignment", "--das-steps", "10",
            "--das-max-dim", "1", "--alignment-pairs", "12", "--no-untrained-baseline"]
    assert main([*args, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["settings"]["pairs"] == "designed"
    assert out["summary"]["verdicts"]["1/n"]["verdict"] == "untestable"
    assert main([*args, "--pairs", "random"]) == 0
    text = capsys.readouterr().out
    assert "1/n: untestable (constant within a length" in text
    with pytest.raises(SystemExit) as info:  # argparse's usage, then its one error line
        main([*args, "--pairs", "clever"])
    assert info.value.code == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert "--pairs" in last and "clever" in last and "designed" in last and "random" in last, last


def test_a_position_undefined_in_the_base_word_is_no_unit() -> None:
    """A base word's undefined answer (a compiled program's None) makes its position no unit, whatever the
    counterfactual there: otherwise a swap that only makes an answer defined counts as a change."""
    from types import SimpleNamespace

    from exactlens.analysis.diff.alignment.designed import changed_units
    from exactlens.analysis.diff.alignment.pairs import PairSet
    from exactlens.tasks.base import UNDEFINED

    truth = torch.tensor([[0, UNDEFINED, 1], [2, 1, UNDEFINED]])
    run = SimpleNamespace(truth=truth)
    cf = torch.tensor([[1, 2, 1], [2, 0, 0]])  # differs from the base (word 0) at positions 0 and 1
    values = torch.tensor([[0.5, 0.25, 0.0], [1.0, 0.5, 0.75]])
    pset = PairSet(run, torch.tensor([0, 1]), torch.tensor([1, 0]), [cf.clone(), values.clone()],
                   [truth[[0, 1]], truth[[0, 1]]])
    assert pset.cf[0].tolist() == [[1, UNDEFINED, 1], [2, 0, UNDEFINED]]
    assert math.isnan(float(pset.cf[1][0, 1])) and math.isnan(float(pset.cf[1][1, 2]))
    assert float(pset.cf[1][1, 1]) == 0.5
    task = SimpleNamespace(kind="prediction", n_specials=0, target_mask=tasks.Task.target_mask.__get__(
        SimpleNamespace(first_target=0)))
    # word 0: position 0 changed (1 against 0); position 1 undefined in the base: no unit. Word 1: position 1
    # changed (0 against 1); position 2 undefined in the base: no unit
    assert changed_units(task, pset.cf[0], truth, torch.tensor([3, 3])).tolist() == [1, 1]


def test_an_exact_output_that_is_only_leak_is_no_answer() -> None:
    """A compiled program's undefined output is the zero vector but for its attention's leak: the patched exact
    model's argmax of that leak is no counterfactual answer (TIED), while a decided output is kept."""
    from types import SimpleNamespace

    from exactlens.analysis.diff.alignment.variables import TIED, UNDEFINED_OUTPUT, no_answer_where_tied

    task = SimpleNamespace(kind="prediction", n_specials=1, symbol_offset=1, name="toy")
    exact = SimpleNamespace(reader=SimpleNamespace(task=task, rule=None), exact=True,
                            model=SimpleNamespace(cfg=SimpleNamespace(torch_dtype=torch.float64)))
    outputs = torch.zeros(1, 4, 3, dtype=torch.float64)  # [BOS] + 3 symbol positions
    outputs[0, 1] = torch.tensor([0.0, 1.0, 0.0])  # decided: class 1
    outputs[0, 2] = torch.tensor([2e-5, 1e-6, 0.0])  # undefined, leak favours class 0
    outputs[0, 3] = torch.tensor([0.0, 0.0, 0.5 * UNDEFINED_OUTPUT * 100])  # small but decided (0.05 of the largest)
    decisions = outputs[:, 1:].argmax(-1)
    got = no_answer_where_tied(exact, outputs, decisions)
    assert got.tolist() == [[1, TIED, 2]]
    trained = SimpleNamespace(**{**exact.__dict__, "exact": False})  # a trained model's outputs are decisions
    assert no_answer_where_tied(trained, outputs, decisions).tolist() == [[1, 0, 2]]
    # a batch whose every output is leak: against its own largest output nothing looks undefined; against the
    # unpatched model's outputs on the same words (reference) every one is
    leak = outputs.clone()
    leak[0, 1], leak[0, 3] = torch.tensor([0.0, 3e-6, 0.0]), torch.tensor([1e-6, 0.0, 0.0])
    leak_decisions = leak[:, 1:].argmax(-1)
    assert no_answer_where_tied(exact, leak, leak_decisions).tolist() == [[1, 0, 0]]
    assert no_answer_where_tied(exact, leak, leak_decisions, reference=outputs).tolist() == [[TIED] * 3]
    assert no_answer_where_tied(exact, outputs, decisions, reference=leak).tolist() == [[1, TIED, 2]]

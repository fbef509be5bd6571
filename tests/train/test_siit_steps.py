"""SIIT's IIT step on several variables at once (exactlens.train.siit: assign_variables, iit_masks), and a one-hot
group mapped as one variable (tracr-reverse's output, whose compiled softmax leaks ~1e-6 to the other members)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from exactlens.train.siit import assign_variables, iit_masks


def test_assign_variables_spreads_the_pairs_over_the_drawn_variables():
    rng = np.random.default_rng(0)
    every = assign_variables(rng, 21, 64, 0)
    counts = np.bincount(every.numpy(), minlength=21)
    assert counts.min() >= 3 and counts.max() <= 4 and counts.sum() == 64  # all 21, evenly (64 = 21 * 3 + 1)
    three = assign_variables(rng, 21, 64, 3)
    assert len(set(three.tolist())) == 3 and np.bincount(three.numpy()).max() <= 22
    assert len(set(assign_variables(rng, 21, 64, 1).tolist())) == 1  # the former behaviour: one per step
    few = assign_variables(rng, 21, 5, 0)
    assert len(set(few.tolist())) == 5  # fewer pairs than variables: each pair its own


def test_iit_masks_swap_each_rows_own_variable_at_its_hook():
    variables = [SimpleNamespace(name=n) for n in ("a", "b", "c")]
    mapping = {"a": {"hook": "blocks.0.hook_mlp_out", "positions": "all", "dims": [0, 1]},
               "b": {"hook": "blocks.1.hook_attn_out", "positions": "all", "dims": [2]},
               "c": {"hook": "blocks.0.hook_mlp_out", "positions": "all", "dims": [3]}}
    circuit = SimpleNamespace(variables=variables, mapping=mapping)
    assign = torch.tensor([0, 1, 2, 0, 2])
    masks = iit_masks(circuit, None, assign, torch.full((5,), 3), 3, 6)
    assert set(masks) == {"blocks.0.hook_mlp_out", "blocks.1.hook_attn_out"}
    mlp, attn = masks["blocks.0.hook_mlp_out"], masks["blocks.1.hook_attn_out"]
    assert mlp[0].all(0).tolist() == [True, True, False, False, False, False]  # row 0: a's dims, every position
    assert mlp[2].all(0).tolist() == [False, False, False, True, False, False]  # row 2: c's
    assert not mlp[1].any() and attn[1].all(0).tolist() == [False, False, True, False, False, False]
    assert not attn[[0, 2, 3, 4]].any()


@pytest.fixture(scope="module")
def first_loss():
    from exactlens.train.presets import get_preset
    from exactlens.train.siit import siit_loss_of

    spec = get_preset("first").spec({"siit": True, "train_length": (1, 8), "test_length": (1, 8)})
    return siit_loss_of(spec)


def test_one_forward_of_several_variables_is_each_rows_own_swap(first_loss):
    """The combined pass (each row patched at its own variable's hook only) gives, row by row, what a pass that
    swaps that one variable on every row gives: several variables train in one forward pass."""
    from exactlens.train.siit import _batch, _resample, site_mask

    circuit = first_loss.circuit
    torch.manual_seed(0)
    model = first_loss.forward.model
    params = {name: torch.randn_like(p)[None] for name, p in model.named_parameters()}
    pairs = circuit.train_pairs[-1]
    batch = _batch(pairs, torch.arange(12), "cpu")
    n_base, width, d = batch.n_positions[:12], batch.tokens.shape[1], model.cfg.d_model
    assign = assign_variables(np.random.default_rng(1), len(circuit.variables), 12, 0)
    hooks = [(h, _resample(m)) for h, m in iit_masks(circuit, model, assign, n_base, width, d).items()]
    both = first_loss.forward(params, batch.tokens, batch.n_positions, hooks)[0, :12]
    for v, variable in enumerate(circuit.variables):
        site = circuit.mapping[variable.name]
        one = first_loss.forward(params, batch.tokens, batch.n_positions,
                                 [(site["hook"], _resample(site_mask(model, site, n_base, width, d)))])[0, :12]
        rows = assign == v
        assert rows.any()
        torch.testing.assert_close(both[rows], one[rows])
    plain = first_loss.forward(params, batch.tokens, batch.n_positions, [])[0, :12]
    assert not torch.allclose(both, plain)  # the swaps do move the output


def test_a_one_hot_group_with_leaking_members_is_one_variable():
    """The diff's one-hot grouping counts a member as set above 1e-3 of the group's largest value, so a softmax's
    leak (~1e-6) does not split a group: tracr-reverse's output reverse_6:a/b/c is one variable, mapped to three
    coordinates of its attention output at once; exact zeros are not required, two set members still are refused."""
    from exactlens.analysis.diff.alignment.variables import one_hot_groups

    feats = [{"label": f"out:{c}", "exact_site": "s", "positions": "all", "index": i} for i, c in enumerate("abc")]
    leak = np.array([[[1.0, 2e-6, 0.0], [1e-12, 1.0, 0.0], [0.0, 5e-7, 1.0]]])
    run = SimpleNamespace(exact_acts={"s": leak}, ids=[0])
    assert list(one_hot_groups(None, feats, [run])) == ["out:*"]
    two = SimpleNamespace(exact_acts={"s": leak + np.array([0.0, 0.0, 0.5])}, ids=[0])
    assert one_hot_groups(None, feats, [two]) == {}

    from exactlens.train.presets import get_preset
    from exactlens.train.siit import high_level

    circuit = high_level(get_preset("tracr-reverse").spec({"train_length": (1, 5), "test_length": (1, 5)}))
    assert "reverse_6:*" in circuit.mapping and not any(k.startswith("reverse_6:") and k != "reverse_6:*"
                                                         for k in circuit.mapping)
    site = circuit.mapping["reverse_6:*"]
    assert site["hook"] == "blocks.3.hook_attn_out" and len(site["dims"]) == 3


def test_effective_rows_draw_each_variables_share_from_its_effective_pairs():
    from exactlens.train.siit import effective_rows

    rows, assign = torch.arange(100), torch.tensor([0, 1] * 50)
    effective = [torch.tensor([500, 501]), torch.tensor([], dtype=torch.long)]
    every = effective_rows(np.random.default_rng(0), rows, assign, effective, 1.0)
    assert set(every[assign == 0].tolist()) == {500, 501}  # all of variable 0's rows from its two effective pairs
    assert every[assign == 1].tolist() == rows[assign == 1].tolist()  # no effective pair: its rows kept
    half = effective_rows(np.random.default_rng(0), rows, assign, effective, 0.5)
    moved = int((half[assign == 0] >= 500).sum())
    assert 10 < moved < 40  # about half of 50
    assert effective_rows(np.random.default_rng(0), rows, assign, effective, 0.0).tolist() == rows.tolist()


def test_effective_pairs_are_those_whose_swap_changes_the_exact_answer(first_loss):
    circuit = first_loss.circuit
    for pairs, effective in zip(circuit.train_pairs, first_loss.effective, strict=True):
        for v, idx in enumerate(effective):
            changed = pairs.cf[v] != pairs.base_answers[v]  # FIRST: one decision per word
            assert sorted(idx.tolist()) == torch.nonzero(changed).flatten().tolist()
    assert sum(len(e[0]) for e in first_loss.effective) > 0


@pytest.mark.parametrize("name", ["first", "tracr-dedup", "tracr-frac_prevs"])
def test_siits_effective_pairs_are_the_diffs_changed_units_with_every_target_kept(name):
    """SIIT's effective pairs (its own decision comparison, siit.effective_pairs) are the pairs the diff's
    designed-pair search counts as changed (designed.changed_units > 0), a position whose counterfactual has no
    answer (TIED, undefined) being no unit of either: one rule, on a classification task, a prediction task with
    undefined outputs in the middle, and a regression task."""
    from exactlens.analysis.diff.alignment.designed import changed_units
    from exactlens.train.presets import get_preset
    from exactlens.train.siit import _targets_kept, siit_loss_of

    lengths = (1, 8) if name == "first" else (1, 4)
    loss = siit_loss_of(get_preset(name).spec({"siit": True, "train_length": lengths, "test_length": lengths}))
    task, checked = loss.circuit.task, 0
    for pairs, effective in zip(loss.circuit.train_pairs, loss.effective, strict=True):
        n_base = pairs.run.n_positions[pairs.base]
        for cf, base, idx in zip(pairs.cf, pairs.base_answers, effective, strict=True):
            rule = (changed_units(task, cf, base, n_base) > 0) & _targets_kept(task, cf, n_base)
            assert sorted(idx.tolist()) == torch.nonzero(rule).flatten().tolist()
            checked += len(idx)
    assert checked > 0


def test_a_presets_siit_defaults_apply_with_siit_only_and_the_users_options_win():
    import dataclasses

    from exactlens.errors import ExactLensError
    from exactlens.train.presets import Preset, get_preset

    first = dataclasses.replace(get_preset("first"), siit_defaults={"epochs": 7, "siit_effective": 0.5})
    assert first.resolve({"siit": True})["epochs"] == 7 and first.resolve({"siit": True})["siit_effective"] == 0.5
    plain = first.resolve({})
    assert plain["epochs"] == get_preset("first").resolve({})["epochs"] and plain["siit_effective"] == 0.0
    assert first.resolve({"siit": True, "epochs": 3})["epochs"] == 3
    with pytest.raises(ExactLensError, match=r"defaults for \['epochz'\]"):
        Preset(name="p", task="first", paper="-", summary="-", config=lambda t, o: None, siit_defaults={"epochz": 3})


def test_majority_trains_with_siit_from_its_registered_defaults():
    """``train majority --siit`` alone: the preset's SIIT defaults give it the width its 21 mapped variables need
    (the paper's d_model 8 is too narrow: siit_map refuses more coordinates than d_model) and effective pairs;
    without --siit the paper's defaults stand."""
    from exactlens.train.presets import get_preset

    preset = get_preset("majority")
    siit, plain = preset.resolve({"siit": True}), preset.resolve({})
    assert siit["siit_effective"] == 0.5 and siit["siit_iit_variables"] == 0 and siit["d_model"] >= 21
    assert siit["train_length"] == (1, 12) and plain["d_model"] == 8 and plain["siit_effective"] == 0.0


def test_an_undefined_position_is_no_target_of_its_pair_not_the_pairs_end():
    """tracr-trend is undefined at every word's last position: a pair keeps its other positions (before, every
    pair was dropped, and the run trained and measured no interchange at all); a pair without any defined
    counterfactual is dropped; a prediction at an undefined position moves no resample measure."""
    pytest.importorskip("tracr")
    from exactlens import tasks
    from exactlens.tasks.base import UNDEFINED
    from exactlens.train.siit import _targets_kept, output_change

    task = tasks.get("tracr-trend")
    n = torch.tensor([4, 4]) + task.n_specials  # words of 4 symbols
    cf = torch.tensor([[0, 1, 2, UNDEFINED], [UNDEFINED] * 4])
    assert _targets_kept(task, cf, n).tolist() == [True, False]
    width, classes = 4 + task.n_specials, len(task.classes)
    a = torch.zeros(2, width, classes)
    b = a.clone()
    b[:, task.n_specials + 3, 0] = 9.0  # only the last position, undefined, moves
    truth = torch.tensor([[0, 1, 2, UNDEFINED]] * 2)
    assert float(output_change(task, a, b, n).max()) > 0.1  # without the targets it counted
    assert float(output_change(task, a, b, n, truth=truth).max()) == 0.0


def test_a_program_undefined_at_one_position_trains_and_measures_every_held_out_pair(tmp_path):
    pytest.importorskip("tracr")
    from exactlens.train import train

    run = train("tracr-trend", siit=True, epochs=1, strings_per_epoch=16, batch_size=16, test_strings=16,
                eval_every=0, threads=1, seed=0, train_length=(1, 4), test_length=(1, 4), out=tmp_path / "run")
    measured = run.info["siit"]["measured"]
    assert set(measured["interchange"]) == {"aggregate_2:*", "trend_3:*"}
    for got in measured["interchange"].values():
        assert got["pairs"] == measured["held_out_pairs"] > 0 and got["changed_pairs"] > 0


def test_a_held_out_word_without_any_target_is_no_word_of_the_resample_measures():
    """tracr-trend's words of one symbol have no defined target (the last position is undefined): the resample
    measures (decision and output change of each unmapped part) leave them out of their denominators, so held-out
    pairs of length 1 beside those of length 3 give length 3's numbers alone, and length 1 alone measures nothing
    (before, each such word counted as an unchanged decision: length 1 alone read as perfectly strict, 0.0); the
    strictness loss of a batch is that of its words with a target."""
    pytest.importorskip("tracr")
    from exactlens.train.presets import get_preset
    from exactlens.train.siit import measure, siit_loss_of

    loss = siit_loss_of(get_preset("tracr-trend").spec({"siit": True, "train_length": (1, 3),
                                                       "test_length": (1, 3)}))
    task, sets = loss.circuit.task, {p.run.length: p for p in loss.circuit.train_pairs}
    one, three = sets[1], sets[3]
    truth = one.run.truth[one.base]
    assert not task.target_mask(one.run.n_positions[one.base] - task.n_specials, truth.shape[1], truth).any()
    torch.manual_seed(0)
    model = loss.forward.model
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.3 * torch.randn_like(p))  # an imperfect model: resampling moves some decisions
    loss.circuit.test_pairs = [three]
    alone = measure(loss, model)
    assert max(alone["resample_output_change"].values()) > 0
    loss.circuit.test_pairs = [one, three]
    both = measure(loss, model)
    for key in ("resample_decision_change", "resample_output_change"):
        assert both[key] == pytest.approx(alone[key], rel=1e-9, abs=1e-12), key
    loss.circuit.test_pairs = [one]
    nothing = measure(loss, model)
    assert nothing["resample_decision_change"] == {} and nothing["max_resample_decision_change"] is None


def test_a_pair_set_without_any_target_is_never_drawn():
    """tracr-trend's words of one symbol have no defined target: their pair set gives neither an IIT nor a
    strictness loss, so a step that drew it trained nothing (26 % of tracr-trend's steps at 1..5). Each set is
    drawn as often as it has base words with a target; at length 1 alone the run is refused in one line."""
    pytest.importorskip("tracr")
    from exactlens.errors import ExactLensError
    from exactlens.train.presets import get_preset
    from exactlens.train.siit import siit_loss_of

    loss = siit_loss_of(get_preset("tracr-trend").spec({"siit": True, "train_length": (1, 3),
                                                       "test_length": (1, 3)}))
    lengths = [p.run.length for p in loss.circuit.train_pairs]
    weights = dict(zip(lengths, loss.weights, strict=True))
    assert 1 in weights and weights[1] == 0.0
    assert all(w > 0 for length, w in weights.items() if length > 1) and sum(weights.values()) == pytest.approx(1)
    with pytest.raises(ExactLensError, match="^siit: .*lengths \\[1\\]"):  # nothing to train there: one line
        siit_loss_of(get_preset("tracr-trend").spec({"siit": True, "train_length": (1, 1), "test_length": (1, 3)}))

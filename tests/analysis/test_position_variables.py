"""Position-resolved variables (issue 41, item 3) and labels a later component overwrites after reading them.

A variable the exact circuit holds at a position other than the readout (FIRST's first symbol at position 1,
before [CLS] reads it) is tested at that position: its counterfactual swaps it there only, and the trained model
is patched there only. Its counterfactual is the answer itself, yet at its own position it can be localized.
"""

from __future__ import annotations

import numpy as np
import torch

from exactlens import tasks
from exactlens.analysis.diff import diff
from exactlens.analysis.diff.alignment.designed import design_pairs
from exactlens.analysis.diff.alignment.directions import own_directions
from exactlens.analysis.diff.alignment.patch import Fit, patch_masks
from exactlens.analysis.diff.alignment.score import score_group
from exactlens.analysis.diff.alignment.variables import (
    TIED,
    exact_variables,
    position_variables,
    unread_after,
    varying_positions,
)
from exactlens.analysis.diff.alignment.verdicts import format_verdict_line
from exactlens.analysis.diff.probes import before_overwrite
from exactlens.analysis.diff.runs import make_side, run_both
from exactlens.analysis.timeline.events import events
from exactlens.constructions import build
from exactlens.model.labels import label_direction

SMALL = dict(parts=("alignment",), das_max_dim=1, das_steps=40, alignment_pairs=16, untrained_baseline=False)
AND = "I[w_i=1 & i=1]"


def _exact(name: str, lengths: list[int]):
    """A construction's (task, exact side, runs of ``lengths``, probe features)."""
    model = build(name, dtype="float64")
    task = tasks.of_model(model)
    side = make_side(model, {}, tasks.reader(model), model.cfg.readout_position, True)
    runs = run_both(task, lengths, 64, 0, side, side)
    features = diff(model, name, lengths=lengths, parts=("probes",), untrained_baseline=False)["probes"]["features"]
    return task, side, runs, features


def test_a_position_resolved_variable_is_localized_at_its_position_and_not_at_others() -> None:
    """The planted case: FIRST's AND label is the first symbol at position 1 (zero elsewhere). Its exact
    direction swapped at the first FFN's output at position 1 gives the counterfactual on every changed pair
    (IIA 1); the same swap at position 2, 3 or at [CLS] changes nothing (IIA 0, doing nothing)."""
    task, side, runs, features = _exact("first", [4, 5])
    variables, _ = exact_variables(side, features, runs)
    label = next(v for v in variables if v.name == AND)
    assert varying_positions(label, runs, side.model.readout_rows) == [1]
    resolved = position_variables(side, [label], [1.0], 0.99, 2, runs)
    assert [v.name for v in resolved] == [f"{AND}@1"] and resolved[0].position_index == 1
    assert position_variables(side, [label], [0.5], 0.99, 2, runs) == []  # not the answer: no resolution needed
    labels = list(side.model.cfg.residual_labels)
    known = own_directions(resolved, labels)[0]  # a self-diff's fit starts from the label's own dimension
    assert torch.equal(known[:, 0], torch.eye(len(labels), dtype=known.dtype)[labels.index(AND)])
    design = design_pairs(task, runs, resolved, 20, seed=0)
    test = design.splits[2]
    assert sum(int((p.cf[0] != p.base_answers[0]).sum()) for p in test) >= 20
    index = list(side.model.cfg.residual_labels).index(AND)
    projector = torch.zeros(1, side.d_model, side.d_model, dtype=torch.float64)
    projector[0, index, index] = 1.0
    iia = {}
    for positions in ("@1", "@2", "@3", "readout"):
        score = score_group(task, side, "blocks.0.hook_mlp_out", [Fit(0, 1, positions)], test, projector)[0]
        assert score["changed_units"] >= 20
        iia[positions] = score["iia_changed"]
    assert iia == {"@1": 1.0, "@2": 0.0, "@3": 0.0, "readout": 0.0}, iia
    mask = patch_masks(side, runs[0], [Fit(0, 1, "@2"), Fit(0, 1, "@9")])
    assert mask[0].tolist() == [0, 0, 1, 0, 0] and not mask[1].any()  # a length without position 9: no patch


def test_first_self_diff_computes_the_first_symbol_at_position_1_where_the_circuit_writes_it() -> None:
    """FIRST against itself: the AND label at position 1 is "computed" at the first FFN's output (the component
    that writes it: its exact site is that layer's resid_post), at position 1; at position 1 the input holds
    the token (a row "in the input") and layer 0's attention writes nothing of it (its row not found). At the
    readout the same label stays indistinguishable from the answer."""
    result = diff("first", "first", lengths=[3, 4, 5, 6], **SMALL)
    lines = result["summary"]["verdicts"]
    line = lines[f"{AND}@1"]
    assert line["verdict"] == "computed" and line["site"] == "blocks.0.hook_mlp_out", line
    assert line["position"] == "at" and line["position_index"] == 1 and line["position_name"] == "position 1"
    assert line["changed_pairs"] >= 10 and line["iia"] == 1.0, line
    assert f"{AND}@1: computed at blocks.0.hook_mlp_out [position 1]" in format_verdict_line(f"{AND}@1", line)
    described = {v["variable"]: v for v in result["alignment_details"]["variables"]}
    assert described[f"{AND}@1"]["exact_site"] == "blocks.0.hook_resid_post"
    assert described[f"{AND}@1"]["position_index"] == 1 and described[f"{AND}@1"]["resolves"] == AND
    rows = {r["site"]: r for r in result["alignment"] if r["variable"] == f"{AND}@1"}
    assert all(r["position"] == "at" and r["position_index"] == 1 for r in rows.values())
    assert rows["blocks.0.hook_resid_pre"]["verdict"] == "in the input"
    assert rows["blocks.0.hook_attn_out"]["verdict"] == "not found"
    assert rows["blocks.1.hook_attn_out"]["verdict"] == "not found"  # after layer 1 reads it, nothing uses it there
    assert lines["s"]["verdict"] == "indistinguishable from the answer"
    assert lines["s"].get("position_index") is None


def test_random_pairs_test_a_position_resolved_variable_too() -> None:
    """With random pairs the position-resolved variable is tested on the same pairs as the others (its
    counterfactuals added): at 16 pairs per length too few change it to decide, and its line says so."""
    line = diff("first", "first", lengths=[3, 4, 5], pairs="random", **SMALL)["summary"]["verdicts"][f"{AND}@1"]
    assert line["pairs"] == "random" and line["pool"] is None and line["position_index"] == 1
    assert line["verdict"] in ("too few pairs", "computed", "in the input"), line


def test_the_timeline_dates_a_position_resolved_variable_with_its_position() -> None:
    def row(step: int, verdict: str) -> dict:
        return {"step": step, "verdicts": {f"{AND}@1": {"verdict": verdict, "iia_ci": [0.95, 1.0], "position_index": 1,
                                                        "site": "blocks.0.hook_mlp_out"}}}

    found = events([row(0, "not found"), row(10, "computed"), row(20, "computed")])
    assert found["variables"][f"{AND}@1"] == {"step": 10, "site": "blocks.0.hook_mlp_out", "how": "computed",
                                              "position_index": 1}
    assert f"{AND}@1 computed at step 10" in found["order"]


def test_a_label_a_later_component_overwrites_after_reading_is_settled_where_it_is_read() -> None:
    """tracr-hist: the FFN reads hist_2_selector_width_attn_output (written by the attention) and then clears it
    at BOS, so its value at the last site is not the one anything read. It is settled where the attention wrote
    it (hook_resid_mid), and swapping it there changes the exact output: it is testable (it was "untestable")."""
    held = {"a": np.zeros(4), "b": np.array([1.0, 0.5, 0.5, 0.3]), "c": np.array([0.0, 0.5, 0.5, 0.3])}
    sites = ["a", "b", "c"]
    reads = [None, np.array([False, True]), np.array([True, False])]
    assert before_overwrite(held, sites, "c", reads, 0) == "b"  # the component writing c reads label 0 and changes it
    assert before_overwrite(held, sites, "c", reads, 1) == "c"  # it does not read label 1: the last value stands
    unchanged = {**held, "c": held["b"]}
    assert before_overwrite(unchanged, sites, "c", reads, 0) == "c"  # read but not changed
    # a changed value that a later component reads again is no overwrite: it is what that one reads
    later = {**held, "d": held["c"]}
    assert before_overwrite(later, [*sites, "d"], "d", [*reads, np.array([True, False])], 0) == "d"
    assert before_overwrite(later, [*sites, "d"], "d", [*reads, np.array([False, True])], 0) == "b"
    task, side, runs, features = _exact("tracr-hist", [4, 5])
    name = "hist_2_selector_width_attn_output"
    assert next(f for f in features if f["label"] == name)["exact_site"] == "blocks.0.hook_resid_mid"
    variables, _ = exact_variables(side, features, runs)
    label = next(v for v in variables if v.name == name)
    design = design_pairs(task, runs, [label], 16, seed=0)
    assert design.pools[2][0].effective > 0 and design.pools[0][0].effective > 0


def test_the_page_names_a_position_resolved_row_by_its_position():
    """The alignment's page column and tooltip read "position p" for position "at", the position word else."""
    from exactlens.analysis.diff.parts.alignment import _cell, _positions

    assert _positions({"position": "at", "position_index": 1}) == "position 1"
    assert _positions({"position": "readout"}) == "readout"
    row = {"verdict": "computed", "iia_changed": 1.0, "iia_ci": [0.9, 1.0], "changed_pairs": 32, "position": "at",
           "position_index": 1, "dim": 1, "pairs": 40, "lift": 1.0, "random_iia_changed": 0.0,
           "random_iia_p95": 0.0, "untrained_iia_changed": 0.0, "training_iia_changed": 1.0}
    assert "position 1, dim 1" in _cell(row) and "at positions" not in _cell(row)


def test_a_swap_that_leaves_the_answer_to_rounding_has_no_counterfactual() -> None:
    """parity-ln-eta's k/n at position 1: where the base word has k = 1 and the source another k, the swap takes
    I[i=k] from position 1 and no position holds it, so s = 0 and the answer is undefined; the confidence layer's
    post-LN (eps = 0) scales the residue of s (~1e-17) to a confident answer. Such a pair has no counterfactual
    (TIED) and is no designed pair, so the label's own direction, swapped at its writer's output at position 1,
    gives the counterfactual on every changed pair of every split (it was 0.9375 of 96 training pairs, 58 of them
    decided by rounding)."""
    task, side, runs, features = _exact("parity-ln-eta", [4, 6])
    variables, _ = exact_variables(side, features, runs)
    (resolved,) = position_variables(side, [v for v in variables if v.name == "k/n"], [1.0], 0.99, 1, runs)
    run = runs[1]
    ones = run.ids.sum(1)
    base, source = torch.nonzero(ones == 1).flatten(), torch.nonzero(ones != 1).flatten()
    pairs = torch.cartesian_prod(base[:8], source[:8])
    cf = resolved.counterfactual(run, pairs[:, 0], pairs[:, 1])
    assert len(pairs) >= 32 and bool((cf == TIED).all()), cf
    design = design_pairs(task, runs, [resolved], 32, seed=0)
    labels = list(side.model.cfg.residual_labels)
    u = label_direction(labels, "k/n").double()
    projector = (u[:, None] * u[None, :]).unsqueeze(0)
    for split in design.splits:
        score = score_group(task, side, "blocks.0.hook_attn_out", [Fit(0, 1, "@1")], split, projector)[0]
        assert score["changed_units"] >= 10 and score["iia_changed"] == 1.0, score
    # s at position 1 (and the confidence layer's s̄) reach no readout: that layer's attention does nothing
    site = {f["label"]: f["exact_site"] for f in features}
    assert "no attention layer after" in unread_after(side, site["s"], 1)
    assert unread_after(side, site["k/n"], 1) is None and resolved.unread is None


def test_a_membership_logit_zero_to_within_rounding_has_no_counterfactual() -> None:
    """parity (no layer norm) has no eps = 0 norm at the readout, but the same k = 1 swap of k/n at position 1
    leaves s = 0: the exact model's logit is exactly 0, and its decision "reject" only the tie-break of
    logit > 0. The self-diff's rotated copy, patched in the same direction, gets a residue of rounding instead,
    which decides either way: its k/n@1 was "unconverged" (0.97 on 68 changed test pairs, below 0.99 on its
    training pairs) and I[i=k]/n@1 too (0.94), before such pairs had no counterfactual (TIED)."""
    task, side, runs, features = _exact("parity", [4, 6])
    variables, _ = exact_variables(side, features, runs)
    (resolved,) = position_variables(side, [v for v in variables if v.name == "k/n"], [1.0], 0.99, 1, runs)
    run = runs[1]
    ones = run.ids.sum(1)
    base, source = torch.nonzero(ones == 1).flatten(), torch.nonzero(ones >= 2).flatten()
    pairs = torch.cartesian_prod(base[:8], source[:8])
    cf = resolved.counterfactual(run, pairs[:, 0], pairs[:, 1])
    assert len(pairs) >= 32 and bool((cf == TIED).all()), cf
    # a swap that keeps a position with i = k has an answer: bases with k = 2, sources with k >= 3
    two, more = torch.nonzero(ones == 2).flatten()[:8], torch.nonzero(ones >= 3).flatten()[:8]
    pairs = torch.cartesian_prod(two, more)
    decided = resolved.counterfactual(run, pairs[:, 0], pairs[:, 1])
    assert len(pairs) >= 16 and bool((decided != TIED).all()), decided


def test_a_label_attention_adds_to_and_the_ffn_reads_is_settled_where_the_ffn_reads_it() -> None:
    """Shin & Matzinger's solution 1: attention adds the previous token's category into the category coordinates
    cat0..cat9, and the FFN reads the sum (the pair). The labels are variables at the site the FFN reads, not
    input features skipped because attention changed them after reading them (before the rule about later
    readers they were skipped as "input feature (set by the embedding)", and SIIT found nothing to map)."""
    _, side, runs, features = _exact("sm-solution1", [4, 5])
    sites = {f["label"]: f["exact_site"] for f in features}
    assert all(sites[f"cat{c}"] == "blocks.0.hook_resid_mid" for c in range(10)), sites
    variables, skipped = exact_variables(side, features, runs)
    names = {v.name for v in variables}
    assert {f"cat{c}" for c in range(10)} <= names, (names, skipped)

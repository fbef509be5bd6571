"""Distributed alignment search (exactlens.analysis.diff.alignment) and rotated residual bases
(exactlens.model.basis): tests that would catch a wrong alignment.

An alignment method must (1) find every variable of an exact circuit in that circuit itself,
(2) find it just as well after the residual basis is rotated (it may not assume the basis),
(3) score low on an untrained model and on a model that computes another task, and (4) recover
the dimension of a variable that needs two dimensions (majority of three classes: the counts at
the readout position vary in a 2-D subspace, since they sum to n).
"""

from __future__ import annotations

import json

import pytest
import torch
from samples import construction_sample

from exactlens import tasks
from exactlens.analysis.diff import diff
from exactlens.analysis.diff.alignment import choose_dim, units
from exactlens.cli import main
from exactlens.constructions import build
from exactlens.errors import ExactLensError
from exactlens.model import ExactTransformer
from exactlens.model.basis import random_rotation, rotate_residual

FIRST_LENGTHS = [3, 4, 5, 6]
FAST = dict(parts=("alignment",), das_max_dim=1, das_steps=60, alignment_pairs=48)


def _task_best(result: dict, variable: str) -> dict:
    return next(b for b in result["alignment_details"]["best"] if b["variable"] == variable and b["origin"] == "task")


# ----------------------------------------------------------------------------- rotated bases


@pytest.mark.parametrize("name", construction_sample())
def test_rotated_copy_computes_the_same_function(name: str) -> None:
    model = build(name, dtype="float64")
    gen = torch.Generator().manual_seed(5)
    q = random_rotation(model.cfg.d_model, gen, fix_ones=True)
    rotated = rotate_residual(model, q)
    task = tasks.of_model(model)
    length = max(6, task.min_length) if task.max_length is None else min(max(6, task.min_length), task.max_length)
    words = task.sample(length, 32, gen)
    batch = task.encode(words)
    with torch.no_grad():
        a, b = model.readout(batch.tokens), rotated.readout(batch.tokens)
        reader = tasks.reader(model)
        da, db = reader.decide(a, batch.n_positions), reader.decide(b, batch.n_positions)
        assert torch.allclose(da, db, atol=1e-9) if task.kind == "regression" else torch.equal(da, db)
        finite = torch.isfinite(a)
        assert torch.equal(finite, torch.isfinite(b))
        assert torch.allclose(a[finite], b[finite], atol=1e-9, rtol=1e-9)
        _, cache_a = model.run_with_cache(batch.tokens)
        _, cache_b = rotated.run_with_cache(batch.tokens)
    rows = model.readout_rows(batch.n_positions)
    for site in ("blocks.0.hook_resid_pre", f"blocks.{model.cfg.n_layers - 1}.hook_resid_post"):
        x, y = cache_a[site], cache_b[site]
        if rows is not None:  # positions the readout never reads may be layer norms (eps = 0) of rounding noise
            x, y = x[torch.arange(len(rows)), rows], y[torch.arange(len(rows)), rows]
        ok = torch.isfinite(x).all(-1)
        assert torch.allclose((x @ q)[ok], y[ok], atol=1e-8), site  # every residual vector is rotated


def test_rotation_is_checked() -> None:
    model = build("first-ln", dtype="float64")
    d = model.cfg.d_model
    with pytest.raises(ExactLensError, match="orthogonal"):
        rotate_residual(model, torch.eye(d) * 2)
    with pytest.raises(ExactLensError, match="all-ones"):
        rotate_residual(model, random_rotation(d, torch.Generator().manual_seed(0)))  # centering needs Q 1 = 1
    with pytest.raises(ExactLensError, match=f"{d} x {d}"):
        rotate_residual(model, torch.eye(d + 1))
    q = random_rotation(7, torch.Generator().manual_seed(1), fix_ones=True)
    assert torch.allclose(q @ q.T, torch.eye(7, dtype=q.dtype), atol=1e-12)
    assert torch.allclose(torch.ones(7, dtype=q.dtype) @ q, torch.ones(7, dtype=q.dtype), atol=1e-12)


# ----------------------------------------------------------------------------- DAS


def test_exact_first_against_itself_and_a_rotated_copy() -> None:
    model = build("first", dtype="float64")
    rotated = rotate_residual(model, random_rotation(model.cfg.d_model, torch.Generator().manual_seed(2)))
    for candidate in (model, rotated):
        result = diff(candidate, "first", lengths=FIRST_LENGTHS, **FAST)
        json.dumps(result, allow_nan=False)
        summary = result["summary"]
        assert summary["mean_das_iia_changed"] == 1.0
        best = _task_best(result, "first symbol")
        # Layer 2 moves w_1 to [CLS]; before it, nothing at the readout position depends on w_1.
        assert best["site"].startswith("blocks.1.") and best["position"] == "readout", best
        assert best["random_iia_changed"] < 0.5 and best["untrained_iia_changed"] < 0.8, best
        early = [r for r in result["alignment"]
                 if r["variable"] == "first symbol" and r["site"].startswith("blocks.0.")]
        assert early and all(r["iia_changed"] == 0.0 for r in early), early
        fields = {"variable", "site", "position", "dim", "pairs", "iia", "iia_changed", "random_iia_changed",
                  "untrained_iia_changed"}
        assert all(fields <= set(r) for r in result["alignment"])


def test_untrained_model_scores_low() -> None:
    exact = build("first", dtype="float64")
    untrained = ExactTransformer(exact.cfg.replace(residual_labels=None)).init_weights(seed=3).eval()
    result = diff(untrained, "first", lengths=FIRST_LENGTHS, **FAST)
    assert result["summary"]["mean_das_iia_changed_task"] < 0.8, result["alignment_details"]["best"]


def test_model_of_another_task_scores_low() -> None:
    """ONE's exact circuit, presented as a model of FIRST: it never reads w_1, so no subspace of it
    carries FIRST's variable (its decisions are ONE's, which swapping cannot turn into FIRST's)."""
    one = build("one", dtype="float64")
    one.cfg.task = tasks.get("first").spec()
    one.cfg.decision_rule = None
    result = diff(one, "first", lengths=[4, 5, 6, 7, 8], **{**FAST, "alignment_pairs": 64})
    best = _task_best(result, "first symbol")
    assert best["iia_changed"] < 0.75, best  # near chance (1/2): the untrained baseline's level


def test_a_two_dimensional_variable_needs_two_dimensions() -> None:
    model = build("majority", dtype="float64", num_classes=3)
    result = diff(model, "majority", params={"num_classes": 3}, lengths=[5, 6, 7], parts=("alignment",),
                  das_max_dim=3, untrained_baseline=False)
    row = next(r for r in result["alignment"] if r["variable"] == "counts" and r["site"] == "blocks.0.hook_attn_out")
    assert row["dim"] == 2 and row["iia"] == 1.0, row
    assert row["validation_iia_by_dim"]["1"] < 0.9 <= row["validation_iia_by_dim"]["2"], row


def test_choose_dim_and_units() -> None:
    assert choose_dim({1: 0.5, 2: 0.995, 3: 1.0}) == 2  # within 0.01 of the best: the smaller
    assert choose_dim({1: None, 2: None}) == 1
    task = tasks.get("first")
    right, changed = units(task, torch.tensor([True, False, True]), torch.tensor([True, True, False]),
                           torch.tensor([False, True, False]), torch.tensor([4, 4, 4]))
    assert right.tolist() == [True, False, False] and changed.tolist() == [True, False, False]


def test_cli_options_and_refusals(capsys) -> None:
    assert main(["diff", "first", "--against", "first", "--lengths", "3,4", "--parts", "behaviour,alignment",
                 "--das-max-dim", "1", "--das-steps", "10", "--alignment-pairs", "16", "--no-untrained-baseline",
                 "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["alignment"] and all(r["untrained_iia_changed"] is None for r in result["alignment"])
    assert result["settings"]["das_steps"] == 10 and "probes" not in result
    assert main(["diff", "first", "--against", "first", "--das-steps", "0"]) == 2
    assert "--das-steps takes an integer >= 1, got '0'" in capsys.readouterr().err


def test_iia_heatmap_has_a_cell_per_variable_and_site() -> None:
    from exactlens.viz.diff_page import iia_heatmap

    rows = [
        {"variable": "first symbol", "origin": "task", "site": "blocks.1.hook_attn_out", "position": "readout",
         "dim": 1, "pairs": 10, "iia_changed": 1.0, "random_iia_changed": 0.0, "untrained_iia_changed": None},
        {"variable": "s", "origin": "exact", "site": "blocks.0.hook_resid_pre", "position": "readout",
         "dim": 2, "pairs": 10, "iia_changed": None, "random_iia_changed": None, "untrained_iia_changed": None},
    ]
    html = iia_heatmap(rows, ["blocks.0.hook_resid_pre", "blocks.1.hook_attn_out"])
    assert html.count("<tr>") == 3 and html.count("<td") == 2 * (2 + 2)
    assert "rgb(100,200,100)" in html  # IIA 1.0 is full green
    assert html.count("background:#eee") == 3  # one cell without changed pairs, two sites not fit
    assert "random subspace 0" in html

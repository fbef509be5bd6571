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

import numpy as np
import pytest
import torch
from samples import construction_sample

from exactlens import tasks
from exactlens.analysis.diff import diff
from exactlens.analysis.diff.alignment.directions import transported_directions
from exactlens.analysis.diff.alignment.fit import choose_dim
from exactlens.analysis.diff.alignment.score import regression_answers, units
from exactlens.analysis.diff.alignment.variables import TIED, no_answer_where_tied
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


@pytest.fixture(scope="module")
def exact_first_diff() -> dict:
    """The exact FIRST against itself (FAST), computed once for the tests that read it (none changes it)."""
    return diff(build("first", dtype="float64"), "first", lengths=FIRST_LENGTHS, **FAST)


def test_exact_first_against_itself_and_a_rotated_copy(exact_first_diff: dict) -> None:
    model = build("first", dtype="float64")
    rotated = rotate_residual(model, random_rotation(model.cfg.d_model, torch.Generator().manual_seed(2)))
    for result in (exact_first_diff, diff(rotated, "first", lengths=FIRST_LENGTHS, **FAST)):
        json.dumps(result, allow_nan=False)
        summary = result["summary"]
        assert summary["mean_das_iia_changed_task"] == 1.0  # the task's counterfactuals: every variable found
        best = _task_best(result, "first symbol")
        # Layer 2 moves w_1 to [CLS]; before it, nothing at the readout position depends on w_1.
        assert best["site"].startswith("blocks.1.") and best["position"] == "readout", best
        assert best["random_iia_changed"] < 0.5 and best["untrained_iia_changed"] < 0.8, best
        early = [r for r in result["alignment"] if r["variable"] == "first symbol"
                 and r["site"].startswith("blocks.0.") and r["test"] == "interchange"]
        assert early and all(r["iia_changed"] == 0.0 for r in early), early
        fields = {"variable", "site", "position", "dim", "pairs", "iia", "iia_changed", "random_iia_changed",
                  "untrained_iia_changed", "changed_pairs", "iia_ci", "do_nothing_iia", "lift", "random_iia_p95",
                  "training_iia_changed", "converged", "verdict"}
        assert all(fields <= set(r) for r in result["alignment"])
        # every FIRST variable is the answer itself at [CLS]; the first symbol and the AND are localized
        # apart from it where the exact circuit computes them (the first FFN's output, every position),
        # s (held only at [CLS]) is not
        verdicts = result["summary"]["verdicts"]
        for name in ("first symbol",):
            v = verdicts[name]
            assert v["verdict"] == "computed" and v["site"] == "blocks.0.hook_mlp_out" and v["position"] == "all", v
            assert v["iia"] >= 0.95 and v["iia_ci"][0] > 0.75 and v["changed_pairs"] >= 10, v
        assert verdicts["s"]["verdict"] == "indistinguishable from the answer" and verdicts["s"]["site"] is None


def test_exact_first_localizes_the_and_label(exact_first_diff: dict) -> None:
    v = exact_first_diff["summary"]["verdicts"]["I[w_i=1 & i=1]"]
    assert v["verdict"] == "computed" and v["site"] == "blocks.0.hook_mlp_out", v


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
    solves = result["alignment_details"]["solves"]
    assert not solves["solves"] and solves["accuracy"] < 0.6, solves
    verdicts = result["summary"]["verdicts"]
    assert verdicts and all(v["verdict"] == "model does not solve the task" for v in verdicts.values()), verdicts
    assert all(r["verdict"] != "computed" for r in result["alignment"])


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


def test_regression_units_take_answers_within_rounding_as_one() -> None:
    """A patch in a rotated basis reaches an exact counterfactual answer by other roundings (1e-14 off):
    it is right, and an answer that differs only by rounding is no change; a real difference still is."""
    task = tasks.get("pairs")
    n_pos = torch.tensor([4, 4])  # words of length 4: positions 1..3 carry a target
    cf = torch.tensor([[0.0, 0.5, 0.5 + 1e-15, 2.0], [0.0, 2.0, 0.5, 0.5]], dtype=torch.float64)
    decisions = cf + torch.tensor([[0.0, 1e-14, -1e-14, 1e-14], [0.0, 0.4, 0.0, 1.2]], dtype=torch.float64)
    base = torch.tensor([[0.0, 0.5 + 2e-15, 2.0, 2.0], [0.0, 0.5, 0.5, 0.5]], dtype=torch.float64)
    right, changed = units(task, decisions, cf, base, n_pos)
    assert right.tolist() == [True, True, True, True, True, False]
    assert changed.tolist() == [False, True, False, True, False, False]
    _, answer_changed = units(task, decisions, cf, base, n_pos, base_is_decision=False)
    assert answer_changed.tolist() == changed.tolist()
    decode, tol = regression_answers(torch.tensor([0.5, 0.5 + 1e-15, 0.5 + 1e-4]))
    assert 1e-15 < tol < 1e-4 and decode(torch.tensor([0.5, 0.5 + 1e-15, 0.50009])).tolist() == [0, 0, 1]


def test_transported_directions_carry_exact_labels_into_a_rotated_basis() -> None:
    """A rotated copy names no residual dimensions: the least-squares map between the two models'
    activations (uncentred, sites stacked) carries label e_i to e_i Q, also for tracr-hist's one-hot
    count hist_2:0..5, whose dimensions sum to a constant at the sites after the MLP writes them."""
    from types import SimpleNamespace

    exact_model = build("tracr-hist", dtype="float64")
    q = random_rotation(exact_model.cfg.d_model, torch.Generator().manual_seed(2), fix_ones=True)
    rotated = rotate_residual(exact_model, q)
    task = tasks.of_model(exact_model)
    tokens = task.encode(task.sample(4, 40, torch.Generator().manual_seed(0))).tokens
    sites = ["blocks.0.hook_resid_pre", "blocks.0.hook_attn_out", "blocks.0.hook_mlp_out", "blocks.0.hook_resid_post"]
    acts = [{s: c[s].double().numpy() for s in sites} for c in (m.run_with_cache(tokens)[1] for m in (exact_model,
                                                                                                        rotated))]
    run = SimpleNamespace(exact_acts=acts[0], trained_acts=acts[1])
    labels = list(exact_model.cfg.residual_labels)
    names = ["hist_2:1", "hist_2:2", "hist_2:3"]
    variables = [SimpleNamespace(name=n, origin="exact") for n in [*names, "hist_2:0"]]  # count 0 never occurs
    variables.append(SimpleNamespace(name="x", origin="task"))
    found = transported_directions(variables, SimpleNamespace(model=exact_model, sites=sites),
                                   [SimpleNamespace(run=run, base=torch.arange(40))])
    assert sorted(found) == [0, 1, 2]  # hist_2:0 (never set) and the task variable get none
    for i, name in enumerate(names):
        assert found[i].shape == (exact_model.cfg.d_model, 1)
        assert abs(float(found[i][:, 0] @ q[labels.index(name)])) > 1 - 1e-9, name
    # a one-hot group is carried whole: its columns span the rotated members' directions
    group = SimpleNamespace(name="hist_2:*", origin="exact", detail={"members": names})
    carried = transported_directions([group], SimpleNamespace(model=exact_model, sites=sites),
                                     [SimpleNamespace(run=run, base=torch.arange(40))])[0]
    rows = q[[labels.index(n) for n in names]].T.double()  # [d, 3]
    assert carried.shape == rows.shape
    assert torch.allclose(carried @ carried.T, rows @ rows.T, atol=1e-9)
    # a model that is no linear copy of the exact one (a trained model's activations: here the copy's, bent by
    # a nonlinearity) gets no carried direction, and so keeps its probe starts
    bent = SimpleNamespace(exact_acts=acts[0], trained_acts={k: np.tanh(v) for k, v in acts[1].items()})
    assert transported_directions(variables, SimpleNamespace(model=exact_model, sites=sites),
                                  [SimpleNamespace(run=bent, base=torch.arange(40))]) == {}


def test_transported_directions_use_the_weights_where_the_activations_span_less() -> None:
    """tracr-shuffle_dyck on words of lengths 4 and 6: the activations span 27 of 41 dimensions and tie 'token is ('
    plus 'token is )' to other labels, so the activations alone carry bools_open_6 30 degrees off e_i Q (its
    rotated self-diff's fits started there and stayed at IIA 0.0 on 68 changed test pairs); with both models'
    weights in the residual space the map is Q itself. A copy whose weights are no rotation of the exact ones
    falls back to the activations alone, under the same exactness test."""
    from types import SimpleNamespace

    exact_model = build("tracr-shuffle_dyck", dtype="float64")
    q = random_rotation(exact_model.cfg.d_model, torch.Generator().manual_seed(2), fix_ones=True)
    rotated = rotate_residual(exact_model, q)
    task = tasks.of_model(exact_model)
    tokens = [task.encode(task.sample(n, 40, torch.Generator().manual_seed(n))).tokens for n in (4, 6)]
    sites = [f"blocks.{layer}.hook_resid_{kind}" for layer in range(exact_model.cfg.n_layers)
             for kind in ("mid", "post")]
    runs = []
    for words in tokens:
        acts = [{s: c[s].double().numpy() for s in sites} for c in (m.run_with_cache(words)[1]
                                                                   for m in (exact_model, rotated))]
        runs.append(SimpleNamespace(run=SimpleNamespace(exact_acts=acts[0], trained_acts=acts[1]),
                                    base=torch.arange(len(words))))
    labels = list(exact_model.cfg.residual_labels)
    variables = [SimpleNamespace(name=n, origin="exact") for n in ("bools_open_6", "bools_close_9")]
    exact = SimpleNamespace(model=exact_model, sites=sites)

    def cosines(found: dict) -> list[float]:
        return [abs(float(found[i][:, 0] @ q[labels.index(v.name)])) for i, v in enumerate(variables)]

    assert max(cosines(transported_directions(variables, exact, runs))) < 0.9  # the activations alone
    assert min(cosines(transported_directions(variables, exact, runs, rotated))) > 1 - 1e-9
    unrelated = rotate_residual(exact_model, random_rotation(exact_model.cfg.d_model, torch.Generator().manual_seed(3),
                                                             fix_ones=True))
    assert cosines(transported_directions(variables, exact, runs, unrelated)) == \
        cosines(transported_directions(variables, exact, runs))


def test_a_float32_rotated_copy_gets_its_carried_directions() -> None:
    """A float32 rotated copy of tracr-hist against the float64 exact model misses a linear map by rounding (relative
    misfit ~4e-6, above the float64 tolerance): the float32 tolerance carries its labels to e_i Q all the same."""
    from types import SimpleNamespace

    exact_model = build("tracr-hist", dtype="float64")
    q = random_rotation(exact_model.cfg.d_model, torch.Generator().manual_seed(2), fix_ones=True)
    rotated = rotate_residual(build("tracr-hist", dtype="float32"), q)
    task = tasks.of_model(exact_model)
    tokens = task.encode(task.sample(4, 40, torch.Generator().manual_seed(0))).tokens
    sites = ["blocks.0.hook_resid_pre", "blocks.0.hook_attn_out", "blocks.0.hook_mlp_out", "blocks.0.hook_resid_post"]
    acts = [{s: c[s].double().numpy() for s in sites} for c in (m.run_with_cache(tokens)[1] for m in (exact_model,
                                                                                                        rotated))]
    pairs = [SimpleNamespace(run=SimpleNamespace(exact_acts=acts[0], trained_acts=acts[1]), base=torch.arange(40))]
    labels = list(exact_model.cfg.residual_labels)
    variables = [SimpleNamespace(name=n, origin="exact") for n in ("hist_2:1", "hist_2:2")]
    found = transported_directions(variables, SimpleNamespace(model=exact_model, sites=sites), pairs, rotated)
    assert sorted(found) == [0, 1]
    for i, v in enumerate(variables):
        assert abs(float(found[i][:, 0].double() @ q[labels.index(v.name)])) > 1 - 1e-5


def test_tied_exact_counterfactuals_have_no_answer() -> None:
    """Where an exact label's patched model ties at the top, its answer is argmax's tie-break: no unit."""
    from types import SimpleNamespace

    task = tasks.get("majority")
    exact = SimpleNamespace(reader=SimpleNamespace(task=task), exact=True,
                            model=SimpleNamespace(cfg=SimpleNamespace(torch_dtype=torch.float64)))
    outputs = torch.tensor([[1.0, 1.0 + 1e-15, 0.0], [2.0, 1.0, 0.0], [0.0, 0.5, 0.5]], dtype=torch.float64)
    cf = no_answer_where_tied(exact, outputs, outputs.argmax(-1))
    assert cf.tolist() == [TIED, 0, TIED]
    right, changed = units(task, torch.tensor([0, 1, 2]), cf, torch.tensor([1, 1, 1]), torch.tensor([5, 5, 5]))
    assert right.tolist() == [False] and changed.tolist() == [True]


def test_cli_options_and_refusals(capsys) -> None:
    assert main(["diff", "first", "--against", "first", "--lengths", "3,4", "--parts", "behaviour,alignment",
                 "--das-max-dim", "1", "--das-steps", "10", "--alignment-pairs", "16", "--no-untrained-baseline",
                 "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["alignment"] and all(r["untrained_iia_changed"] is None for r in result["alignment"])
    assert result["settings"]["das_steps"] == 10 and "probes" not in result
    assert main(["diff", "first", "--against", "first", "--das-steps", "0"]) == 2
    assert "--das-steps takes an integer >= 1, got 0" in capsys.readouterr().err


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


# ----------------------------------------------------------------------------- statistics and verdicts (issue 29)


def test_wilson_interval_covers_the_true_rate() -> None:
    """95 % Wilson intervals over simulated binomial trials cover the true rate in >= 93 % of them,
    at every rate and size a DAS row meets (including the edges where a Wald interval fails)."""
    from exactlens.analysis.diff.alignment.verdicts import wilson

    gen = torch.Generator().manual_seed(0)
    for n in (5, 13, 40, 200):
        for rate in (0.02, 0.3, 0.5, 0.9, 0.99):
            successes = torch.binomial(torch.full((2000,), float(n)), torch.full((2000,), rate), generator=gen)
            cover = [lo <= rate <= hi for lo, hi in (wilson(int(k), n) for k in successes)]
            assert sum(cover) / len(cover) >= 0.93, (n, rate, sum(cover) / len(cover))
    assert wilson(0, 0) is None
    lo, hi = wilson(62, 62)
    assert hi == 1.0 and 0.93 < lo < 0.95  # all right on 62 pairs: [0.94, 1.00]
    lo, hi = wilson(0, 10)
    assert lo == 0.0 and 0.27 < hi < 0.29


def test_pairs_split_words_disjointly() -> None:
    """No word of a test or validation pair occurs in any other split's pairs; a length with too few
    words only trains (and says so)."""
    from exactlens.analysis.diff.alignment.pairs import MIN_SPLIT_WORDS, make_pairs
    from exactlens.analysis.diff.alignment.variables import task_variables
    from exactlens.analysis.diff.runs import make_side, run_both

    model = build("parity", dtype="float64")
    task = tasks.of_model(model)
    side = make_side(model, {}, tasks.reader(model), model.cfg.readout_position, True)
    runs = run_both(task, [2, 3, 4, 6, 9], 64, 0, side, side)
    notes: dict = {}
    train, val, test = make_pairs(runs, task_variables(task), 64, 0, notes)
    assert notes["training_only_lengths"] == [2, 3] and 2 ** 3 < MIN_SPLIT_WORDS <= 2 ** 4
    for length in (4, 6, 9):
        words = []
        for split in (train, val, test):
            sets = [p for p in split if p.run.length == length]
            assert sets, length
            words.append({tuple(p.run.ids[i].tolist()) for p in sets for i in torch.cat([p.base, p.source])})
        assert not (words[0] & words[1]) and not (words[0] & words[2]) and not (words[1] & words[2]), length
        for p in (x for split in (train, val, test) for x in split if x.run.length == length):
            assert all(p.run.ids[b].tolist() != p.run.ids[s].tolist() for b, s in zip(p.base, p.source, strict=True))
    assert {p.run.length for p in val} == {p.run.length for p in test} == {4, 6, 9}


def _row(**changes) -> dict:
    row = {"variable": "x", "origin": "task", "site": "blocks.0.hook_attn_out", "position": "readout", "dim": 1,
           "iia_changed": 1.0, "iia_ci": [0.94, 1.0], "changed_pairs": 62, "do_nothing_iia": 0.0, "lift": 1.0,
           "random_iia_changed": 0.02, "random_iia_p95": 0.05, "converged": True, "validation_iia_changed": 1.0,
           "validation_iia": 1.0, "test": "interchange", "source_determined": 0.5}
    row.update(changes)
    return row


def test_row_verdicts() -> None:
    from exactlens.analysis.diff.alignment.verdicts import row_verdict

    assert row_verdict(_row(), 0.5, True, 0.99) == "computed"
    assert row_verdict(_row(), 0.5, False, 0.99) == "model does not solve the task"
    assert row_verdict(_row(), 1.0, True, 0.99) == "indistinguishable from the answer"
    assert row_verdict(_row(converged=False), 0.5, True, 0.99) == "unconverged"
    assert row_verdict(_row(illusion={"suspected": True}), 0.5, True, 0.99) == "illusion suspected"
    # few changed pairs: an interval too wide to lie above the random baseline
    assert row_verdict(_row(iia_ci=[0.34, 1.0], changed_pairs=12, random_iia_changed=0.4), 0.5, True, 0.99) \
        == "not found"
    # fewer than MIN_CHANGED_PAIRS: neither "computed" (all right on 3: [0.44, 1]) nor "not found" (0 of 3)
    assert row_verdict(_row(iia_ci=[0.44, 1.0], changed_pairs=3), 0.5, True, 0.99) == "too few pairs"
    assert row_verdict(_row(iia_changed=0.0, iia_ci=[0.0, 0.56], changed_pairs=3), 0.5, True, 0.99) == "too few pairs"
    assert row_verdict(_row(iia_ci=[0.72, 1.0], changed_pairs=10), 0.5, True, 0.99) == "computed"
    # the answer-determined verdict does not depend on the count
    assert row_verdict(_row(changed_pairs=3), 1.0, True, 0.99) == "indistinguishable from the answer"
    assert row_verdict(_row(iia_changed=0.6, iia_ci=[0.5, 0.7]), 0.5, True, 0.99) == "not found"
    assert row_verdict(_row(iia_changed=0.6, iia_ci=[0.5, 0.7], converged=False), 0.5, True, 0.99) == "unconverged"
    # no better than the best random subspaces
    assert row_verdict(_row(iia_changed=0.95, random_iia_p95=1.0, random_iia_changed=0.5), 0.5, True, 0.99) \
        == "not found"


def test_variable_verdict_lines() -> None:
    from exactlens.analysis.diff.alignment.verdicts import format_verdict_line, variable_verdicts

    sites = ["blocks.0.hook_attn_out", "blocks.0.hook_mlp_out", "blocks.1.hook_attn_out"]
    rows = [_row(site=sites[0], iia_changed=0.2, iia_ci=[0.1, 0.3], validation_iia_changed=0.2, verdict="not found"),
            _row(site=sites[2], verdict="computed"),
            # chosen on validation, not on test: the test IIA of this row is higher but its validation lower
            _row(site=sites[1], iia_changed=1.0, validation_iia_changed=0.5, verdict="computed")]
    v = variable_verdicts(rows, sites, "CLS")["x"]
    assert v["verdict"] == "computed" and v["site"] == sites[2], v
    line = format_verdict_line("first symbol", v)
    assert line == ("first symbol: computed at blocks.1.hook_attn_out [CLS] (k=1, IIA 1.00 [0.94, 1.00], 62 changed "
                    "pairs, lift 1.00, random p95 0.05)"), line
    # answer-determined: no site, unless its localization test finds it before the answer reaches the readout
    det = [_row(site=s, source_determined=1.0, verdict="indistinguishable from the answer") for s in sites]
    v = variable_verdicts(det, sites)["x"]
    assert v["verdict"] == "indistinguishable from the answer" and v["site"] is None, v
    assert "no site" not in format_verdict_line("x", v) and "at blocks" not in format_verdict_line("x", v)
    late = [_row(site=sites[0], source_determined=1.0, iia_changed=0.0, iia_ci=[0, 0.06], verdict="x"),
            _row(site=sites[2], source_determined=1.0, verdict="x")]
    local = _row(site=sites[1], source_determined=1.0, position="all", test="localization", verdict="computed")
    v = variable_verdicts(late + [local], sites)["x"]
    assert v["verdict"] == "computed" and v["site"] == sites[1] and v["position"] == "all", v
    local_late = dict(local, site=sites[2])
    v = variable_verdicts(late + [local_late], sites)["x"]
    assert v["verdict"] == "indistinguishable from the answer", v


# ----------------------------------------------------------------------------- the illusion check (issue 29)


def _planted_pairs():
    from planted import first_with_dormant_copy

    from exactlens.analysis.diff.alignment.pairs import make_pairs
    from exactlens.analysis.diff.alignment.variables import task_variables
    from exactlens.analysis.diff.runs import make_side, run_both

    model = first_with_dormant_copy()
    task = tasks.of_model(model)
    side = make_side(model, {}, tasks.reader(model), model.cfg.readout_position, True)
    runs = run_both(task, [5, 6, 7], 64, 0, side, side)
    return model, task, side, make_pairs(runs, task_variables(task), 96, 0)


def test_planted_dormant_and_disconnected_directions_are_an_illusion() -> None:
    """FIRST with a dormant copy head: at [CLS] after the first attention layer, Q = (w_1 copy + s)/sqrt 2
    swaps the answer on every changed pair, though the copy is read by nothing and s does not vary
    there; each part alone does nothing, so the check flags it. The AND at the first FFN's output (every
    position) is found by either part: not flagged."""
    from exactlens.analysis.diff import illusion
    from exactlens.analysis.diff.alignment.patch import Fit, Patcher, site_acts
    from exactlens.analysis.diff.alignment.score import score_group

    model, task, side, (train, _, test) = _planted_pairs()
    labels = list(model.cfg.residual_labels)
    d = model.cfg.d_model
    cases = [("blocks.0.hook_attn_out", "readout", [labels.index("w_1 copy"), labels.index("s")], True),
             ("blocks.0.hook_mlp_out", "all", [labels.index("I[w_i=1 & i=1]")], False)]
    for site, positions, dims, planted in cases:
        q = torch.zeros(d, 1, dtype=torch.float64)
        q[dims, 0] = 1.0 / len(dims) ** 0.5
        projector = (q @ q.T).unsqueeze(0)
        fit = Fit(0, 1, positions)
        cache: dict = {}
        full = score_group(task, side, site, [fit], test, projector, cache)[0]
        assert full["iia_changed"] == 1.0 and full["changed_units"] >= 25, full
        patcher = Patcher(side, site)
        acts = []
        for pset in train:
            x = site_acts(patcher, pset, cache)[0]["site"]
            acts.append(x[:, :1] if positions == "readout" else x)
        vary, read = illusion.varying_basis(acts), illusion.read_basis(model, site)
        parts = score_group(task, side, site, [fit, fit], test,
                            illusion.split_projectors(projector[0], vary, read), cache)
        check = illusion.verdict(full["iia_changed"], parts[0]["iia_changed"], parts[1]["iia_changed"], 0.9)
        assert check["suspected"] is planted, (site, check)
        if planted:
            assert check["iia_varying_part"] == 0.0 and check["iia_read_part"] == 0.0, check


def test_read_basis_follows_the_weights() -> None:
    from planted import first_with_dormant_copy

    from exactlens.analysis.diff import illusion

    model = first_with_dormant_copy()
    labels = list(model.cfg.residual_labels)
    copy, s = labels.index("w_1 copy"), labels.index("s")
    for site in ("blocks.0.hook_attn_out", "blocks.1.hook_resid_post"):
        read = illusion.read_basis(model, site)
        assert float(read[copy].norm()) < 1e-9, site  # nothing reads the copy
        assert abs(float(read[s].norm()) - 1.0) < 1e-9, site  # the unembedding reads s
    ln = build("first-ln", dtype="float64")
    read = illusion.read_basis(ln, "blocks.0.hook_attn_out")  # a norm downstream reads every centred direction
    assert torch.allclose(read @ torch.ones(ln.cfg.d_model, dtype=torch.float64),
                          torch.zeros(ln.cfg.d_model, dtype=torch.float64), atol=1e-12)


@pytest.mark.slow
@pytest.mark.parametrize("pairs", ["designed", "random"])
def test_planted_illusion_is_flagged_in_the_diff(pairs: str) -> None:
    """The whole diff of the planted model against `first`: every first-layer row at [CLS] that scores
    like a finding is "illusion suspected" (plain `first` has no such row), and no variable's line
    claims a first-layer site at [CLS]. Pairs designed from the exact circuit (every one changes the
    answer) make the illusion no easier to pass than random ones."""
    from planted import first_with_dormant_copy

    kwargs = dict(lengths=[4, 5, 6, 7], parts=("alignment",), das_max_dim=1, das_steps=60, alignment_pairs=48,
                  untrained_baseline=False, pairs=pairs)
    result = diff(first_with_dormant_copy(), "first", **kwargs)
    early = [r for r in result["alignment"] if r["site"].startswith("blocks.0.") and r["position"] == "readout"
             and (r["iia_changed"] or 0) >= 0.9]
    assert len(early) >= 3, [(r["variable"], r["site"], r["iia_changed"]) for r in result["alignment"]]
    assert all(r["verdict"] == "illusion suspected" for r in early), early
    for v in result["summary"]["verdicts"].values():
        # every position, or a position-resolved variable's own position 1 (the first FFN writes w_1 there)
        assert not (v["site"] or "").startswith("blocks.0.") or v["position"] == "all" or \
            (v["position"] == "at" and v["position_index"] == 1), v
    plain = diff("first", "first", **kwargs)
    assert not [r for r in plain["alignment"] if r["site"].startswith("blocks.0.") and r["position"] == "readout"
                and (r["iia_changed"] or 0) >= 0.9]
    assert all(r["verdict"] != "illusion suspected" for r in plain["alignment"])

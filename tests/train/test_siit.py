"""SIIT (exactlens.train.siit): a FIRST run whose mapped variables hold their counterfactuals and whose
unmapped components do nothing, the mapping recorded with the run, bad mappings refused in one line, and
the diff's mapped sites."""

from __future__ import annotations

import json

import pytest

from exactlens.errors import ExactLensError
from exactlens.train.siit_map import check_map, derive_map, read_map

FIRST_SIIT = dict(siit=True, epochs=300, strings_per_epoch=64, batch_size=64, train_length=(1, 8),
                  test_length=(1, 8), test_strings=200, lr=3e-3, eval_every=100, threads=1)
MAPPED = {"I[w_i=1 & i=1]": "blocks.0.hook_mlp_out", "s": "blocks.1.hook_attn_out"}


@pytest.fixture(scope="module")
def first_run(tmp_path_factory):
    from exactlens.train import train

    out = tmp_path_factory.mktemp("siit") / "first"
    return train("first", out=out, seed=0, **FIRST_SIIT)


def test_first_siit_holds_its_mapping(first_run):
    """300 Adam steps of 64 words (|w| <= 8): each mapped variable's interchange accuracy on held-out pairs
    is >= 0.95 (on all pairs and on those whose counterfactual changes the answer), and resampling any
    unmapped part of a component changes <= 5 % of the held-out decisions (measured: 1.0, 1.0 and 0.0)."""
    siit = first_run.info["siit"]
    assert {v: s["hook"] for v, s in siit["mapping"].items()} == MAPPED
    measured = siit["measured"]
    assert measured["held_out_pairs"] >= 500 and measured["word_disjoint"] is True
    for name, iia in measured["interchange"].items():
        assert iia["changed_pairs"] >= 100, name
        assert iia["iia"] >= 0.95 and iia["iia_changed"] >= 0.95, (name, iia)
    assert set(measured["resample_decision_change"]) == {"blocks.0.hook_attn_out", "blocks.0.hook_mlp_out",
                                                         "blocks.1.hook_attn_out", "blocks.1.hook_mlp_out"}
    assert measured["max_resample_decision_change"] <= 0.05
    # the output itself hardly moves either (total variation of the answer; measured: at most 0.004)
    assert set(measured["resample_output_change"]) == set(measured["resample_decision_change"])
    assert measured["max_resample_output_change"] <= 0.05
    assert measured["in_circuit_unmapped_resampled"] == {}
    assert first_run.final["test_accuracy"] >= 0.95
    from exactlens.verbs.train import train_text

    assert "; SIIT held-out: interchange accuracy >= " in train_text(first_run.info)


def test_a_model_trained_without_siit_is_the_contrast():
    """The same run without --siit solves the task, but swapping the mapped subspaces does not give the exact
    counterfactuals and resampling unmapped components moves its decisions (measured: interchange accuracy
    0.43 with 0.0 on changed pairs; resample changes up to 0.57): the numbers above are not vacuous."""
    from exactlens.train import train
    from exactlens.train.presets import get_preset
    from exactlens.train.siit import measure, siit_loss_of

    plain = {k: v for k, v in FIRST_SIIT.items() if k != "siit"}
    run = train("first", seed=0, **plain)
    assert run.final["test_accuracy"] >= 0.95 and "siit" not in run.info
    measured = measure(siit_loss_of(get_preset("first").spec(FIRST_SIIT)), run.model)
    assert max(v["iia_changed"] for v in measured["interchange"].values()) < 0.5
    assert measured["max_resample_decision_change"] > 0.2
    assert measured["max_resample_output_change"] > 0.2


def test_run_json_and_checkpoint_record_the_mapping(first_run):
    from exactlens.model import ExactTransformer

    info = json.loads((first_run.checkpoint / "run.json").read_text())
    siit = info["siit"]
    assert siit["construction"] == "first"
    assert siit["mapping"]["s"] == {"hook": "blocks.1.hook_attn_out", "positions": "readout", "dims": [1],
                                    "exact_site": "blocks.1.hook_resid_mid"}
    assert siit["circuit"]["edges"] and all({"edge", "sender", "receiver"} <= set(e) for e in siit["circuit"]["edges"])
    assert siit["weights"] == {"task": 1.0, "iit": 1.0, "strict": 1.0}
    assert info["options"]["siit"] is True
    model = ExactTransformer.load(first_run.checkpoint)
    assert model.cfg.metadata["siit"]["mapping"] == siit["mapping"]


def test_mapped_sites_of_verdicts(first_run):
    """diff's summary.verdicts[v] gain mapped_site / at_mapped_site on a SIIT model (unit level: the verdict
    lines as the alignment makes them)."""
    from exactlens.analysis.diff.siit_sites import with_mapped_sites

    lines = {"s": {"verdict": "computed", "site": "blocks.1.hook_resid_mid"},
             "I[w_i=1 & i=1]": {"verdict": "computed", "site": "blocks.0.hook_mlp_out"},
             "first_symbol": {"verdict": "not found", "site": None}}
    with_mapped_sites(lines, first_run.model)
    assert lines["s"]["mapped_site"] == "blocks.1.hook_attn_out" and lines["s"]["at_mapped_site"] is True
    assert lines["I[w_i=1 & i=1]"]["at_mapped_site"] is True
    lines["I[w_i=1 & i=1]"]["site"] = "blocks.1.hook_resid_mid"
    assert with_mapped_sites(lines, first_run.model)["I[w_i=1 & i=1]"]["at_mapped_site"] is False
    assert lines["first_symbol"]["mapped_site"] is None and lines["first_symbol"]["at_mapped_site"] is None
    at_position = {"I[w_i=1 & i=1]@1": {"verdict": "computed", "site": "blocks.0.hook_mlp_out"},
                   "I[w_i=1 & i=1]@x": {"verdict": "computed", "site": "blocks.0.hook_mlp_out"},
                   "s@2": {"verdict": "computed", "site": "blocks.1.hook_attn_out"}}
    with_mapped_sites(at_position, first_run.model)  # v@p takes v's mapping where v was trained at every position
    assert at_position["I[w_i=1 & i=1]@1"]["mapped_site"] == "blocks.0.hook_mlp_out"
    assert at_position["I[w_i=1 & i=1]@1"]["at_mapped_site"] is True
    assert at_position["I[w_i=1 & i=1]@x"]["mapped_site"] is None  # no position index: no variable of the run
    assert at_position["s@2"]["mapped_site"] is None  # s was trained at the readout position only
    plain = {"s": {"site": "blocks.1.hook_resid_mid"}}
    assert with_mapped_sites(plain, object()) == {"s": {"site": "blocks.1.hook_resid_mid"}}


@pytest.mark.slow
def test_diff_reports_the_mapped_sites(first_run):
    """The diff itself on the SIIT checkpoint (alignment only; ~5 min on a loaded 2-core machine). Measured:
    I[w_i=1 & i=1] computed at blocks.0.hook_mlp_out (its mapped site); s indistinguishable from the answer
    (FIRST's answer is s's sign: no site is claimed, at_mapped_site None)."""
    from exactlens import diff

    verdicts = diff(str(first_run.checkpoint), "first", lengths=[4, 5, 6, 7, 8], parts=("alignment",),
                    untrained_baseline=False)["summary"]["verdicts"]
    assert verdicts["I[w_i=1 & i=1]"]["mapped_site"] == "blocks.0.hook_mlp_out"
    assert verdicts["I[w_i=1 & i=1]"]["at_mapped_site"] is True
    assert verdicts["s"]["mapped_site"] == "blocks.1.hook_attn_out"
    assert verdicts["s"]["at_mapped_site"] in (True, None)


LIFTED = {"embed->L0.LN1", "pos->L0.LN1", "L0.LN1->L0.MLP", "L0.LN1->L0.LN2", "L0.MLP->L0.LN2", "L0.LN2->L1.H0",
          "L1.H0->L1.LN1", "L1.LN1->L1.LN2", "L1.LN2->output"}
"""FIRST's exact circuit (no layer norm: embed, pos -> L0.MLP -> L1.H0 -> output, embed, pos -> L1.H0) on the
post-LN preset's graph: the edges on a chain through norms that joins two components the circuit joins."""


def test_the_recorded_circuit_lifts_onto_a_post_ln_graph(first_run):
    from exactlens.analysis.circuit.graph import model_graph
    from exactlens.analysis.circuit.recorded import lifted, recorded_circuit, recorded_siit

    siit = recorded_siit(first_run.model)
    edges = [(e["edge"], tuple(e["features"]), e["through_norm"]) for e in siit["circuit"]["edges"]]
    assert {e[0] for e in edges} == {"embed->L0.MLP", "pos->L0.MLP", "embed->L1.H0", "pos->L1.H0", "L0.MLP->L1.H0",
                                     "L1.H0->output"}
    circuit = lifted(first_run.model, model_graph(first_run.model, "head"), edges, [])
    assert {c.edge.name for c in circuit.edges} == LIFTED  # L0.H0, L1.MLP and the L0.LN2 -> L1.LN1 chain are out
    # qkv: the construction's circuit read again (L1.H0's query, key and value all read the L0.LN2 stream)
    qkv = recorded_circuit(first_run.model, siit, model_graph(first_run.model, "qkv"), [])
    assert {c.edge.name for c in qkv.edges} == (LIFTED - {"L0.LN2->L1.H0"}) | {f"L0.LN2->L1.H0.{s}" for s in "qkv"}
    with pytest.raises(ExactLensError, match="node L2.H0 is not a node"):
        lifted(first_run.model, model_graph(first_run.model, "head"), [("L2.H0->output", (), False)], [])


def test_discover_scores_a_siit_checkpoint_against_its_recorded_circuit(first_run):
    """discover without --against: the SIIT checkpoint's recorded circuit is the ground truth (AUROC, CPR/CMD
    with the recorded circuit's own curve beside); at qkv granularity the construction's circuit is read again;
    the same weights without the record are not scored."""
    from exactlens import discover
    from exactlens.model import ExactTransformer

    found = discover(str(first_run.checkpoint), "patching", lengths=[3, 4, 5], words=16)
    assert found["truth"]["source"] == "siit" and found["truth"]["construction"] == "first"
    assert found["truth"]["granularity"] == "head" and found["truth"]["scored"] is True
    score = found["score"]
    assert score["n_positive"] + score["n_constant"] == len(LIFTED)
    assert score["edge_auroc"] is not None and found["exact_circuit"]["cpr"] is not None
    assert found["cpr"] is not None
    qkv = discover(str(first_run.checkpoint), "eap", granularity="qkv", lengths=[3, 4, 5], words=16, metrics="auroc")
    assert qkv["truth"]["granularity"] == "qkv" and qkv["score"]["n_positive"] > 0
    plain = ExactTransformer.load(first_run.checkpoint)
    del plain.cfg.metadata["siit"]
    bare = discover(plain, "patching", lengths=[3, 4, 5], words=16, metrics="auroc")
    assert "score" not in bare and "truth" not in bare
    position = discover(str(first_run.checkpoint), "eap", granularity="position", lengths=[4], words=16,
                        metrics="auroc")
    assert position["truth"]["scored"] is False and "score" not in position


# ---- bad mappings: one line each ---------------------------------------------------------------------------

VARIABLES = {"I[w_i=1 & i=1]": 1, "s": 1}


def _check(mapping):
    return check_map(mapping, VARIABLES, n_layers=2, has_mlp=True, d_model=16)


@pytest.mark.parametrize("mapping, message", [
    ({"s": {"hook": "blocks.2.hook_attn_out", "positions": "all", "dims": [0]}},
     "unknown hook 'blocks.2.hook_attn_out'"),
    ({"s": {"hook": "blocks.0.hook_resid_post", "positions": "all", "dims": [0]}}, "unknown hook"),
    ({"s": {"hook": "blocks.1.hook_attn_out", "positions": "all", "dims": [16]}}, "dimension 16 is out of range"),
    ({"s": {"hook": "blocks.1.hook_attn_out", "positions": "all", "dims": [-1]}}, "dimension -1 is out of range"),
    ({"x": {"hook": "blocks.1.hook_attn_out", "positions": "all", "dims": [0]}}, "unknown variable 'x'"),
    ({"s": {"hook": "blocks.1.hook_attn_out", "positions": "all", "dims": [3]},
      "I[w_i=1 & i=1]": {"hook": "blocks.1.hook_attn_out", "positions": "all", "dims": [3]}}, "overlap at"),
    ({"s": {"hook": "blocks.1.hook_attn_out", "positions": "first", "dims": [0]}}, "positions must be"),
    ({"s": {"hook": "blocks.1.hook_attn_out", "positions": "all", "dims": [0, 1]}}, "has 1 dimension"),
    ({"s": {"hook": "blocks.1.hook_attn_out", "positions": "all", "dims": []}}, "non-empty list"),
    ({}, "maps no variable"),
])
def test_bad_mappings_are_refused_in_one_line(mapping, message):
    with pytest.raises(ExactLensError, match=message) as err:
        _check(mapping)
    assert "\n" not in str(err.value)


def test_a_variable_mapped_twice_in_the_file_is_refused(tmp_path):
    path = tmp_path / "map.json"
    path.write_text('{"s": {"hook": "blocks.1.hook_attn_out", "positions": "all", "dims": [0]},\n'
                    ' "s": {"hook": "blocks.1.hook_mlp_out", "positions": "all", "dims": [1]}}')
    with pytest.raises(ExactLensError, match="variable 's' is mapped twice"):
        read_map(str(path))
    with pytest.raises(ExactLensError, match="no file"):
        read_map(str(tmp_path / "missing.json"))


def test_the_same_dims_at_two_hooks_are_allowed_and_the_default_blocks_are_disjoint():
    ok = _check({"s": {"hook": "blocks.1.hook_attn_out", "positions": "readout", "dims": [0]},
                 "I[w_i=1 & i=1]": {"hook": "blocks.0.hook_mlp_out", "positions": "all", "dims": [0]}})
    assert set(ok) == set(VARIABLES)
    derived = derive_map([("a", "blocks.0.hook_resid_post", "all", 2), ("b", "blocks.1.hook_resid_mid", "readout", 1)],
                         16, has_mlp=True)
    assert derived["a"]["hook"] == "blocks.0.hook_mlp_out" and derived["a"]["dims"] == [0, 1]
    assert derived["b"]["hook"] == "blocks.1.hook_attn_out" and derived["b"]["dims"] == [2]
    with pytest.raises(ExactLensError, match="need 3 coordinates"):
        derive_map([("a", "blocks.0.hook_resid_post", "all", 3)], 2, has_mlp=True)


def test_a_bad_map_file_stops_train_before_training(tmp_path):
    from exactlens.train import train

    path = tmp_path / "map.json"
    path.write_text(json.dumps({"s": {"hook": "blocks.1.hook_attn_out", "positions": "readout", "dims": [99]}}))
    with pytest.raises(ExactLensError, match="siit_map: 's': dimension 99 is out of range"):
        train("first", siit_map=str(path), **{**FIRST_SIIT, "epochs": 1})
    with pytest.raises(ExactLensError, match="siit_map applies with siit"):
        train("first", siit_map=str(path), epochs=1)


def test_cli_siit_map_error_is_one_line(tmp_path, capsys):
    from exactlens.cli import main

    path = tmp_path / "map.json"
    path.write_text(json.dumps({"s": {"hook": "blocks.9.hook_attn_out", "positions": "readout", "dims": [1]}}))
    code = main(["train", "first", "--siit", "--siit-map", str(path), "--train-length", "1:8", "--test-length", "1:8",
                 "--epochs", "1", "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "unknown hook 'blocks.9.hook_attn_out'" in err[0]
    assert not (tmp_path / "run").exists()


def test_lbfgs_is_refused_and_regression_answers_match_within_a_tolerance():
    """Regression tasks (Shin & Matzinger's pairs) train like the others; their answers count as the same
    within REGRESSION_TOLERANCE of the held-out answers' RMS (0 for discrete answers)."""
    from types import SimpleNamespace

    import torch

    from exactlens import tasks
    from exactlens.train import train
    from exactlens.train.siit import REGRESSION_TOLERANCE, regression_tolerance

    with pytest.raises(ExactLensError, match="use optimizer 'adam'"):
        train("first", optimizer="lbfgs", **{**FIRST_SIIT, "epochs": 1})
    run = SimpleNamespace(truth=torch.tensor([[3.0, float("nan")], [-4.0, 0.0], [99.0, 99.0]]))
    pairs = [SimpleNamespace(run=run, base=torch.tensor([0, 1]))]
    rms = (25.0 / 3) ** 0.5  # 3, -4 and 0 (the NaN of an undefined position left out; word 2 is no base)
    assert regression_tolerance(tasks.get("pairs"), pairs) == pytest.approx(REGRESSION_TOLERANCE * rms)
    assert regression_tolerance(tasks.get("first"), pairs) == 0.0


def test_stacked_seeds_train_as_their_single_runs():
    """--seeds with --siit: the runs are computed together (the hooks mapped over the run axis) and run 0
    trains as its single run (the same pairs per step; summation order aside)."""
    from exactlens.train import train, train_many

    short = {**FIRST_SIIT, "epochs": 20, "eval_every": 20}
    runs = train_many("first", [0, 1], **short)
    one = train("first", seed=0, **short)
    assert all(r.info["siit"]["mapping"] == one.info["siit"]["mapping"] for r in runs)
    assert runs[0].history[-1]["train_loss_bits"] == pytest.approx(one.history[-1]["train_loss_bits"], rel=1e-3)
    assert runs[1].history[-1]["train_loss_bits"] != pytest.approx(one.history[-1]["train_loss_bits"], rel=1e-3)


def test_components_of_the_exact_circuit_without_a_variable_are_not_resampled():
    """tracr-hist's layer-0 attention is in the exact circuit (its selector width feeds the MLP), but the label it
    writes is read and then overwritten by that MLP (the inside of the compiled primitive): it is not mapped and
    strictness leaves it alone (resampling it would forbid the count); so does it dyck1's last FFN, where a trained
    model computes the construction's decision rule."""
    from exactlens.train.presets import get_preset
    from exactlens.train.siit import ground_truth, high_level

    hist = ground_truth(high_level(get_preset("tracr-hist").spec({"train_length": (1, 5), "test_length": (1, 5)})))
    assert hist["in_circuit_unmapped"] == ["blocks.0.hook_attn_out"] and hist["unmapped_components"] == []
    assert {s["hook"] for s in hist["mapping"].values()} == {"blocks.0.hook_mlp_out"}
    circuit = high_level(get_preset("tracr-hist").spec({"train_length": (1, 5), "test_length": (1, 5)}))
    assert [s["variable"] for s in circuit.skipped if "overwritten" in s["reason"]] == [
        "hist_2_selector_width_attn_output"]
    dyck = ground_truth(high_level(get_preset("dyck1").spec({"train_length": (1, 8), "test_length": (1, 8)})))
    assert dyck["in_circuit_unmapped"] == ["blocks.1.hook_mlp_out"]  # computes Dyck's decision rule
    first = ground_truth(high_level(get_preset("first").spec({"train_length": (1, 8), "test_length": (1, 8)})))
    assert first["unmapped_components"] == ["blocks.0.hook_attn_out", "blocks.1.hook_mlp_out"]
    assert first["in_circuit_unmapped"] == [] and "L1.H0->output" in [e["edge"] for e in first["circuit"]["edges"]]

"""MIB-style scoring of circuit discovery: faithfulness curves with CPR and CMD, EAP-IG, zero
ablation, exact edge patching, and circuits written and read in MIB's circuit file format."""

from __future__ import annotations

import json

import pytest
import torch

from exactlens.analysis.circuit.ablation import check_circuit, mark_constant
from exactlens.analysis.circuit.discovery import discover
from exactlens.analysis.circuit.evaluate import discover_report, truth_ranking, word_batches
from exactlens.analysis.circuit.faithfulness import (
    SIZES,
    DivergenceCache,
    area,
    faithfulness,
    ranked,
    size_counts,
)
from exactlens.analysis.circuit.graph import model_graph
from exactlens.analysis.circuit.mib import from_mib, mib_edges, to_mib
from exactlens.analysis.circuit.scoring import score_discovery
from exactlens.analysis.circuit.truth import derive_circuit
from exactlens.constructions.registry import build
from exactlens.errors import ExactLensError

SETUP = {"parity": [2, 3, 4], "first": [1, 2, 3], "dyck1": [2, 4, 6], "one": [1, 2, 3]}


def _setup(name: str, granularity: str = "qkv", ablation: str = "resample"):
    model = build(name, dtype="float64")
    graph = model_graph(model, granularity)
    batches = word_batches(model, graph, SETUP[name], 16, ablation=ablation)
    circuit = mark_constant(derive_circuit(model, granularity), batches, model)
    return model, graph, batches, circuit


def test_area_and_size_counts():
    assert area([0, 1], [1, 1]) == 1.0 and area([0, 0.5, 1], [0, 1, 1]) == 0.75
    assert area([0, 0, 1], [0, 1, 1]) == 1.0  # a repeated x adds nothing: the jump is vertical
    assert size_counts(61) == [0, 0, 0, 0, 1, 3, 6, 12, 30, 61]
    assert size_counts(10, [0.5, 1.0]) == [5, 10]  # 0.5 * 10 is 5, not 4.999...


@pytest.mark.parametrize("ablation", ["resample", "mean", "zero"])
def test_empty_and_full_circuits_give_0_and_1(ablation):
    model, graph, batches, circuit = _setup("parity", ablation=ablation)
    cache = DivergenceCache(model, graph, batches)
    curve = faithfulness(cache, ranked(graph, truth_ranking(circuit)), sizes=[0.0, 1.0])
    assert curve.counts == [0, len(graph.edges)] and curve.f == [0.0, 1.0]
    assert curve.divergence_empty > 0 and curve.cpr == 0.5 and curve.cmd == 0.5


@pytest.mark.parametrize(("name", "ablation"), [("parity", "resample"), ("parity", "zero"), ("first", "resample"),
                                                ("one", "zero")])
def test_the_exact_circuit_is_maximally_faithful_where_it_fits(name, ablation):
    """Where the ablation leaves the exact circuit sufficient, f = 1 at every size that keeps all of
    it (the most f can be: f = 1 - D(C) / D(empty) and D >= 0), so over those sizes its CPR is 1 and
    its CMD 0, and no method's curve lies above it; at smaller sizes a method that orders the circuit's
    own edges well may recover part of the behaviour where the unordered circuit recovers none."""
    model, graph, batches, circuit = _setup(name, ablation=ablation)
    assert check_circuit(model, circuit, batches).outside_changed == 0
    cache = DivergenceCache(model, graph, batches)
    need = len(circuit.edges)
    fits = [s for s, n in zip(SIZES, size_counts(len(graph.edges)), strict=True) if n >= need]
    exact = faithfulness(cache, ranked(graph, truth_ranking(circuit)), sizes=fits)
    assert exact.f == [1.0] * len(fits) and exact.cpr == 1.0 and exact.cmd == 0.0
    for method in ("patching", "eap", "acdc"):
        curve = faithfulness(cache, ranked(graph, discover(model, graph, batches, method).edge_scores), sizes=fits)
        assert all(f <= 1.0 for f in curve.f) and curve.cpr <= exact.cpr and curve.cmd >= exact.cmd
    # the reverse ranking (the circuit last) is the worst: f < 1 until every edge is kept
    worst = {e: -v for e, v in truth_ranking(circuit).items()}
    reverse = faithfulness(cache, [e for e in reversed(ranked(graph, worst))], sizes=fits)
    assert reverse.cpr < exact.cpr


def test_undefined_faithfulness_is_said_not_divided():
    model, graph, batches, _ = _setup("one")
    cache = DivergenceCache(model, graph, batches)
    cache.values[frozenset()] = 0.0  # an ablation that moves nothing the readout sees
    curve = faithfulness(cache, list(graph.edges))
    assert curve.f is None and curve.cpr is None and curve.cmd is None
    assert "undefined" in curve.reason and curve.to_dict()["faithfulness_undefined"] == curve.reason
    assert all(p["f"] is None for p in curve.to_dict()["faithfulness"])
    cache.values[frozenset()] = float("nan")  # a layer norm of a zero stream
    assert "not finite" in faithfulness(cache, list(graph.edges)).reason


@pytest.mark.parametrize("ablation", ["resample", "mean", "zero"])
@pytest.mark.parametrize("name", ["parity", "dyck1"])
def test_eap_ig_with_one_step_is_eap(name, ablation):
    model, graph, batches, _ = _setup(name, ablation=ablation)
    eap = discover(model, graph, batches, "eap").edge_scores
    for method in ("eap-ig-inputs", "eap-ig-activations"):
        assert discover(model, graph, batches, method, ig_steps=1).edge_scores == eap
    # more steps integrate along the path: the scores move where the model is not linear in its inputs
    assert discover(model, graph, batches, "eap-ig-activations", ig_steps=4).edge_scores != eap


@pytest.mark.parametrize("method", ["eap-ig-inputs", "eap-ig-activations", "edge-patching"])
def test_new_methods_recover_parity(method):
    """Measured: like EAP and ACDC, EAP-IG and exact edge patching recover PARITY's circuit (AUROC 1,
    precision and recall 1 at their own cut) under resample ablation."""
    model, graph, batches, circuit = _setup("parity")
    score = score_discovery(discover(model, graph, batches, method), circuit)
    assert score.edge_auroc == 1.0 and score.precision == 1.0 and score.recall == 1.0


@pytest.mark.parametrize("name", ["parity", "first", "one", "dyck1"])
def test_zero_ablation_keeps_the_exact_circuit_sufficient(name):
    model, graph, batches, circuit = _setup(name, "head", "zero")
    assert all(torch.count_nonzero(b.source["L0.H0"]) == 0 for b in batches)
    assert check_circuit(model, circuit, batches).outside_changed == 0


# ---- MIB's circuit file format ---------------------------------------------------------------------


@pytest.mark.parametrize("granularity", ["head", "qkv"])
@pytest.mark.parametrize("name", ["parity", "first", "one", "sm-solution1"])
def test_mib_round_trip(name, granularity):
    model = build(name, dtype="float64")
    circuit = derive_circuit(model, granularity)
    graph = circuit.graph
    scores = {e: 0.5 + i for i, e in enumerate(graph.edges)}
    data = json.loads(json.dumps(to_mib(model, graph, set(circuit.edge_set), scores)))
    n_layers, n_heads = model.cfg.n_layers, model.cfg.n_heads
    assert data["cfg"] == {"n_layers": n_layers, "n_heads": n_heads, "parallel_attn_mlp": False,
                           "d_model": model.cfg.d_model}
    assert len(data["edges"]) == len(mib_edges(n_layers, n_heads))
    assert all(set(v) == {"score", "in_graph"} for v in data["edges"].values())
    selected, read_scores, has_scores = from_mib(data, model, graph)
    assert has_scores and selected == set(circuit.edge_set) and read_scores == pytest.approx(scores)
    assert to_mib(model, graph, selected, read_scores) == data
    # without our extra block (another tool's file), embed and pos share MIB's input
    data.pop("exactlens")
    plain, _, _ = from_mib(data, model, graph)
    assert set(circuit.edge_set) <= plain
    assert {(e.receiver, e.slot) for e in plain} == {(e.receiver, e.slot) for e in circuit.edge_set}


def test_scoring_a_circuit_file(tmp_path):
    from exactlens.cli import main

    exact = tmp_path / "exact.json"
    assert main(["circuit", "parity", "--granularity", "qkv", "--lengths", "2", "3", "--out", str(exact),
                 "--json"]) == 0
    report = discover_report("parity", "acdc", granularity="qkv", lengths=[2, 3, 4], words=16,
                             score_file=str(exact))
    assert report["method"] == "file" and report["details"]["score_file"] == str(exact)
    assert report["score"]["edge_auroc"] == 1.0 and report["score"]["precision"] == 1.0
    # the file holds no order inside the circuit: its constant edges rank with the rest of it, so it is
    # whole (f = 1) from the size that keeps all 11 edges, where the observable-first ranking needs 6
    assert all(p["f"] == 1.0 for p in report["faithfulness"] if p["n_edges"] >= 11)
    assert report["cpr"] <= report["exact_circuit"]["cpr"]
    found = tmp_path / "eap.json"
    eap = discover_report("parity", "eap", granularity="qkv", lengths=[2, 3, 4], words=16, out=str(found))
    again = discover_report("parity", "eap", granularity="qkv", lengths=[2, 3, 4], words=16, score_file=str(found))
    assert again["selected"] == eap["selected"] and again["score"]["edge_auroc"] == eap["score"]["edge_auroc"]
    with pytest.raises(ExactLensError, match="exists"):
        discover_report("parity", "eap", lengths=[2], words=4, out=str(found))


def _bad(tmp_path, data, model_name="parity"):
    path = tmp_path / "bad.json"
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    with pytest.raises(ExactLensError) as err:
        discover_report(model_name, "eap", granularity="qkv", lengths=[2], words=4, score_file=str(path))
    message = str(err.value)
    assert "\n" not in message
    return message


def test_bad_circuit_files_are_refused_naming_the_first_bad_edge(tmp_path):
    model = build("parity", dtype="float64")
    good = to_mib(model, model_graph(model, "qkv"), set())
    assert "not JSON" in _bad(tmp_path, "{nope")
    assert "'edges' object" in _bad(tmp_path, {"nodes": {}})
    assert "3 layers x 2 heads" in _bad(tmp_path, {**good, "cfg": {**good["cfg"], "n_layers": 3}})
    cases = [
        ("input->a0.h0", {"score": 1.0, "in_graph": True}, "<q>, <k> or <v>"),
        ("input->a7.h0<q>", {"score": 1.0, "in_graph": False}, "no node 'a7.h0'"),
        ("a1.h0->a0.h0<q>", {"score": 1.0, "in_graph": False}, "does not read"),
        ("a0.h0->a0.h1<v>", {"score": 1.0, "in_graph": False}, "does not read"),
        ("input->m0", {"score": "high", "in_graph": True}, "finite number"),
        ("input->m0", {"score": 1.0}, "in_graph"),
        ("input=>m0", {"score": 1.0, "in_graph": True}, "SENDER->RECEIVER"),
    ]
    for name, entry, what in cases:
        edges = {"input->logits": {"score": 0.0, "in_graph": False}, name: entry, "m0->logits": entry}
        message = _bad(tmp_path, {**good, "edges": edges})
        assert f"edge {name!r}" in message and what in message
    # an edge the model lacks may be written out of the circuit, never in it (majority has no MLP)
    majority = build("majority", dtype="float64")
    lacking = to_mib(majority, model_graph(majority, "qkv"), set())
    assert lacking["edges"]["input->m0"] == {"score": 0.0, "in_graph": False}
    lacking["edges"]["input->m0"]["in_graph"] = True
    message = _bad(tmp_path, lacking, "majority")
    assert "edge 'input->m0' is in the circuit" in message and "L0.MLP" in message


def test_post_ln_models_cannot_be_written():
    model = build("first-ln", dtype="float64")
    with pytest.raises(ExactLensError, match="no layer-norm nodes"):
        to_mib(model, model_graph(model, "head"), set())


def test_cli_metrics_and_json_fields(capsys):
    from exactlens.cli import main

    assert main(["discover", "one", "--method", "eap-ig-inputs", "--ig-steps", "3", "--metrics", "auroc,cpr",
                 "--lengths", "1", "2", "3", "--words", "8", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["metrics"] == ["auroc", "cpr"] and out["details"]["ig_steps"] == 3
    assert [p["size"] for p in out["faithfulness"]] == list(SIZES) and out["cpr"] is not None
    assert {"cpr", "cmd", "faithfulness"} <= set(out["exact_circuit"])
    assert main(["discover", "one", "--metrics", "auroc", "--lengths", "1", "2", "--words", "8", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert "faithfulness" not in out and "score" in out
    assert main(["discover", "one", "--metrics", "f1"]) == 2


# ---- the ACDC paper's threshold sweep ------------------------------------------------------------------


def test_sweep_auc_and_points():
    from exactlens.analysis.circuit.discovery import Discovery
    from exactlens.analysis.circuit.sweep import sweep_auc, sweep_points

    assert sweep_auc([]) == 0.5 and sweep_auc([(0.0, 1.0)]) == 1.0 and sweep_auc([(0.5, 0.5)]) == 0.5
    assert sweep_auc([(0.0, 0.5)]) == 0.75
    model, graph, batches, circuit = _setup("parity", "head")
    observable = {c.edge for c in circuit.edges if not c.constant}

    def run(selected, threshold):
        return Discovery("acdc", "head", {}, {}, set(selected), threshold)

    runs = [run(observable, 1.0), run(set(graph.edges), 0.0)]
    exact = sweep_points(runs, graph, circuit)
    assert exact.edge_points == [(0.0, 1.0), (1.0, 1.0)] and exact.edge_auc == 1.0 and exact.node_auc == 1.0
    # counted the ACDC paper's way, the constant circuit edges are positives the runs missed
    counted = sweep_points(runs, graph, circuit, count_constant=True)
    share = len(observable) / len(circuit.edges)
    assert counted.edge_points[0] == (0.0, share) and counted.edge_auc == pytest.approx((share + 1) / 2)


@pytest.mark.slow
def test_the_acdc_tracr_table_runs(tmp_path):
    """The ACDC paper's tracr programs compile with its settings; on proportion the circuit read off the
    weights is the paper's canonical one (its code lists these 7 edges as TransformerLens hooks), and
    zero ablation leaves every edge movable while resample ablation on words of one length cannot move
    the query and key reads."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    out = tmp_path / "acdc.json"
    subprocess.run([sys.executable, str(root / "benchmarks" / "acdc_tracr_table.py"), "--quick", "--out", str(out)],
                   check=True, cwd=root, env={**__import__("os").environ, "PYTHONPATH": str(root / "src")})
    rows = {(r["task"], r["ablation"]): r for r in json.loads(out.read_text())["rows"]}
    paper_proportion = {"embed->L0.MLP", "L0.MLP->L1.H0.v", "embed->L1.H0.q", "pos->L1.H0.q", "embed->L1.H0.k",
                        "pos->L1.H0.k", "L1.H0->output"}
    assert set(rows["proportion", "zero"]["circuit"]) == paper_proportion
    assert rows["proportion", "zero"]["constant"] == []
    assert set(rows["proportion", "resample"]["constant"]) == {e for e in paper_proportion if ".H0.q" in e or
                                                              ".H0.k" in e}
    assert rows["reverse", "zero"]["n_edges"] == 94 and rows["reverse", "zero"]["circuit_edges"] == 15


@pytest.mark.parametrize("name", ["first-ln", "sm-solution2"])
def test_acdc_matches_an_equivalent_circuit_without_the_redundant_paths(name):
    """Measured: where ACDC misses the weight circuit's redundant paths (post-LN skips, sm-solution2's
    embed -> FFN), the circuit without them is still sufficient, and ACDC's circuit is exactly it."""
    report = discover_report(name, "acdc", words=32, metrics="auroc")
    eq = report["equivalent"]
    assert report["score"]["recall"] < 1.0 and eq["candidates"]["weights"]["f1"] < 1.0
    assert eq["best"] == "without redundant edges" and eq["candidates"][eq["best"]]["f1"] == 1.0
    smaller = set(eq["candidates"][eq["best"]]["edges"])
    assert smaller < set(eq["candidates"]["weights"]["edges"])
    model = build(name, dtype="float64")
    graph = model_graph(model, "head")
    batches = word_batches(model, graph, None, 32)
    circuit = mark_constant(derive_circuit(model, "head"), batches, model)
    outside = [e for e in graph.edges if e.name not in smaller]
    from exactlens.analysis.circuit.ablation import changed_words

    assert all(int(changed_words(model, graph, b, outside).sum()) == 0 for b in batches)
    assert {e.edge.name for e in circuit.edges} == set(eq["candidates"]["weights"]["edges"])


def test_a_circuit_without_redundancy_has_one_valid_form():
    report = discover_report("parity", "acdc", lengths=[2, 3, 4], words=16, metrics="auroc")
    assert list(report["equivalent"]["candidates"]) == ["weights"] and report["equivalent"]["best"] == "weights"

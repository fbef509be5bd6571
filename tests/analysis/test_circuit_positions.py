"""Position-resolved edges (one edge per token position, as auto-circuit scores circuits) and
equivalent circuits from swappable heads."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from exactlens.analysis.circuit.ablation import check_circuit
from exactlens.analysis.circuit.discovery import discover
from exactlens.analysis.circuit.equivalent import best_match, swap_edges, swappable_heads, valid_circuits
from exactlens.analysis.circuit.evaluate import discover_report, edge_graph, exact_circuit, word_batches
from exactlens.analysis.circuit.faithfulness import SIZES, DivergenceCache, faithfulness, ranked, size_counts
from exactlens.analysis.circuit.forward import run_graph
from exactlens.analysis.circuit.graph import EDGE_GRANULARITIES, Edge, model_graph
from exactlens.analysis.circuit.mib import to_mib
from exactlens.analysis.circuit.scoring import score_discovery
from exactlens.analysis.circuit.truth import derive_circuit
from exactlens.constructions.registry import build
from exactlens.errors import ExactLensError


def _position_setup(name: str, ablation: str = "resample", lengths=None, words: int = 32):
    model = build(name, dtype="float64")
    graph, lengths = edge_graph(model, "position", lengths)
    batches = word_batches(model, graph, lengths, words, ablation=ablation)
    return model, graph, batches, exact_circuit(model, graph, batches)


def test_granularities_are_declared_once():
    from exactlens.analysis.circuit.request import EDGE_GRANULARITIES as declared

    assert declared == EDGE_GRANULARITIES


def test_position_edges_are_named_and_parsed():
    edge = Edge("L0.MLP", "L1.H0", "v", 3)
    assert edge.name == "L0.MLP->L1.H0.v@3" and Edge.parse(edge.name) == edge and edge.whole == Edge("L0.MLP", "L1.H0",
                                                                                                       "v")
    assert Edge.parse("embed->output@0") == Edge("embed", "output", None, 0)
    with pytest.raises(ExactLensError, match="whole number"):
        Edge.parse("embed->output@x")
    model = build("first")
    graph = model_graph(model, "position", 5)
    assert len(graph.edges) == 5 * len(model_graph(model, "qkv").edges)
    with pytest.raises(ExactLensError, match="number of token positions"):
        model_graph(model, "position")


@pytest.mark.parametrize("ablation", ["resample", "zero"])
@pytest.mark.parametrize("name", ["parity", "dyck1"])
def test_patching_every_position_of_an_edge_is_patching_the_edge(name, ablation):
    """The position-resolved forward agrees with the qkv one: an edge patched at every position is the
    whole edge patched, and patching some positions only moves the outputs by part of it."""
    model, graph, batches, _ = _position_setup(name, ablation, words=8)
    qkv = model_graph(model, "qkv")
    batch = batches[0]
    for whole in qkv.edges[::7]:
        split = [Edge(whole.sender, whole.receiver, whole.slot, p) for p in range(graph.n_positions)]
        a = run_graph(model, graph, batch.tokens, batch.n_positions, patched=split, source=batch.source).logits
        b = run_graph(model, qkv, batch.tokens, batch.n_positions, patched=[whole], source=batch.source).logits
        assert torch.equal(a, b)
    unpatched = run_graph(model, graph, batch.tokens, batch.n_positions).logits
    assert torch.equal(unpatched, batch.clean.logits)


def test_firsts_circuit_per_position_as_stated_by_hand():
    """FIRST (Chiang & Cholak): the FFN at the first symbol (position 1) computes I[w_1 = 1]; the
    layer-1 head's query at [CLS] (position 0) attends to position 1 and reads it; the output reads
    [CLS]. Under resample ablation the position and [CLS] reads are the same for every word, so the
    observable circuit is three edges at two positions; under zero ablation the reads of the
    position-1 indicator join (at position 1 only: it is 0 elsewhere) and [CLS]'s query."""
    _, _, batches, circuit = _position_setup("first")
    assert {c.edge.name for c in circuit.edges if not c.constant} == {
        "embed->L0.MLP@1", "L0.MLP->L1.H0.v@1", "L1.H0->output@0"}
    n_pos = batches[0].tokens.shape[1]
    assert {c.edge.name for c in circuit.edges if c.edge.sender == "pos" and c.edge.slot == "k"} == {
        f"pos->L1.H0.k@{p}" for p in range(n_pos)}  # keys are read at every position [CLS] sees
    model, _, batches, zero = _position_setup("first", "zero")
    assert {c.edge.name for c in zero.edges if not c.constant} == {
        "embed->L0.MLP@1", "pos->L0.MLP@1", "embed->L1.H0.q@0", "pos->L1.H0.k@1", "pos->L1.H0.v@1",
        "L0.MLP->L1.H0.v@1", "L1.H0->output@0"}
    assert check_circuit(model, zero, batches).outside_changed == 0


@pytest.mark.parametrize(("name", "ablation"), [("first", "resample"), ("parity", "resample"), ("parity", "zero"),
                                                ("dyck1", "mean"), ("one", "zero"), ("induction-recent", "resample")])
def test_the_position_circuit_is_sufficient(name, ablation):
    model, graph, batches, circuit = _position_setup(name, ablation, words=16)
    check = check_circuit(model, circuit, batches)
    assert check.outside_changed == 0
    qkv = {c.edge for c in derive_circuit(model, "qkv").edges}
    assert {c.edge.whole for c in circuit.edges} <= qkv  # a refinement of the qkv circuit


@pytest.mark.parametrize("method", ["eap", "edge-patching", "acdc"])
def test_methods_recover_firsts_position_circuit(method):
    """Measured: EAP, exact edge patching and ACDC find FIRST's three observable edges among 144 (AUROC
    1, precision and recall 1 at their own cut); node patching cannot tell positions apart."""
    model, graph, batches, circuit = _position_setup("first")
    score = score_discovery(discover(model, graph, batches, method), circuit)
    assert (score.n_positive, score.edge_auroc, score.precision, score.recall) == (3, 1.0, 1.0, 1.0)
    patching = score_discovery(discover(model, graph, batches, "patching"), circuit)
    assert patching.edge_auroc < 1.0 and patching.precision < 0.1


def test_the_exact_position_circuit_is_maximally_faithful():
    model, graph, batches, circuit = _position_setup("first")
    from exactlens.analysis.circuit.evaluate import truth_ranking

    cache = DivergenceCache(model, graph, batches)
    fits = [s for s, n in zip(SIZES, size_counts(len(graph.edges)), strict=True) if n >= len(circuit.edges)]
    exact = faithfulness(cache, ranked(graph, truth_ranking(circuit)), sizes=fits)
    assert exact.f == [1.0] * len(fits)


def test_position_granularity_refuses_what_it_cannot_do():
    with pytest.raises(ExactLensError, match="one length"):
        discover_report("first", "eap", granularity="position", lengths=[2, 3], words=4)
    with pytest.raises(ExactLensError, match="--against"):
        discover_report("first", "eap", granularity="position", against="first", words=4)
    model = build("first")
    with pytest.raises(ExactLensError, match="no token positions"):
        to_mib(model, model_graph(model, "position", 4), set())


def test_cli_position_granularity(capsys):
    from exactlens.cli import main

    assert main(["discover", "first", "--method", "acdc", "--granularity", "position", "--lengths", "3", "--words",
                 "8", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["granularity"] == "position" and out["lengths"] == [3] and len(out["edges"]) == 4 * 32
    assert set(out["selected"]) == {"embed->L0.MLP@1", "L0.MLP->L1.H0.v@1", "L1.H0->output@0"}
    assert out["score"]["edge_auroc"] == 1.0 and out["cpr"] is not None
    assert main(["circuit", "first", "--granularity", "position", "--lengths", "3", "--words", "8", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["check"]["outside_changed"] == 0
    assert {e["edge"] for e in out["edges"] if not e["constant"]} == set(
        ["embed->L0.MLP@1", "L0.MLP->L1.H0.v@1", "L1.H0->output@0"])
    assert all(e["edge"].endswith(f"@{e['position']}") for e in out["edges"])


# ---- swappable heads ---------------------------------------------------------------------------------


def _two_first_heads():
    """FIRST with every layer's head doubled: layer 1's two identical heads each write FIRST's answer,
    so the output reads it twice (the same decisions) and either head alone carries it."""
    model = build("first", dtype="float64")
    doubled = type(model)(dataclasses.replace(model.cfg, n_heads=2))
    shapes = {k: v.shape for k, v in doubled.state_dict().items()}
    doubled.load_state_dict({k: (torch.cat([v, v]) if v.shape != shapes[k] else v)
                             for k, v in model.state_dict().items()})
    return doubled


def test_swappable_heads_give_equivalent_circuits():
    model = _two_first_heads()
    assert swappable_heads(model) == [("L0.H0", "L0.H1"), ("L1.H0", "L1.H1")]
    assert swappable_heads(build("first")) == []
    graph = model_graph(model, "head")
    batches = word_batches(model, graph, None, 32, ablation="zero")
    circuit = exact_circuit(model, graph, batches)
    valid = valid_circuits(model, circuit, batches)
    swapped = "without redundant edges, L1.H0<->L1.H1"
    assert list(valid) == ["weights", "without redundant edges", swapped]
    assert valid[swapped] == swap_edges(valid["without redundant edges"], "L1.H0", "L1.H1")
    assert {e.name for e in valid["without redundant edges"]} == {
        "embed->L0.MLP", "pos->L0.MLP", "L0.MLP->L1.H1", "L1.H1->output"}  # dead edges into L1.H0 dropped
    # measured: ACDC at a cut of 0.01 keeps L1.H0's path (and pos -> L1.H0) and drops L1.H1's: it
    # best matches the swapped smaller circuit, which the unswapped candidates under-credit
    found = discover(model, graph, batches, "acdc", 0.01)
    match = best_match(found.selected, valid, {c.edge for c in circuit.edges if c.constant}, swappable_heads(model))
    f1 = {name: c["f1"] for name, c in match["candidates"].items()}
    assert match["best"] == swapped and f1[swapped] > f1["weights"] > f1["without redundant edges"]
    assert match["swappable_heads"] == [["L0.H0", "L0.H1"], ["L1.H0", "L1.H1"]]
    exact = best_match(valid[swapped], valid, set(), swappable_heads(model))
    assert exact["best"] == swapped and exact["candidates"][swapped]["f1"] == 1.0


# ---- the ACDC paper's AUC construction ---------------------------------------------------------------


def test_stair_auc_is_the_papers_pessimistic_staircase():
    from exactlens.analysis.circuit.sweep import stair_auc, sweep_auc

    # the ACDC repository's stored sweep for tracr-reverse, random ablation: every run keeps 3 of 15
    # circuit edges at fpr 0 (5 of 16 nodes); its table prints 0.20 / 0.31, trapezoids give 0.60
    assert stair_auc([(0.0, 0.2)] * 61) == pytest.approx(0.2) and sweep_auc([(0.0, 0.2)]) == pytest.approx(0.6)
    assert stair_auc([(0.0, 0.3125)]) == pytest.approx(0.3125)
    # a rise at fpr x earns (1 - x) of it; a dominated point adds nothing
    assert stair_auc([(0.0, 0.6), (0.6, 0.8)]) == pytest.approx(0.6 + 0.2 * 0.4)
    assert stair_auc([(0.2, 0.6), (0.5, 0.5)]) == pytest.approx(0.6 * 0.8)
    assert stair_auc([]) == 0.0 and stair_auc([(0.0, 1.0)]) == 1.0

"""The edge graph, the ground-truth circuits read off the weights, ablations, discovery and scoring."""

from __future__ import annotations

import itertools
import random
from types import SimpleNamespace

import pytest
import torch

from exactlens.analysis.circuit.ablation import aligned_positions, check_circuit, make_batch, mark_constant
from exactlens.analysis.circuit.correspond import compare_with_circuit
from exactlens.analysis.circuit.discovery import Discovery, discover
from exactlens.analysis.circuit.evaluate import (
    circuit_report,
    default_lengths,
    discover_report,
    exact_circuit,
    shared_longest,
    source_length,
    word_batches,
)
from exactlens.analysis.circuit.forward import run_graph
from exactlens.analysis.circuit.graph import Edge, model_graph
from exactlens.analysis.circuit.scoring import auroc, best_cut, roc_curve, score_discovery
from exactlens.analysis.circuit.truth import Circuit, derive_circuit
from exactlens.constructions.registry import build, names
from exactlens.errors import ExactLensError
from exactlens.tasks import of_model
from exactlens.verbs.discover import format_discover_text

# The biggest graphs: their full ablation checks run in the slow suite.
LARGE = {"dyck-k-D", "dyck1-depth2", "first-ln-eta", "parity-ln-eta"}
PAPER = [n for n in names() if not n.startswith("tracr-")]

# Circuit edges whose ablation alone changes no decision on the default words (resample ablation,
# head granularity, the task's shortest six lengths, 64 words each), measured and explained:
# * post-LN models (Chiang & Cholak's LN constructions): the skip path around an FFN,
#   L{l}.LN1 -> L{l}.LN2, is redundant: the FFN's output carries what the next layers read, and its
#   input still reads the clean LN1; likewise the embedding's direct path into parity-ln's first norm.
# * sm-solution2 stores q_true per position: the FFN reads the category from the head's output, the
#   embedding's own copy of it (embed -> L0.MLP) is redundant.
REDUNDANT = {
    "first-ln": {"L0.LN1->L0.LN2", "L0.LN2->L1.LN1"},
    "first-log-ln": {"L0.LN1->L0.LN2", "L0.LN2->L1.LN1"},
    "parity-ln": {"embed->L0.LN1", "L0.LN1->L0.LN2", "L0.LN2->L1.LN1"},
    # Prop. 2's extra layer adds its own skip around the FFN
    "first-ln-eta": {"L0.LN1->L0.LN2", "L0.LN2->L1.LN1", "L2.LN1->L2.LN2"},
    "parity-ln-eta": {"embed->L0.LN1", "L0.LN1->L0.LN2", "L0.LN2->L1.LN1", "L2.LN1->L2.LN2"},
    "sm-solution2": {"embed->L0.MLP"},
}


def _batch(model, count: int = 6, seed: int = 0):
    task = of_model(model)
    length = max(task.min_length, 3)
    if task.max_length is not None:
        length = min(length, task.max_length)
    ids = task.sample(length, count, torch.Generator().manual_seed(seed))
    return task.encode(ids)


@pytest.mark.parametrize("name", PAPER)
@pytest.mark.parametrize("granularity", ["head", "qkv"])
def test_edge_forward_is_the_model(name, granularity):
    """Nothing patched, the edge-by-edge forward is the model's own (every construction, float64)."""
    model = build(name, dtype="float64")
    batch = _batch(model)
    graph = model_graph(model, granularity)
    with torch.no_grad():
        expected = model(batch.tokens, batch.n_positions)
        got = run_graph(model, graph, batch.tokens, batch.n_positions).logits
    # eps = 0 layer norms give NaN at positions the readout never reads (0/0 on a zero vector): the
    # same NaN must come out in the same places
    scale = float(expected.nan_to_num(0.0).abs().max())
    assert torch.allclose(got, expected, rtol=0, atol=1e-10 * (1 + scale), equal_nan=True)


def test_patching_every_edge_is_the_source_run():
    """All edges patched with another word's activations gives that word's outputs exactly."""
    model = build("parity", dtype="float64")
    task = of_model(model)
    ids = task.all_words(4)
    graph = model_graph(model, "qkv")
    batch = make_batch(model, graph, ids)
    run = run_graph(model, graph, batch.tokens, batch.n_positions, patched=graph.edges, source=batch.source)
    other = {n: out for n, out in batch.source.items()}
    assert torch.allclose(run.outputs["output"] if "output" in run.outputs else run.logits,
                          run.logits)  # output is no sender
    # every receiver read only source activations, so each sender's output equals the source word's
    for node in graph.senders:
        if node not in ("embed", "pos"):
            assert torch.allclose(run.outputs[node], other[node], atol=1e-12)


@pytest.mark.parametrize("name", ["parity-ln", "dyck-k-D", "tracr-frac_prevs"])
def test_reusing_clean_outputs_before_the_patched_receivers_changes_nothing(name):
    """ACDC's shortcut: with every patched edge entering a receiver at step i or later, taking the clean
    outputs of the first i steps as given gives the same logits, bit for bit, as computing them again
    (post-LN norms, b_O and FFNs without residual reset or carry the stream's constant the same way)."""
    if name.startswith("tracr-"):
        pytest.importorskip("tracr")
    model = build(name, dtype="float64")
    graph = model_graph(model, "qkv")
    batch = word_batches(model, graph, default_lengths(of_model(model))[:3], words=16)[-1]
    for i, step in enumerate(graph.steps):
        later = [e for e in graph.edges if graph.nodes.index(e.receiver) >= i][::3]
        full = run_graph(model, graph, batch.tokens, batch.n_positions, patched=later, source=batch.source)
        reused = run_graph(model, graph, batch.tokens, batch.n_positions, patched=later, source=batch.source,
                           reuse={s.node: batch.clean.outputs[s.node] for s in graph.steps[:i]})
        assert torch.equal(full.logits.nan_to_num(), reused.logits.nan_to_num()), step.node


def test_graph_shapes():
    pre = build("parity", dtype="float64")  # no layer norm: a sum; every earlier sender feeds every receiver
    graph = model_graph(pre, "qkv")
    assert graph.nodes[0] == "embed" and graph.nodes[-1] == "output"
    assert Edge("embed", "L1.H0", "q") in set(graph.edges) and Edge("L0.H0", "L1.MLP") in set(graph.edges)
    post = build("parity-ln", dtype="float64")  # post-LN: a chain through the norms
    chain = model_graph(post, "head")
    assert chain.step("L1.H0").reads == ("L0.LN2",)
    assert chain.step("output").reads == (f"L{post.cfg.n_layers - 1}.LN2",)
    for text in ("L0.H1->L1.H0.k", "embed->L0.MLP", "L1.MLP->output"):
        assert Edge.parse(text).name == text
    with pytest.raises(ExactLensError, match="SENDER->RECEIVER"):
        Edge.parse("L0.H0")
    with pytest.raises(ExactLensError, match="granularity"):
        model_graph(pre, "neuron")


def test_parity_circuit_reads_the_recipe():
    """Chiang & Cholak's PARITY (§3): layer 1's head averages the ones (value reads I[w_i=1]), the FFN
    makes I[i=k]/n, layer 2's heads read it through their values with queries from [CLS] and keys from
    cos(i pi); the output reads the heads only."""
    circuit = derive_circuit(build("parity", dtype="float64"), "qkv")
    carried = {c.edge.name: set(c.features) for c in circuit.edges}
    assert "I[w_i=1]" in carried["embed->L0.H0.v"]
    assert carried["pos->L1.H0.k"] == {"cos(i*pi)"}
    assert carried["L0.MLP->L1.H0.v"] == {"I[i=k]/n"}
    assert {c.edge.sender for c in circuit.edges if c.edge.receiver == "output"} == {"L1.H0", "L1.H1"}
    assert not any(e.edge.slot == "q" and e.edge.sender == "pos" for e in circuit.edges)


def _check(name: str, granularity: str = "head", ablation: str = "resample"):
    model = build(name, dtype="float64")
    circuit = derive_circuit(model, granularity)
    batches = word_batches(model, circuit.graph, ablation=ablation)
    circuit = mark_constant(circuit, batches, model)
    return model, circuit, batches, check_circuit(model, circuit, batches)


def _params(names_):
    return [pytest.param(n, marks=pytest.mark.slow) if n in LARGE else n for n in names_]


@pytest.mark.parametrize("name", _params(PAPER))
def test_circuit_is_sufficient_and_its_edges_necessary(name):
    """Ablating every edge outside the circuit changes no decision; ablating one edge inside it
    changes some, except the measured redundant paths listed (and explained) in REDUNDANT."""
    _, circuit, _, check = _check(name)
    assert check.outside_changed == 0
    assert set(check.unnecessary) == REDUNDANT.get(name, set())
    assert len(check.inside_changed) > len(check.unnecessary)  # most of the circuit is necessary


def test_a_wrong_circuit_fails_the_checks():
    """The checks can fail: dropping a necessary edge makes the outside ablation change decisions,
    adding an edge the weights do not connect makes an unnecessary one."""
    model, circuit, batches, _ = _check("parity")
    necessary = next(c for c in circuit.edges if not c.constant)
    smaller = Circuit(circuit.graph, [c for c in circuit.edges if c is not necessary])
    assert check_circuit(model, smaller, batches).outside_changed > 0
    extra_edge = next(e for e in circuit.graph.edges if not circuit.contains(e))
    from exactlens.analysis.circuit.truth import CircuitEdge

    bigger = Circuit(circuit.graph, [*circuit.edges, CircuitEdge(extra_edge, (), False, False)])
    assert extra_edge.name in check_circuit(model, bigger, batches).unnecessary


def test_constant_edges_are_the_cls_and_position_features():
    _, circuit, _, _ = _check("parity", "qkv")
    constant = {c.edge.name for c in circuit.edges if c.constant}
    assert "embed->L1.H0.q" in constant  # the query reads only [CLS]'s indicator
    assert "pos->L1.H0.k" in constant  # cos(i pi) is the same for every word of a length
    assert "embed->L0.H0.v" not in constant  # the ones vary


def test_cross_length_ablation_moves_what_is_the_same_within_a_length():
    """Resample ablation cannot move a value that is the same for every word of a length; a source of
    another length can: PARITY's 1/n and i/n into the FFN become movable, while [CLS]'s indicator and
    cos(i pi) at aligned positions stay constant."""
    _, resampled, _, _ = _check("parity", "qkv")
    _, crossed, _, check = _check("parity", "qkv", "cross-length")
    constant = {ablated: {c.edge.name for c in circuit.edges if c.constant}
                for ablated, circuit in (("resample", resampled), ("cross-length", crossed))}
    assert "pos->L0.MLP" in constant["resample"] and "pos->L0.MLP" not in constant["cross-length"]
    assert {"embed->L1.H0.q", "pos->L1.H0.k"} <= constant["cross-length"]
    assert constant["cross-length"] < constant["resample"]
    assert check.outside_changed == 0 and check.inside_changed["pos->L0.MLP"] > 0


@pytest.mark.parametrize("name", _params(PAPER))
def test_circuit_is_sufficient_under_cross_length_ablation(name):
    """Sufficiency holds whatever the ablated edges read: every edge outside the circuit taken from a
    word of another length changes no decision."""
    assert _check(name, "head", "cross-length")[3].outside_changed == 0


def test_cross_length_sources_are_aligned_and_paired_at_random():
    """[CLS] -> [CLS], symbol i -> symbol min(i, m - 1), [EOS] -> [EOS]; each word reads one source
    word, every source word used once before any twice; another length or an ablation without its
    source words is refused."""
    palindrome = of_model(build("palindrome"))  # [CLS] w [EOS]
    assert palindrome.use_cls and palindrome.use_eos
    assert aligned_positions(palindrome, 3, 5).tolist() == [0, 1, 2, 3, 6]
    assert aligned_positions(palindrome, 4, 2).tolist() == [0, 1, 2, 2, 2, 3]
    model = build("parity", dtype="float64")
    graph = model_graph(model, "head")
    task = of_model(model)
    ids, source_ids = task.all_words(3), task.all_words(4)
    batch = make_batch(model, graph, ids, "cross-length", seed=1, source_ids=source_ids)
    other = make_batch(model, graph, source_ids, "resample").clean.outputs
    positions = aligned_positions(task, 3, 4)

    def reads(i: int, j: int) -> bool:  # word i's source is source word j at the aligned positions, every node
        return all(torch.equal(batch.source[node][i], out[j][positions]) for node, out in other.items())

    rows = [[j for j in range(len(source_ids)) if reads(i, j)] for i in range(len(ids))]
    assert all(len(r) == 1 for r in rows)
    rows = [r[0] for r in rows]
    assert len(set(rows)) == len(ids) and rows != sorted(rows)  # distinct sources, not in index order
    assert source_length(task, 3) == 4
    with pytest.raises(ExactLensError, match="a length other than 3"):
        make_batch(model, graph, ids, "cross-length", source_ids=task.all_words(3))
    with pytest.raises(ExactLensError, match="exactly when the ablation is cross-length"):
        make_batch(model, graph, ids, "cross-length")
    assert source_length(SimpleNamespace(name="t", min_length=1, max_length=4), 4) == 3  # the longest: n - 1
    assert source_length(SimpleNamespace(name="t", min_length=1, max_length=None), 7, longest=7) == 6
    with pytest.raises(ExactLensError, match="needs words of another length >= 1.*t allows only lengths 2..2"):
        source_length(SimpleNamespace(name="t", min_length=2, max_length=2), 2)


def test_cross_length_sources_stay_within_what_the_model_answers():
    """A learned position table of n_ctx = 50 answers |w| <= 50: at 50 the source words are shorter, not
    longer (resample works there too); a length beyond it is refused by name. Lengths with one word
    (only resample needs a second word of the length) are kept."""
    model = build("sm-solution1", dtype="float64")
    graph = model_graph(model, "head")
    (batch,) = word_batches(model, graph, [50], words=4, ablation="cross-length")
    assert batch.tokens.shape[1] == 50 + of_model(model).n_specials
    with pytest.raises(ExactLensError, match="exceeds the stated limit 50"):
        word_batches(model, graph, [51], words=4, ablation="cross-length")
    parity = build("parity", dtype="float64")
    one_word = word_batches(parity, model_graph(parity, "head"), [0, 2], words=4, ablation="cross-length")
    assert [int(b.tokens.shape[0]) for b in one_word] == [1, 4]  # the empty word reads a word of length 1
    # two models compared on the same words read the same sources: the shorter limit of the two holds
    assert shared_longest(model, parity) == 50 and shared_longest(parity, parity) is None
    (capped,) = word_batches(parity, model_graph(parity, "head"), [3], words=8, ablation="cross-length", longest=3)
    (free,) = word_batches(parity, model_graph(parity, "head"), [3], words=8, ablation="cross-length")
    assert not torch.equal(capped.source["L0.H0"], free.source["L0.H0"])  # length-2 sources, not length-4


def test_auroc_and_roc_against_brute_force():
    rng = random.Random(0)
    for _ in range(20):
        keys = list(range(12))
        scores = {k: rng.choice([0.0, 0.5, 1.0, rng.random()]) for k in keys}
        positives = set(rng.sample(keys, 5))
        pairs = list(itertools.product([k for k in keys if k in positives], [k for k in keys if k not in positives]))
        brute = sum(1.0 if scores[p] > scores[n] else 0.5 if scores[p] == scores[n] else 0.0 for p, n in pairs)
        assert auroc(scores, positives) == pytest.approx(brute / len(pairs))
        curve = roc_curve(scores, positives)
        assert curve[0] == (0.0, 0.0) and curve[-1] == (1.0, 1.0)
        assert all(a[0] <= b[0] and a[1] <= b[1] for a, b in itertools.pairwise(curve))
        n_neg = len(keys) - len(positives)
        brute_curve = [(0.0, 0.0)] + [
            (sum(scores[k] >= cut for k in keys if k not in positives) / n_neg,
             sum(scores[k] >= cut for k in positives) / len(positives))
            for cut in sorted(set(scores.values()), reverse=True)]
        assert curve[: len(brute_curve)] == brute_curve
        # the best cut: the highest F1 over every "score >= cut" selection, by brute force
        f1s = {}
        for cut in set(scores.values()):
            chosen = {k for k in keys if scores[k] >= cut}
            f1s[cut] = 2 * len(chosen & positives) / (len(chosen) + len(positives))
        best = best_cut(scores, positives)
        top = max(f1s.values())
        assert best["f1"] == pytest.approx(top) and best["cut"] == max(c for c, f in f1s.items() if f == top)
        chosen = {k for k in keys if scores[k] >= best["cut"]}
        assert best["n_selected"] == len(chosen)
        assert best["precision"] == len(chosen & positives) / len(chosen)
        assert best["recall"] == len(chosen & positives) / len(positives)
    assert auroc({1: 0.3}, {1}) is None
    assert best_cut({1: 0.3, 2: 0.1}, set()) is None
    assert best_cut({1: 0.3, 2: 0.1, 3: 0.2}, {1, 3}) == {"f1": 1.0, "cut": 0.2, "relative_cut": 0.2 / 0.3,
                                                        "numerically_zero": False, "precision": 1.0, "recall": 1.0,
                                                        "n_selected": 2}
    assert best_cut({1: 1.0, 2: 1e-30, 3: 0.0}, {1, 2})["numerically_zero"]
    # rounding residue (below 1e-9 of the top score) ties with exact zeros: it must not rank
    assert auroc({1: 1.0, 2: 1e-30, 3: 0.0}, {1, 2}) == 0.75
    assert auroc({1: 1.0, 2: 1e-6, 3: 0.0}, {1, 2}) == 1.0
    assert roc_curve({1: 1.0, 2: 1e-30, 3: 0.0}, {1, 2}) == [(0.0, 0.0), (0.0, 0.5), (1.0, 1.0)]


@pytest.mark.parametrize("method", ["eap", "acdc"])
def test_edge_methods_recover_parity(method):
    """Measured: EAP and ACDC recover PARITY's circuit exactly (AUROC 1, precision and recall 1)."""
    model = build("parity", dtype="float64")
    graph = model_graph(model, "qkv")
    batches = word_batches(model, graph, [2, 3, 4], 16)
    circuit = mark_constant(derive_circuit(model, "qkv"), batches, model)
    score = score_discovery(discover(model, graph, batches, method), circuit)
    assert score.edge_auroc == 1.0 and score.precision == 1.0 and score.recall == 1.0


def test_node_patching_scores_nodes():
    """Activation patching finds the nodes (node AUROC 1) but gives every edge of a node its score."""
    report = discover_report("parity", "patching", lengths=[2, 3, 4], words=16)
    assert report["score"]["node_auroc"] == 1.0
    assert report["score"]["edge_auroc"] < 1.0


def test_reports_and_bad_input():
    report = circuit_report("one", lengths=[1, 2, 3], words=8)
    assert report["check"]["outside_changed"] == 0 and report["n_circuit_edges"] > 0
    assert {"edges", "granularity", "nodes", "circuit_nodes", "lengths"} <= set(report)
    with pytest.raises(ExactLensError, match="method"):
        discover_report("one", "magic")
    with pytest.raises(ExactLensError, match="granularity"):
        circuit_report("one", granularity="neurons")
    with pytest.raises(ExactLensError, match="words per length"):
        circuit_report("one", words=1)
    with pytest.raises(ExactLensError, match="threshold"):
        discover_report("one", "acdc", threshold=-1.0, lengths=[2], words=4)


def test_cli_circuit_and_discover(capsys):
    import json

    from exactlens.cli import main

    assert main(["circuit", "one", "--lengths", "1", "2", "3", "--words", "8", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["check"]["outside_changed"] == 0 and out["granularity"] == "head"
    assert main(["discover", "one", "--method", "eap", "--granularity", "qkv", "--lengths", "2", "3",
                 "--words", "8", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["score"]["edge_auroc"] is not None and len(out["edges"]) == out["score"]["n_edges"] + \
        out["score"]["n_constant"]
    with pytest.raises(SystemExit) as exit_:  # argparse refuses an unknown choice
        main(["discover", "one", "--method", "magic"])
    assert exit_.value.code == 2
    assert main(["circuit", "no-such-construction"]) == 2


def test_api_results_show_themselves():
    import exactlens as el

    result = el.circuit("one", lengths=[1, 2], words=8)
    assert "<svg" in result._repr_html_() and "edges in the circuit" in repr(result)
    found = el.discover("one", "acdc", lengths=[1, 2], words=8)
    assert "AUROC" in found._repr_html_() and found.plot() is not None


def test_trained_model_against_the_exact_circuit():
    """A model trained in the construction's shape has the same graph: the discovered edges are compared
    with the exact circuit by overlap after the (identity) node map."""
    import exactlens as el

    trained = el.train("dyck1", epochs=2, strings_per_epoch=32, batch_size=16, eval_every=0, device="cpu").model
    report = discover_report(trained, "eap", against="dyck1", lengths=[2, 3], words=8)
    overlap = report["overlap"]
    assert overlap["comparable"] and overlap["circuit_edges"] > 0
    assert all(k == v for k, v in overlap["node_map"].items())
    assert 0.0 <= overlap["jaccard"] <= 1.0 and overlap["jaccard"] == overlap["edges"]["jaccard"]
    # a construction of another task is refused, naming both tasks
    with pytest.raises(ExactLensError, match="different tasks.*dyck.*k=1.*parity"):
        discover_report(trained, "eap", against="parity", lengths=[2, 3], words=8)


def test_a_relative_cut_is_taken_between_components_in_a_post_ln_graph():
    """EAP's cut is 1 % of the largest edge score. In a trained post-LN FIRST the largest is the last
    norm's edge into the output, which every path crosses (6.1 against 0.013 for the next, measured), so
    the raw selection was that edge alone and nothing between components. Planted: post-LN FIRST's own
    EAP scores with that edge made 10^4 times the largest. The raw selection keeps it alone; the
    comparison between components, whose cut is taken among the joined edges, still finds exactly
    plain FIRST's circuit, and so do its nodes. A method with an absolute cut keeps its own selection."""
    lengths = [1, 2, 3, 4, 6, 8]
    ln, plain = build("first-ln", dtype="float64"), build("first", dtype="float64")
    graph, p_graph = model_graph(ln), model_graph(plain)
    found = discover(ln, graph, word_batches(ln, graph, lengths, 32), "eap")
    truth = exact_circuit(plain, p_graph, word_batches(plain, p_graph, lengths, 32))
    unplanted = compare_with_circuit(graph, found, truth)
    before = unplanted["edges"]["between_components"]
    assert before["jaccard"] == 1.0 and unplanted["nodes"]["jaccard"] == 1.0
    last = max((e for e in graph.edges if e.receiver == "output"), key=lambda e: found.edge_scores[e])
    assert last.sender.endswith("LN2")
    scores = {**found.edge_scores, last: 1e4 * max(found.edge_scores.values())}
    top = max(scores.values())
    cut = {e for e, v in scores.items() if v > found.threshold * top}
    assert cut == {last}
    planted = Discovery("eap", found.granularity, scores, found.node_scores, cut, found.threshold)
    planted_result = compare_with_circuit(graph, planted, truth)
    joined = planted_result["edges"]["between_components"]
    assert (joined["jaccard"], joined["shared_edges"]) == (1.0, before["shared_edges"])
    assert planted_result["nodes"]["shared_nodes"] == unplanted["nodes"]["shared_nodes"]  # nodes: the same cut
    absolute = Discovery("file", found.granularity, scores, found.node_scores, cut, 0.0)
    assert compare_with_circuit(graph, absolute, truth)["edges"]["between_components"]["found"] == 0


def test_against_a_construction_of_another_shape():
    """Chiang & Cholak's post-LN FIRST against plain FIRST: the graphs differ (a norm between any two
    components), no raw edge of the plain circuit has a counterpart, and between components ACDC
    finds exactly the plain circuit; against itself every edge maps to itself."""
    report = discover_report("first-ln", "acdc", against="first", lengths=[1, 2, 3, 4, 6, 8], words=32)
    overlap = report["overlap"]
    assert overlap["comparable"] and overlap["mapping"] == "layer and head index"
    joined = overlap["edges"]["between_components"]
    assert overlap["edges"]["truth_with_counterpart"] < overlap["edges"]["truth"]
    assert joined["truth_with_counterpart"] == joined["truth"] == overlap["edges"]["truth"]
    assert joined["jaccard"] == 1.0 and joined["exact_only"] == []
    own = discover_report("first", "acdc", against="first", lengths=[1, 2, 3], words=16)
    score = discover_report("first", "acdc", lengths=[1, 2, 3], words=16)["score"]
    assert (own["overlap"]["precision"], own["overlap"]["recall"]) == (score["precision"], score["recall"])
    assert own["overlap"]["edges"]["auroc"] == pytest.approx(score["edge_auroc"])
    text = format_discover_text(report)
    assert "between components (norm chains joined): jaccard 1.000" in text and "against the circuit of first" in text

"""The stacked ablations (exactlens.analysis.circuit.batched) against the one-ablation-per-pass
reference: node patching, edge patching, ACDC and the faithfulness curves give the same scores (to
float rounding), the same selections and the same AUROC on constructions of three task kinds."""

from __future__ import annotations

import pytest

from exactlens.analysis.circuit import batched
from exactlens.analysis.circuit.discovery import (
    DEFAULT_THRESHOLD,
    discover,
    node_scores,
    patched_divergence,
    stacked_divergences,
)
from exactlens.analysis.circuit.evaluate import _resolve, default_lengths, edge_graph, exact_circuit, word_batches
from exactlens.analysis.circuit.faithfulness import DivergenceCache, faithfulness, ranked
from exactlens.analysis.circuit.scoring import score_discovery
from exactlens.tasks import reader


def _mean(values) -> float:
    values = list(values)
    return sum(values) / len(values)


def reference_patching(model, graph, batches):
    """Node patching one node per forward pass (the method before the passes were stacked)."""
    scores = {node: _mean(patched_divergence(model, graph, b, [e for e in graph.edges if e.sender == node])
                          for b in batches) for node in graph.senders}
    return {e: scores[e.sender] for e in graph.edges}


def reference_edge_patching(model, graph, batches):
    order = {s.node: i for i, s in enumerate(graph.steps)}
    return {e: _mean(patched_divergence(model, graph, b, {e}, order[e.receiver]) for b in batches)
            for e in graph.edges}


def reference_acdc(model, graph, batches, threshold):
    """ACDC one trial per forward pass."""
    removed: set = set()
    current = _mean(patched_divergence(model, graph, b, removed) for b in batches)
    scores = {}
    order = {s.node: i for i, s in enumerate(graph.steps)}
    for step in [s for s in reversed(graph.steps) if graph.edges_into(s.node)]:
        for edge in sorted(graph.edges_into(step.node), reverse=True):
            trial = _mean(patched_divergence(model, graph, b, removed | {edge}, order[step.node]) for b in batches)
            scores[edge] = max(trial - current, 0.0)
            if trial - current < threshold:
                removed.add(edge)
                current = trial
    return scores, set(graph.edges) - removed


def _setup(name: str, granularity: str, ablation: str = "resample"):
    model, _ = _resolve(name)
    lengths = default_lengths(reader(model).task)[:3]
    graph, used = edge_graph(model, granularity, lengths)
    batches = word_batches(model, graph, used, 16, 0, ablation)
    return model, graph, batches


def _close(found: dict, expected: dict) -> None:
    assert list(found) == list(expected) or set(found) == set(expected)
    for edge, value in expected.items():
        assert found[edge] == pytest.approx(value, rel=1e-9, abs=1e-12), edge.name


CASES = [("parity", "qkv"), ("tracr-hist", "head"), ("majority", "qkv"), ("induction-recent", "head")]


@pytest.mark.parametrize(("name", "granularity"), CASES)
def test_stacked_methods_equal_one_pass_per_ablation(name: str, granularity: str, monkeypatch) -> None:
    monkeypatch.setattr(batched, "MAX_VARIANTS", 5)  # several passes per call, a last one part full
    model, graph, batches = _setup(name, granularity)
    circuit = exact_circuit(model, graph, batches)
    patching = discover(model, graph, batches, "patching")
    _close(patching.edge_scores, reference_patching(model, graph, batches))
    edges = discover(model, graph, batches, "edge-patching")
    _close(edges.edge_scores, reference_edge_patching(model, graph, batches))
    acdc = discover(model, graph, batches, "acdc")
    scores, selected = reference_acdc(model, graph, batches, DEFAULT_THRESHOLD["acdc"])
    _close(acdc.edge_scores, scores)
    assert acdc.selected == selected
    assert 0 < len(selected) < len(graph.edges)  # the walk both kept and removed edges
    for found, reference in ((acdc, scores), (edges, reference_edge_patching(model, graph, batches))):
        ref = type(found)(found.method, found.granularity, reference, node_scores(graph, reference), found.selected,
                          found.threshold)
        assert score_discovery(found, circuit).to_dict()["edge_auroc"] == score_discovery(ref, circuit).to_dict()[
            "edge_auroc"]


@pytest.mark.parametrize("ablation", ["resample", "mean", "zero"])
def test_stacked_faithfulness_equals_one_pass_per_circuit(ablation: str) -> None:
    model, graph, batches = _setup("parity", "qkv", ablation)
    order = ranked(graph, reference_edge_patching(model, graph, batches))
    cache = DivergenceCache(model, graph, batches)
    curve = faithfulness(cache, order)
    assert cache.runs == len({frozenset(order[:n]) for n in curve.counts} | {frozenset()})
    empty = _mean(patched_divergence(model, graph, b, graph.edges) for b in batches)
    for n, f in zip(curve.counts, curve.f or [], strict=False):
        kept = set(order[:n])
        d = _mean(patched_divergence(model, graph, b, [e for e in graph.edges if e not in kept]) for b in batches)
        assert f == pytest.approx(1 - d / empty, rel=1e-9, abs=1e-12)


def test_stacked_position_edges_equal_one_pass_each() -> None:
    model, _ = _resolve("parity")
    graph, used = edge_graph(model, "position", [4])
    (batch,) = word_batches(model, graph, used, 16, 0, "resample")
    edges = graph.edges[::7]
    variants = [{e} for e in edges] + [set(edges[:3]), set()]
    found = stacked_divergences(model, graph, batch, variants)
    expected = [patched_divergence(model, graph, batch, v) for v in variants]
    assert found == pytest.approx(expected, rel=1e-9, abs=1e-12)
    assert any(v > 0 for v in expected)


def test_a_pass_holds_what_the_budget_allows(monkeypatch) -> None:
    model, graph, batches = _setup("parity", "qkv")
    full = batched.variants_per_pass(model, graph, batches[0])
    monkeypatch.setattr(batched, "PASS_BYTES", 1)
    assert batched.variants_per_pass(model, graph, batches[0]) == 1 < full
    calls = []
    original = batched.run_graph
    monkeypatch.setattr(batched, "run_graph", lambda *a, **k: calls.append(1) or original(*a, **k))
    stacked_divergences(model, graph, batches[0], [{e} for e in graph.edges[:4]])
    assert len(calls) == 4

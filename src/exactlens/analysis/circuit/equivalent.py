"""Equivalent circuits: more than one edge set can be a valid circuit for one mechanism, and a single
"true" set under-credits a method that finds another. Here the valid alternatives come from the
ablation evidence itself: a circuit edge whose ablation alone changes no decision (``unnecessary``:
a redundant path) may be dropped when the circuit without it is still sufficient (ablating every edge
outside the smaller circuit changes no decision). The edges are dropped greedily in the graph's
order, each kept out only if sufficiency holds, which gives one smaller valid circuit beside the one
read off the weights; a discovered circuit is scored against the best-matching of the two (by F1 over
the observable edges), and the result says which. Edges left dead by the drops (into a node that no
longer reaches the output inside the smaller circuit) are dropped too: every edge its output sends is
ablated, so what it reads cannot matter.

Symmetric components give more: two heads of one layer with identical weights (every per-head
parameter equal) are *swappable*: exchanging them is a symmetry of the model, so the image of a valid
circuit under the exchange (each edge with the two heads' names swapped) is valid too, and equally
small. Each candidate's images under every swap (and their compositions) join the candidates, each
checked sufficient by ablation again, named ``<candidate>, L1.H0<->L1.H1``.
"""

from __future__ import annotations

from typing import Any

import torch

from exactlens.analysis.circuit.ablation import Batch, changed_words, check_circuit, small_tensor_threads
from exactlens.analysis.circuit.graph import Edge
from exactlens.analysis.circuit.truth import Circuit


def _sufficient(model, circuit: Circuit, batches: list[Batch], kept: set) -> bool:
    outside = [e for e in circuit.graph.edges if e not in kept]
    with small_tensor_threads(model):
        return all(int(changed_words(model, circuit.graph, b, outside).sum()) == 0 for b in batches)


MAX_CANDIDATES = 16  # images under compositions of swaps grow as 2^pairs: the search stops here


def _alive(graph, kept: set) -> set:
    """The edges of ``kept`` whose receiver still reaches the output through ``kept``."""
    live = {"output"}
    for step in reversed(graph.steps):
        if step.node in live:
            live |= {e.sender for e in kept if e.receiver == step.node}
    return {e for e in kept if e.receiver in live}


def swappable_heads(model) -> list[tuple[str, str]]:
    """Pairs of heads of one layer whose every per-head parameter is equal (exchanging them leaves the
    model unchanged)."""
    pairs = []
    for layer, block in enumerate(model.blocks):
        attn = block.attn
        params = [attn.W_Q, attn.W_K, attn.W_V, attn.W_O, attn.b_Q, attn.b_K, attn.b_V]
        for a in range(model.cfg.n_heads):
            for b in range(a + 1, model.cfg.n_heads):
                if all(torch.equal(p[a], p[b]) for p in params):
                    pairs.append((f"L{layer}.H{a}", f"L{layer}.H{b}"))
    return pairs


def swap_edges(edges: set, a: str, b: str) -> set:
    """The edges with heads ``a`` and ``b`` exchanged (as sender and as receiver)."""
    def other(node: str) -> str:
        return b if node == a else a if node == b else node

    return {Edge(other(e.sender), other(e.receiver), e.slot, e.position) for e in edges}


def valid_circuits(model, circuit: Circuit, batches: list[Batch]) -> dict[str, set]:
    """{name: edge set}: the weights' circuit, (where some of its edges are redundant) the smaller
    sufficient circuit without them, and the images of these under exchanges of swappable heads
    (module docstring; each checked sufficient)."""
    full = set(circuit.edge_set)
    out = {"weights": full}
    unnecessary = set(check_circuit(model, circuit, batches).unnecessary)
    kept = set(full)
    for c in circuit.edges:
        if c.edge.name in unnecessary and _sufficient(model, circuit, batches, kept - {c.edge}):
            kept.discard(c.edge)
    kept = _alive(circuit.graph, kept)
    if kept != full:
        out["without redundant edges"] = kept
    return {**out, **swapped_circuits(model, circuit, batches, out)}


def swapped_circuits(model, circuit: Circuit, batches: list[Batch], candidates: dict[str, set]) -> dict[str, set]:
    """The candidates' images under exchanges of swappable heads that are new and sufficient."""
    pairs = swappable_heads(model)
    found: dict[str, set] = {}
    queue = list(candidates.items())
    while queue and len(candidates) + len(found) < MAX_CANDIDATES:
        name, edges = queue.pop(0)
        for a, b in pairs:
            image = swap_edges(edges, a, b)
            if image in candidates.values() or image in found.values() or not image <= circuit.graph.edge_set:
                continue
            if _sufficient(model, circuit, batches, image):
                found[f"{name}, {a}<->{b}"] = image
                queue.append((f"{name}, {a}<->{b}", image))
    return found


def best_match(selected: set, candidates: dict[str, set], constant: set,
               swaps: list[tuple[str, str]] = ()) -> dict[str, Any]:
    """Precision, recall and F1 of ``selected`` against each candidate (constant edges, and their
    images under the ``swaps``, left out), and the best-matching candidate's name."""
    for a, b in swaps:
        constant = constant | swap_edges(constant, a, b)
    scores = {}
    for name, edges in candidates.items():
        truth, found = edges - constant, selected - constant
        shared = len(truth & found)
        precision = shared / len(found) if found else None
        recall = shared / len(truth) if truth else None
        f1 = 2 * shared / (len(found) + len(truth)) if found or truth else None
        scores[name] = {"n_edges": len(truth), "precision": precision, "recall": recall, "f1": f1,
                        "edges": sorted(e.name for e in edges)}
    best = max(scores, key=lambda n: (scores[n]["f1"] or 0.0, n == "weights"))
    return {"best": best, "candidates": scores, "swappable_heads": [list(p) for p in swaps]}

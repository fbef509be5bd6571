"""Equivalent circuits: more than one edge set can be a valid circuit for one mechanism, and a single
"true" set under-credits a method that finds another. Here the valid alternatives come from the
ablation evidence itself: a circuit edge whose ablation alone changes no decision (``unnecessary``:
a redundant path) may be dropped when the circuit without it is still sufficient (ablating every edge
outside the smaller circuit changes no decision). The edges are dropped greedily in the graph's
order, each kept out only if sufficiency holds, which gives one smaller valid circuit beside the one
read off the weights; a discovered circuit is scored against the best-matching of the two (by F1 over
the observable edges), and the result says which.
"""

from __future__ import annotations

from typing import Any

from exactlens.analysis.circuit.ablation import Batch, changed_words, check_circuit, small_tensor_threads
from exactlens.analysis.circuit.truth import Circuit


def _sufficient(model, circuit: Circuit, batches: list[Batch], kept: set) -> bool:
    outside = [e for e in circuit.graph.edges if e not in kept]
    with small_tensor_threads(model):
        return all(int(changed_words(model, circuit.graph, b, outside).sum()) == 0 for b in batches)


def valid_circuits(model, circuit: Circuit, batches: list[Batch]) -> dict[str, set]:
    """{name: edge set}: the weights' circuit, and (where some of its edges are redundant) the
    smaller sufficient circuit without them."""
    full = set(circuit.edge_set)
    out = {"weights": full}
    unnecessary = set(check_circuit(model, circuit, batches).unnecessary)
    kept = set(full)
    for c in circuit.edges:
        if c.edge.name in unnecessary and _sufficient(model, circuit, batches, kept - {c.edge}):
            kept.discard(c.edge)
    if kept != full:
        out["without redundant edges"] = kept
    return out


def best_match(selected: set, candidates: dict[str, set], constant: set) -> dict[str, Any]:
    """Precision, recall and F1 of ``selected`` against each candidate (constant edges left out), and
    the best-matching candidate's name."""
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
    return {"best": best, "candidates": scores}

"""Scoring a discovery against a ground-truth circuit: the ROC curve of its scores, the AUROC, and
precision and recall of the edges it selects at its own threshold (InterpBench's measures).

Positives are the circuit's edges that an ablation can observe: ``constant`` edges (their activation
is the same for every word, so a resample or mean ablation cannot move them) are left out of both
classes and counted. Node-level scores are compared with the circuit's nodes the same way (a node is
positive when it sends an observable circuit edge).
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from dataclasses import dataclass

from exactlens.analysis.circuit.discovery import Discovery
from exactlens.analysis.circuit.truth import Circuit


def auroc(scores: Mapping[Hashable, float], positives: set) -> float | None:
    """P(score of a random positive > score of a random negative), ties counting 1/2 (the
    Mann-Whitney statistic); None when either class is empty."""
    pos = [v for k, v in scores.items() if k in positives]
    neg = [v for k, v in scores.items() if k not in positives]
    if not pos or not neg:
        return None
    wins = sum((p > n) + 0.5 * (p == n) for p in pos for n in neg)
    return wins / (len(pos) * len(neg))


def set_overlap(found: set, truth: set) -> dict:
    """Sizes of two edge (or node) sets and of their intersection, with precision, recall and
    Jaccard (None where a denominator is 0)."""
    shared = len(found & truth)

    def ratio(den: int) -> float | None:
        return shared / den if den else None

    return {"found": len(found), "truth": len(truth), "shared": shared, "precision": ratio(len(found)),
            "recall": ratio(len(truth)), "jaccard": ratio(len(found | truth))}


def roc_curve(scores: Mapping[Hashable, float], positives: set) -> list[tuple[float, float]]:
    """(false-positive rate, true-positive rate) at every distinct threshold, from (0, 0) to (1, 1)."""
    n_pos = sum(k in positives for k in scores)
    n_neg = len(scores) - n_pos
    points = [(0.0, 0.0)]
    for cut in sorted(set(scores.values()), reverse=True):
        tp = sum(1 for k, v in scores.items() if v >= cut and k in positives)
        fp = sum(1 for k, v in scores.items() if v >= cut and k not in positives)
        points.append((fp / n_neg if n_neg else 0.0, tp / n_pos if n_pos else 0.0))
    if points[-1] != (1.0, 1.0):
        points.append((1.0, 1.0))
    return points


@dataclass
class DiscoveryScore:
    method: str
    granularity: str
    edge_auroc: float | None
    node_auroc: float | None
    precision: float | None
    recall: float | None
    n_edges: int
    n_positive: int
    n_constant: int
    n_selected: int
    seconds: float
    roc: list[tuple[float, float]]

    def to_dict(self) -> dict:
        return {
            "method": self.method, "granularity": self.granularity, "edge_auroc": self.edge_auroc,
            "node_auroc": self.node_auroc, "precision": self.precision, "recall": self.recall,
            "n_edges": self.n_edges, "n_positive": self.n_positive, "n_constant": self.n_constant,
            "n_selected": self.n_selected, "seconds": round(self.seconds, 3),
            "roc": [[round(x, 6), round(y, 6)] for x, y in self.roc],
        }


def score_discovery(found: Discovery, circuit: Circuit) -> DiscoveryScore:
    constant = {c.edge for c in circuit.edges if c.constant}
    positive = {c.edge for c in circuit.edges if not c.constant}
    edge_scores = {e: v for e, v in found.edge_scores.items() if e not in constant}
    positive_nodes = {e.sender for e in positive}
    node_scores = {n: v for n, v in found.node_scores.items() if n in positive_nodes or n not in
                   {e.sender for e in constant}}
    selected = found.selected - constant
    hits = len(selected & positive)
    return DiscoveryScore(
        method=found.method,
        granularity=found.granularity,
        edge_auroc=auroc(edge_scores, positive),
        node_auroc=auroc(node_scores, positive_nodes),
        precision=hits / len(selected) if selected else None,
        recall=hits / len(positive) if positive else None,
        n_edges=len(edge_scores),
        n_positive=len(positive),
        n_constant=len(constant),
        n_selected=len(selected),
        seconds=found.seconds,
        roc=roc_curve(edge_scores, positive),
    )

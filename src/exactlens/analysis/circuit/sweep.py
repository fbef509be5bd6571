"""ROC curves the way the ACDC paper draws them (Conmy et al. 2023, §4): a method that selects a
circuit at a threshold is run at many thresholds, each run gives one (false-positive rate,
true-positive rate) point against the ground truth, and the AUC is the trapezoid area under those
points with (0, 0) and (1, 1) added. This differs from ranking every edge by one run's scores
(exactlens.analysis.circuit.scoring.auroc): a threshold sweep credits only the circuits the method
actually returns, and ACDC's circuit at a threshold depends on what it pruned before.

Classes as in scoring: the circuit's observable edges are positive, its constant edges (the
ablation cannot move them) are left out of both classes (or, as the ACDC paper counts, positive);
a node is positive when it sends a positive edge and is selected when it sends a selected edge.

The ACDC paper's published AUCs are not trapezoids: its plotting code (``pessimistic_auc`` in the
ACDC repository's ROC notebooks) keeps the Pareto-optimal points and integrates the staircase that
runs right before it rises, so a rise of the true-positive rate at false-positive rate x earns only
(1 - x) times the rise and the closing (1, 1) adds nothing (``stair_auc``). A sweep whose every run
returns one circuit at (0, t) scores t there and (1 + t) / 2 as trapezoids.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from exactlens.analysis.circuit.ablation import Batch
from exactlens.analysis.circuit.discovery import Discovery, discover
from exactlens.analysis.circuit.graph import ModelGraph
from exactlens.analysis.circuit.truth import Circuit


def sweep_auc(points: Sequence[tuple[float, float]]) -> float:
    """Trapezoid area under (fpr, tpr) points, with (0, 0) and (1, 1) added, sorted by fpr then tpr."""
    curve = sorted({(0.0, 0.0), (1.0, 1.0), *points})
    return sum((x1 - x0) * (y0 + y1) / 2 for (x0, y0), (x1, y1) in zip(curve, curve[1:], strict=False))


def stair_auc(points: Sequence[tuple[float, float]]) -> float:
    """The staircase area under (fpr, tpr) points (the ACDC paper's construction, module docstring):
    from (0, 0), each point that raises the best tpr so far adds (1 - fpr) x the rise."""
    area, best = 0.0, 0.0
    for fpr, tpr in sorted({(0.0, 0.0), (1.0, 1.0), *points}):
        if tpr > best:
            area += (1.0 - fpr) * (tpr - best)
            best = tpr
    return area


def _rates(selected: set, positives: set, universe: set) -> tuple[float, float]:
    negatives = universe - positives
    tpr = len(selected & positives) / len(positives) if positives else 0.0
    fpr = len(selected & negatives) / len(negatives) if negatives else 0.0
    return fpr, tpr


@dataclass
class Sweep:
    thresholds: list[float]
    edge_points: list[tuple[float, float]]
    node_points: list[tuple[float, float]]
    seconds: float

    @property
    def edge_auc(self) -> float:
        return sweep_auc(self.edge_points)

    @property
    def node_auc(self) -> float:
        return sweep_auc(self.node_points)

    @property
    def edge_auc_stair(self) -> float:
        return stair_auc(self.edge_points)

    @property
    def node_auc_stair(self) -> float:
        return stair_auc(self.node_points)

    def to_dict(self) -> dict:
        return {"thresholds": self.thresholds, "edge_auc": self.edge_auc, "node_auc": self.node_auc,
                "edge_auc_stair": self.edge_auc_stair, "node_auc_stair": self.node_auc_stair,
                "edge_points": [list(p) for p in self.edge_points], "node_points": [list(p) for p in self.node_points],
                "seconds": round(self.seconds, 3)}


def runs_at(model, graph: ModelGraph, batches: list[Batch], thresholds: Sequence[float],
            method: str = "acdc") -> list[Discovery]:
    """The method's circuit at every threshold."""
    return [discover(model, graph, batches, method, t) for t in thresholds]


def sweep_points(runs: Sequence[Discovery], graph: ModelGraph, circuit: Circuit, count_constant: bool = False) -> Sweep:
    """The edge and node ROC points of the runs. ``count_constant``: the circuit's constant edges count
    as positives (the ACDC paper's convention: its ground truth does not ask whether the ablation can
    move an edge) instead of being left out."""
    constant = set() if count_constant else {c.edge for c in circuit.edges if c.constant}
    positives = {c.edge for c in circuit.edges if count_constant or not c.constant}
    edges = set(graph.edges) - constant
    positive_nodes = {e.sender for e in positives}
    nodes = {n for n in graph.senders if n in positive_nodes or n not in {e.sender for e in constant}}
    edge_points, node_points = [], []
    for found in runs:
        chosen = found.selected & edges
        edge_points.append(_rates(chosen, positives, edges))
        node_points.append(_rates({e.sender for e in chosen} & nodes, positive_nodes, nodes))
    return Sweep([r.threshold for r in runs], edge_points, node_points, sum(r.seconds for r in runs))


def threshold_sweep(model, graph: ModelGraph, batches: list[Batch], circuit: Circuit, thresholds: Sequence[float],
                    method: str = "acdc", count_constant: bool = False) -> Sweep:
    """Run ``method`` at every threshold and collect its edge and node ROC points (see sweep_points)."""
    return sweep_points(runs_at(model, graph, batches, thresholds, method), graph, circuit, count_constant)

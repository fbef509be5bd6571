"""Scoring a discovery against a ground-truth circuit: the ROC curve of its scores, the AUROC, and
precision and recall of the edges it selects at its own threshold (InterpBench's measures); and the
best cut its scores allow (the F1-best threshold, found with the truth: where the method's own cut
should have sat).

Positives are the circuit's edges that the ablation can observe: ``constant`` edges (the ablation
used cannot move their activation; exactlens.analysis.circuit.ablation.mark_constant) are left out of both
classes and counted. Node-level scores are compared with the circuit's nodes the same way (a node is
positive when it sends an observable circuit edge). Scores below 1e-9 of the top one count as 0
(``resolved``: rounding residue must not rank).
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from dataclasses import dataclass

from exactlens.analysis.circuit.discovery import Discovery
from exactlens.analysis.circuit.truth import Circuit


def auroc(scores: Mapping[Hashable, float], positives: set) -> float | None:
    """P(score of a random positive > score of a random negative), ties counting 1/2 (the
    Mann-Whitney statistic; rounding residue counts as 0, see ``resolved``); None when either class
    is empty."""
    scores = resolved(scores)
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


def _cut_counts(scores: Mapping[Hashable, float], positives: set) -> list[tuple[float, int, int]]:
    """(cut, true positives, false positives) of selecting every key scored >= cut, at each distinct
    score from the highest down (one sort: ties enter together)."""
    ranked = sorted(((v, k in positives) for k, v in scores.items()), key=lambda item: -item[0])
    counts, tp, fp = [], 0, 0
    for i, (value, positive) in enumerate(ranked):
        tp += positive
        fp += not positive
        if i + 1 == len(ranked) or ranked[i + 1][0] != value:
            counts.append((value, tp, fp))
    return counts


def roc_curve(scores: Mapping[Hashable, float], positives: set) -> list[tuple[float, float]]:
    """(false-positive rate, true-positive rate) at every distinct threshold (of the ``resolved``
    scores), from (0, 0) to (1, 1)."""
    scores = resolved(scores)
    n_pos = sum(k in positives for k in scores)
    n_neg = len(scores) - n_pos
    points = [(0.0, 0.0)]
    for _, tp, fp in _cut_counts(scores, positives):
        points.append((fp / n_neg if n_neg else 0.0, tp / n_pos if n_pos else 0.0))
    if points[-1] != (1.0, 1.0):
        points.append((1.0, 1.0))
    return points


NUMERICALLY_ZERO = 1e-9
"""Scores below this fraction of the top score are rounding residue (see ``resolved``); a best cut at
0 takes edges the method did not score."""


def resolved(scores: Mapping[Hashable, float]) -> dict:
    """Scores with rounding residue set to 0: a score below NUMERICALLY_ZERO of the largest magnitude
    ranks by float noise, not by effect (EAP's gradient through tracr's saturated attention and step-function
    MLPs is 1e-13 to 1e-37 of the top where the exact gradient is 0), so it ties with the exact zeros."""
    top = max((abs(v) for v in scores.values()), default=0.0)
    return {k: (0.0 if abs(v) < NUMERICALLY_ZERO * top else v) for k, v in scores.items()}


def best_cut(scores: Mapping[Hashable, float], positives: set) -> dict | None:
    """The threshold a method's scores would need: of all cuts "select every edge scored >= cut", the
    one with the highest F1 against the truth (the highest cut among equals), with the cut relative
    to the top score (EAP's own cut is relative: 0.01), whether the cut is 0 (after ``resolved``: it
    takes edges the method left unscored), its precision, recall and number selected. An oracle
    measure (it reads the truth), beside the method's own cut; None without positives."""
    n_pos = sum(k in positives for k in scores)
    if not n_pos:
        return None
    scores = resolved(scores)
    best = None
    top = max(scores.values())
    for cut, tp, fp in _cut_counts(scores, positives):
        f1 = 2 * tp / (tp + fp + n_pos)
        if best is None or f1 > best["f1"]:
            relative = cut / top if top > 0 else None
            best = {"f1": f1, "cut": cut, "relative_cut": relative,
                    "numerically_zero": relative is not None and relative < NUMERICALLY_ZERO,
                    "precision": tp / (tp + fp), "recall": tp / n_pos, "n_selected": tp + fp}
    return best


def best_cut_text(best: dict | None) -> str:
    """A best cut as "F1 (precision / recall)", "*" where it is numerically zero; "-" for none."""
    if not best:
        return "-"
    mark = "*" if best["numerically_zero"] else ""
    return f"{best['f1']:.3f} ({best['precision']:.2f} / {best['recall']:.2f}){mark}"


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
    best: dict | None = None  # best_cut of the edge scores (oracle F1)

    def to_dict(self) -> dict:
        return {
            "method": self.method, "granularity": self.granularity, "edge_auroc": self.edge_auroc,
            "node_auroc": self.node_auroc, "precision": self.precision, "recall": self.recall,
            "n_edges": self.n_edges, "n_positive": self.n_positive, "n_constant": self.n_constant,
            "n_selected": self.n_selected, "seconds": round(self.seconds, 3),
            "roc": [[round(x, 6), round(y, 6)] for x, y in self.roc],
            "best_cut": self.best,
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
        best=best_cut(edge_scores, positive),
    )

"""Faithfulness curves, as MIB's circuit localization track scores discovery (Mueller et al. 2025):
the circuit of a method's top-ranked edges at each size of a grid, run with every other edge
ablated, and the share of the full model's behaviour it recovers.

f(C) = (m(C) - m(empty)) / (m(N) - m(empty)), with N the full graph and m a measure of agreement with
the full model. MIB's m is a task metric (a logit difference, an accuracy); ours is the negative
divergence of the outputs from the full model's (exactlens.analysis.circuit.discovery.divergence:
KL of the predicted distributions, squared error for regression — the quantity ACDC minimizes), so
m(N) = 0 exactly and f(C) = 1 - D(C) / D(empty): the share of the ablation's divergence that keeping
C removes. f = 0 for the empty circuit and 1 for the full one by construction; a circuit may
overshoot neither way (f < 0 where it diverges more than nothing at all). Where D(empty) = 0 (the
ablation moves nothing the readout sees) f is undefined and reported so, never divided by zero.

Sizes are fractions of the graph's edges (MIB's grid: 0.1 % ... 100 %); the circuit at size s is the
floor(s * |E|) edges of largest |score| (ties broken by the graph's edge order, as a top-k does).
CPR is the area under f over the grid (trapezoids, x = the fraction of edges each circuit really
keeps, as MIB's evaluator weighs by realised edge counts: on a graph of 60 edges 0.1 % and 1 % both
keep none), CMD the area of |1 - f|; both divided by the span of x, so that f = 1 everywhere gives
CPR 1 and CMD 0.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field

from exactlens.analysis.circuit.ablation import Batch, small_tensor_threads
from exactlens.analysis.circuit.discovery import mean_divergences
from exactlens.analysis.circuit.graph import Edge, ModelGraph
from exactlens.errors import ExactLensError

SIZES = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)
METRICS = ("auroc", "cpr", "cmd")
UNDEFINED_BELOW = 1e-12
"""D(empty) at or below this: the ablation moves nothing the readout sees, f is undefined."""


@dataclass
class DivergenceCache:
    """D(C) per kept edge set, for one model, graph and batches: methods whose top-k agree (and the
    empty circuit every curve needs) run once."""

    model: object
    graph: ModelGraph
    batches: list[Batch]
    values: dict[frozenset, float] = field(default_factory=dict)
    runs: int = 0

    def divergence(self, kept: Collection[Edge]) -> float:
        self.prefetch([kept])
        return self.values[frozenset(kept)]

    def prefetch(self, kept_sets: Sequence[Collection[Edge]]) -> None:
        """D(C) of every kept set not known yet, many per forward pass (exactlens.analysis.circuit.batched)."""
        missing = list(dict.fromkeys(key for key in map(frozenset, kept_sets) if key not in self.values))
        if not missing:
            return
        variants = [[e for e in self.graph.edges if e not in key] for key in missing]
        with small_tensor_threads(self.model):
            values = mean_divergences(self.model, self.graph, self.batches, variants)
        self.values.update(zip(missing, values, strict=True))
        self.runs += len(missing)


def ranked(graph: ModelGraph, scores: Mapping[Edge, float]) -> list[Edge]:
    """The graph's edges by decreasing |score| (unscored edges score 0; ties in graph order)."""
    order = {e: i for i, e in enumerate(graph.edges)}
    return sorted(graph.edges, key=lambda e: (-abs(float(scores.get(e, 0.0))), order[e]))


def size_counts(n_edges: int, sizes: Sequence[float] = SIZES) -> list[int]:
    """How many edges each size keeps: floor(size * n_edges) ("no more than" the fraction, as MIB's
    submissions are bounded), rounded first so that 0.5 * 10 is 5 and not 4."""
    return [int(math.floor(round(s * n_edges, 9))) for s in sizes]


def area(xs: Sequence[float], ys: Sequence[float]) -> float:
    """Trapezoid area under (xs, ys) (xs increasing, repeats allowed: they add nothing), divided by
    the span of xs."""
    total = sum((x1 - x0) * (y0 + y1) / 2 for x0, x1, y0, y1 in zip(xs, xs[1:], ys, ys[1:], strict=False))
    return total / (xs[-1] - xs[0])


@dataclass
class Faithfulness:
    sizes: list[float]
    counts: list[int]
    f: list[float] | None  # None: undefined (reason)
    divergence_empty: float | None
    n_total: int
    reason: str | None = None

    @property
    def fractions(self) -> list[float]:
        """The fraction of edges each circuit actually keeps (the curve's x)."""
        return [n / self.n_total for n in self.counts]

    @property
    def cpr(self) -> float | None:
        return None if self.f is None else area(self.fractions, self.f)

    @property
    def cmd(self) -> float | None:
        return None if self.f is None else area(self.fractions, [abs(1 - v) for v in self.f])

    def points(self) -> list[dict]:
        return [{"size": s, "n_edges": n, "f": None if self.f is None else self.f[i]}
                for i, (s, n) in enumerate(zip(self.sizes, self.counts, strict=True))]

    def to_dict(self) -> dict:
        out = {"faithfulness": self.points(), "cpr": self.cpr, "cmd": self.cmd,
               "divergence_empty": self.divergence_empty}
        if self.reason:
            out["faithfulness_undefined"] = self.reason
        return out


def faithfulness(cache: DivergenceCache, order: Sequence[Edge], sizes: Sequence[float] = SIZES) -> Faithfulness:
    """The curve of the circuits made of the first edges of ``order`` (a ranking of every edge)."""
    sizes = check_sizes(sizes)
    counts = size_counts(len(cache.graph.edges), sizes)
    empty = cache.divergence(())
    n_total = len(cache.graph.edges)
    if not math.isfinite(empty):
        reason = (f"the divergence with every edge ablated is not finite ({empty}): the ablated model divides by "
                  "zero (a layer norm of a zero stream), so f is undefined")
        return Faithfulness(list(sizes), counts, None, None, n_total, reason)
    if not empty > UNDEFINED_BELOW:
        reason = (f"the ablation moves nothing the readout sees (divergence with every edge ablated {empty:.3g}): "
                  "m(full) = m(empty), so f is undefined")
        return Faithfulness(list(sizes), counts, None, empty, n_total, reason)
    cache.prefetch([order[:n] for n in counts])
    f = [1.0 - cache.divergence(order[:n]) / empty for n in counts]
    if not all(math.isfinite(v) for v in f):
        bad = [s for s, v in zip(sizes, f, strict=True) if not math.isfinite(v)]
        reason = f"the circuits at sizes {bad} give a divergence that is not finite, so f is undefined there"
        return Faithfulness(list(sizes), counts, None, empty, n_total, reason)
    return Faithfulness(list(sizes), counts, f, empty, n_total)


def check_sizes(sizes: Sequence[float]) -> list[float]:
    sizes = list(sizes)
    if len(sizes) < 2 or any(not (0 <= s <= 1) for s in sizes) or sorted(set(sizes)) != sizes:
        raise ExactLensError(f"faithfulness sizes are at least two increasing fractions in [0, 1], got {sizes}")
    return sizes


def check_metrics(metrics: Sequence[str] | str) -> tuple[str, ...]:
    items = [m.strip() for m in metrics.split(",")] if isinstance(metrics, str) else list(metrics)
    wrong = [m for m in items if m not in METRICS]
    if not items or wrong:
        raise ExactLensError(f"metrics are a list of {', '.join(METRICS)}; got {metrics!r}")
    return tuple(items)

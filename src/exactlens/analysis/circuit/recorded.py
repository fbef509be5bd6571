"""The ground truth a trained model carries: the circuit a SIIT run recorded (exactlens.train.siit).

A model trained with ``--siit`` has the exact construction's layers and heads and was trained so that
the construction's variables live in its mapped components and the unmapped ones do nothing; its
config metadata (``siit.circuit``) holds the construction's circuit at head granularity, in the node
names both models share. ``discover`` scores a method on such a model against it without being told
(``against`` not given):

* head granularity: the recorded edges;
* qkv granularity: the construction (``siit.construction`` with its parameters) is built again and its
  circuit read at qkv granularity (exactlens.analysis.circuit.truth), in the same node names;
* position granularity: not scored (the recorded circuit has no positions).

The two graphs can differ in their norms (a post-LN preset of a construction without layer norm: the
trained graph is a chain through ``L{l}.LN1``/``LN2`` nodes): a trained edge is then in the circuit when
it lies on a chain through norms that joins two components a recorded edge (or chain) joins.

Constant edges are marked on the trained model's own activations: an edge whose sender's whole output
is the same for every word of a length (resample, mean) or equals its source (cross-length, zero) cannot
be moved by the ablation and is left out of both classes, as for a construction.
"""

from __future__ import annotations

import re
from typing import Any

from exactlens.analysis.circuit.ablation import Batch, unmovable
from exactlens.analysis.circuit.graph import Edge, ModelGraph
from exactlens.analysis.circuit.truth import Circuit, CircuitEdge, derive_circuit
from exactlens.errors import ExactLensError

NORM = re.compile(r"^L\d+\.LN[12]$")  # a post-LN norm node (exactlens.analysis.circuit.graph)
SCORED = ("head", "qkv")
"""The granularities a recorded circuit is scored at."""


def recorded_siit(model: Any) -> dict[str, Any] | None:
    """A SIIT model's record (construction, parameters, circuit), else None; a record whose circuit could
    not be read (``circuit.error``) counts as none."""
    metadata = getattr(getattr(model, "cfg", None), "metadata", None) or {}
    siit = metadata.get("siit") if isinstance(metadata, dict) else None
    if not isinstance(siit, dict) or not isinstance(siit.get("circuit"), dict) or "edges" not in siit["circuit"]:
        return None
    return siit


def truth_source(siit: dict[str, Any], granularity: str) -> dict[str, Any]:
    """What a SIIT model's discovery is scored against (result ``truth``)."""
    how = {"head": "the circuit recorded with the run (siit.circuit)",
           "qkv": "the construction's circuit read again at qkv granularity"}
    return {"source": "siit", "construction": siit["construction"], "granularity": granularity,
            "scored": granularity in SCORED,
            "what": how.get(granularity, "not scored: the recorded circuit has no token positions")}


def recorded_circuit(model: Any, siit: dict[str, Any], graph: ModelGraph, batches: list[Batch]) -> Circuit:
    """The SIIT record's circuit on ``model``'s graph (module docstring), its constant edges marked."""
    if graph.granularity == "head":
        edges = [(e["edge"], tuple(e["features"]), bool(e["through_norm"])) for e in siit["circuit"]["edges"]]
    elif graph.granularity == "qkv":
        from exactlens.constructions import registry

        exact = registry.get(siit["construction"]).make(dtype="float64", **(siit.get("construction_params") or {}))
        edges = [(c.edge.name, c.features, c.through_norm) for c in derive_circuit(exact, "qkv").edges]
    else:
        raise ExactLensError(f"a SIIT model's recorded circuit is scored at {' or '.join(SCORED)} granularity, "
                             f"not {graph.granularity}")
    return lifted(model, graph, edges, batches)


def _joined(edges: list[Edge]) -> dict[tuple[str, str, str | None], Edge]:
    """Edges between components: each chain sender -> norm(s) -> receiver of ``edges`` as the key (sender,
    receiver, slot), mapped to its first edge (without norms: each edge to itself)."""
    out_of: dict[str, list[Edge]] = {}
    for e in edges:
        out_of.setdefault(e.sender, []).append(e)

    def ends(edge: Edge, seen: frozenset) -> Any:
        if not NORM.match(edge.receiver):
            yield edge.receiver, edge.slot
            return
        for nxt in out_of.get(edge.receiver, []):
            if nxt.receiver not in seen:
                yield from ends(nxt, seen | {nxt.receiver})

    return {(e.sender, *end): e for e in edges if not NORM.match(e.sender) for end in ends(e, frozenset())}


def lifted(model: Any, graph: ModelGraph, edges: list[tuple[str, tuple[str, ...], bool]],
           batches: list[Batch]) -> Circuit:
    """The circuit ``edges`` (name, features, through_norm; in the construction's graph) on ``model``'s
    graph, constant edges marked (module docstring). Where both graphs have the same norms these are the
    edges themselves; where they differ (a post-LN model of a construction without layer norm, or the
    reverse) a trained edge is in the circuit when it lies on a chain through norms joining two
    components that a recorded edge (or chain) joins."""
    recorded = [Edge.parse(name) for name, _, _ in edges]
    pairs = set(_joined(recorded))
    info = {Edge.parse(name).sender: (features, norm) for name, features, norm in edges}
    unknown = sorted({n for e in recorded for n in (e.sender, e.receiver)} - set(graph.nodes))
    if unknown:
        raise ExactLensError(f"the recorded circuit's node {unknown[0]} is not a node of {model.cfg.model_name}'s "
                             f"graph ({len(unknown)} such): the model is not shaped like the construction")
    origins: dict[str, set[str]] = {}
    for step in graph.steps:  # computation order: a norm's origins are settled before its readers'
        into = graph.edges_into(step.node)
        origins[step.node] = (set().union(*(origins[e.sender] for e in into)) if NORM.match(step.node) and into
                              else {step.node})
    every = list(range(model.cfg.d_model))
    marked = []
    for e in graph.edges:
        targets = _targets(e, graph)
        hit = {o for o in origins[e.sender] for r, slot in targets if (o, r, slot) in pairs}
        if hit:
            features = tuple(sorted({f for o in hit for f in info.get(o, ((), False))[0]}))
            constant = all(unmovable(b, e.sender, every) for b in batches)
            marked.append(CircuitEdge(e, features, any(info.get(o, ((), False))[1] for o in hit), constant))
    return Circuit(graph, marked)


def _targets(edge: Edge, graph: ModelGraph) -> set[tuple[str, str | None]]:
    """The components (receiver, slot) an edge's chain reaches: itself where its receiver is no norm."""
    if not NORM.match(edge.receiver):
        return {(edge.receiver, edge.slot)}
    reach: set[tuple[str, str | None]] = set()
    for nxt in graph.edges:
        if nxt.sender == edge.receiver:
            reach |= _targets(nxt, graph)
    return reach

"""A discovered circuit of one model against the exact circuit of another model of the same task,
when the two edge graphs need not be the same: the node map, norm chains joined into edges between
components, and the edge and node overlaps after the map.

The trained graph's nodes are mapped onto the exact graph's: embeddings and output by name, heads
through a given head matching (or by (layer, head) index without one), MLPs and post-LN norms by
layer. With the exact circuit's constant edges (the ablation used cannot move them) left out:

* ``edges``: trained edges whose two ends map to an edge of the exact graph, against the exact
  circuit; recall also over the exact edges that have a counterpart at all (a post-LN circuit's
  edges through its norms have none in a pre-LN model); AUROC of the trained edge scores.
* ``edges.between_components``: the same with each post-LN norm chain joined into edges between
  the components it connects (sender -> norms -> receiver is the edge sender -> receiver, scored by
  its weakest edge), on both sides: comparable when one model is post-LN and the other is not. A
  method with a relative cut (EAP, EAP-IG) selects among these joined edges by its cut relative to the
  largest of them (the largest raw edge of a post-LN graph is usually its last norm's, which every path
  crosses).
* ``nodes``: the exact circuit's heads, MLPs and embeddings against the trained nodes that send a
  selected edge (for a relative cut: a selected edge between components; norms are left out, so that a
  pre-LN model can be compared with a post-LN circuit);
  AUROC of the trained node scores.

``exactlens discover --against`` maps heads by index; ``exactlens diff`` by its attention matching.
"""

from __future__ import annotations

from typing import Any

from exactlens.analysis.circuit.discovery import RELATIVE_CUT, Discovery
from exactlens.analysis.circuit.graph import Edge, ModelGraph
from exactlens.analysis.circuit.scoring import auroc, set_overlap
from exactlens.analysis.circuit.truth import Circuit


def node_map(trained: ModelGraph, exact: ModelGraph, matching: list[dict[str, Any]] | None) -> dict[str, str | None]:
    """Trained node -> exact node (None: no counterpart). Heads follow the matching; a layer's MLP and
    norms follow its heads (to the exact layer most of them are matched to); without a matching every
    node keeps its name (heads, MLPs and norms by index); embeddings and output keep their names."""
    exact_nodes = set(exact.nodes)
    heads: dict[str, str] = {}
    layers: dict[int, int] = {}
    if matching is not None:
        heads = {f"L{m['trained_layer']}.H{m['trained_head']}": f"L{m['exact_layer']}.H{m['exact_head']}"
                 for m in matching}
        for layer in {m["trained_layer"] for m in matching}:
            targets = [m["exact_layer"] for m in matching if m["trained_layer"] == layer]
            layers[layer] = min(set(targets), key=lambda t: (-targets.count(t), t))
    mapping: dict[str, str | None] = {}
    for step in trained.steps:
        if step.kind == "head" and matching is not None:
            name = heads.get(step.node)
        elif step.kind in ("mlp", "norm") and matching is not None:
            part = step.node.split(".", 1)[1]
            name = f"L{layers[step.layer]}.{part}" if step.layer in layers else None
        else:
            name = step.node
        mapping[step.node] = name if name in exact_nodes else None
    return mapping


def between_components(graph: ModelGraph, values: dict[Edge, float]) -> dict[Edge, float]:
    """Edges between components: an edge into a post-LN norm continues along the norm's edges in
    ``values`` (a post-LN stream passes through a norm between any two components), so a path
    sender -> norm(s) -> receiver becomes the edge sender -> receiver; its value is the path's
    weakest edge's, the best path's where there are several. Without norms: ``values`` itself."""
    norms = {s.node for s in graph.steps if s.kind == "norm"}
    out: dict[str, list[Edge]] = {}
    for e in values:
        out.setdefault(e.sender, []).append(e)

    def ends(edge: Edge, weakest: float):
        if edge.receiver not in norms:
            yield edge.receiver, edge.slot, weakest
            return
        for nxt in out.get(edge.receiver, []):
            yield from ends(nxt, min(weakest, values[nxt]))

    joined: dict[Edge, float] = {}
    for e, v in values.items():
        if e.sender in norms:
            continue
        for receiver, slot, weakest in ends(e, v):
            key = Edge(e.sender, receiver, slot)
            joined[key] = max(joined.get(key, weakest), weakest)
    return joined


def joined_selection(graph: ModelGraph, found: Discovery, joined: dict[Edge, float] | None = None) -> set[Edge]:
    """The discovery's selection between components (``joined``: its scores joined, when already made). A
    method with an absolute cut keeps the chains all of whose edges it selected. A relative cut (EAP,
    EAP-IG) is taken among the joined edges: in a post-LN graph the largest raw score is usually the last
    norm's edge into the output, which every path crosses, and 1 % of it can drop every edge between
    components (measured: a trained post-LN FIRST at |w| = 10 kept only L1.LN2 -> output). Without norms
    the joined edges are the raw ones and this is the method's own selection."""
    if found.method not in RELATIVE_CUT:
        return set(between_components(graph, {e: 1.0 for e in found.selected}))
    joined = between_components(graph, dict(found.edge_scores)) if joined is None else joined
    top = max(joined.values(), default=0.0)
    return {e for e, v in joined.items() if top > 0 and v > found.threshold * top}


def _component_overlap(t_graph: ModelGraph, t_scores: dict[Edge, float], t_selected: set[Edge], truth: Circuit,
                       mapping: dict[str, str | None]) -> dict[str, Any]:
    """The edge overlap between components (norm chains joined into edges on both sides): ``t_scores`` and
    ``t_selected`` are the trained side's joined scores and selection."""
    e_graph = truth.graph
    e_all = set(between_components(e_graph, {e: 1.0 for e in e_graph.edges}))
    flags = between_components(e_graph, {c.edge: 0.0 if c.constant else 1.0 for c in truth.edges})
    positive = {e for e, v in flags.items() if v == 1.0}
    constant = {e for e, v in flags.items() if v == 0.0}

    def key(edge: Edge) -> Any:
        sender, receiver = mapping.get(edge.sender), mapping.get(edge.receiver)
        twin = Edge(sender, receiver, edge.slot) if sender and receiver else None
        return twin if twin in e_all else ("trained", edge)

    scores = {key(e): v for e, v in t_scores.items() if key(e) not in constant}
    selected = {key(e) for e in t_selected} - constant
    reachable = {key(e) for e in t_scores} & e_all
    result = set_overlap(selected, positive)
    result.update({
        "auroc": auroc(scores, positive),
        "truth_with_counterpart": len(positive & reachable),
        "shared_edges": sorted(e.name for e in selected & positive),
        "exact_only": sorted(e.name for e in positive - selected),
        "found_only": sorted(e.name if isinstance(e, Edge) else f"trained:{e[1].name}" for e in selected - positive),
    })
    return result


def compare_with_circuit(t_graph: ModelGraph, found: Discovery, truth: Circuit,
                         matching: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """``found`` (a discovery on a model with graph ``t_graph``) against ``truth`` (an exact circuit
    with its constant edges marked) after the node map: ``node_map``, ``edges`` (with
    ``between_components``), ``nodes`` and ``trained_edges`` (each trained edge with its score, the
    exact edge it maps to and whether that one is constant); see the module docstring."""
    e_graph = truth.graph
    positive = {c.edge for c in truth.edges if not c.constant}
    constant = {c.edge for c in truth.edges if c.constant}
    mapping = node_map(t_graph, e_graph, matching)
    exact_edges = set(e_graph.edges)

    def mapped(edge: Edge) -> Edge | None:
        sender, receiver = mapping[edge.sender], mapping[edge.receiver]
        if sender is None or receiver is None:
            return None
        twin = Edge(sender, receiver, edge.slot)
        return twin if twin in exact_edges else None

    twins = {e: mapped(e) for e in t_graph.edges}

    def key(edge: Edge) -> Any:  # an edge without a twin is a negative of its own
        return twins[edge] or ("trained", edge)

    edge_scores = {key(e): v for e, v in found.edge_scores.items() if twins[e] not in constant}
    selected = {key(e) for e in found.selected if twins[e] not in constant}
    reachable = {twins[e] for e in t_graph.edges if twins[e] is not None}

    countable = {s.node for s in e_graph.steps if s.kind not in ("norm", "output")}
    truth_nodes = {e.sender for e in positive} & countable
    t_countable = {n for n in t_graph.senders if t_graph.step(n).kind != "norm"}
    node_scores = {(mapping[n] or f"trained:{n}"): found.node_scores.get(n, 0.0) for n in t_countable}
    joined_scores = between_components(t_graph, dict(found.edge_scores))
    joined = joined_selection(t_graph, found, joined_scores)
    # a relative cut's nodes are the senders of its selection between components (see joined_selection)
    node_edges = joined if found.method in RELATIVE_CUT else found.selected
    found_nodes = {mapping[e.sender] or f"trained:{e.sender}" for e in node_edges} & set(node_scores)

    edges = set_overlap(selected, positive)
    edges.update({
        "auroc": auroc(edge_scores, positive),
        "truth_with_counterpart": len(positive & reachable),
        "recall_of_reachable": set_overlap(selected, positive & reachable)["recall"],
        "constant_left_out": len(constant),
        "shared_edges": sorted(e.name for e in selected & positive),
        "trained_only": sorted(e.name if isinstance(e, Edge) else f"trained:{e[1].name}" for e in selected - positive),
        "exact_only": sorted(e.name for e in positive - selected),
    })
    edges["between_components"] = _component_overlap(t_graph, joined_scores, joined, truth, mapping)
    nodes = set_overlap(found_nodes, truth_nodes)
    nodes.update({"auroc": auroc(node_scores, truth_nodes), "shared_nodes": sorted(found_nodes & truth_nodes),
                  "trained_only": sorted(found_nodes - truth_nodes), "exact_only": sorted(truth_nodes - found_nodes)})
    return {
        "node_map": mapping,
        "trained_edges": [{"edge": e.name, "score": float(found.edge_scores.get(e, 0.0)),
                           "selected": e in found.selected,
                           "exact_edge": twins[e].name if twins[e] is not None else None,
                           "exact_constant": twins[e] in constant} for e in t_graph.edges],
        "edges": edges,
        "nodes": nodes,
    }

"""The ground-truth circuit of a hand-built model, derived from its weights (never written by hand).

A construction's residual stream has named features (``cfg.residual_labels``) and its weights are
exactly zero wherever the recipe does not connect two things, so the features each node *writes*
and each receiver *reads* can be read off the weights:

* writes: embed — the non-zero columns of W_E; pos — of W_pos / W_feat; head h — of W_V[h] W_O[h]
  (and b_V[h] W_O[h]); MLP — of W_out; a norm — where its gain or bias is non-zero;
* reads: a head's queries — the non-zero rows of W_Q[h] W_K[h]^T, its keys — the non-zero columns
  (and those of b_Q[h] W_K[h]^T), its values — the non-zero rows of W_V[h] W_O[h]; an MLP — the
  non-zero rows of W_in (units with a non-zero output row); the output — the non-zero rows of W_U.
  A receiver behind a layer norm reads every feature: LN's mean and scale couple them.

An edge is in the circuit when its sender writes a feature its receiver reads and the receiver is
*live* (some path of circuit edges leads from it to the output); the edge carries those features.
Edges that the ablation in use cannot move are in the circuit but marked ``constant``
(exactlens.analysis.circuit.ablation.mark_constant): under resample or mean ablation those whose
carried activation is the same for every word of a length (the [CLS] indicator, the "one" direction,
i/n), under cross-length ablation those equal to their aligned source.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import torch

from exactlens.analysis.circuit.graph import Edge, ModelGraph, Step, model_graph

RELATIVE_ZERO = 1e-12  # entries below this times the matrix's largest entry count as zero


def _nonzero(matrix: torch.Tensor, dim: int) -> set[int]:
    """Indices along ``dim`` (0: rows, 1: columns) of a 2-D matrix with a non-zero entry."""
    mat = matrix.detach().double().abs()
    scale = float(mat.max()) if mat.numel() else 0.0
    if scale == 0.0:
        return set()
    live = (mat > RELATIVE_ZERO * scale).any(dim=1 - dim)
    return {int(i) for i in torch.nonzero(live).flatten()}


def _norm_of(model, step: Step):
    block = model.blocks[step.layer]
    if step.kind == "norm":
        return getattr(block, step.which)
    if block.norm == "pre":
        return block.ln1 if step.kind == "head" else block.ln2
    return None


def writes(model, step: Step) -> set[int]:
    cfg = model.cfg
    if step.kind == "embed":
        return _nonzero(model.embed.W_E, 1)
    if step.kind == "pos":
        table = model.pos_embed.W_pos if cfg.learned_positions else model.pos_embed.W_feat
        return _nonzero(table, 1)
    if step.kind == "output":
        return set()
    block = model.blocks[step.layer]
    if step.kind == "head":
        attn = block.attn
        ov = attn.W_V[step.head] @ attn.W_O[step.head]
        return _nonzero(torch.cat([ov, (attn.b_V[step.head] @ attn.W_O[step.head]).unsqueeze(0)]), 1)
    if step.kind == "mlp":
        return _nonzero(block.mlp.W_out, 1)
    if step.kind == "norm":
        ln = getattr(block, step.which)
        return _nonzero(torch.stack([ln.w, ln.b]), 1)
    raise ValueError(f"unknown node kind {step.kind!r}")


def reads(model, step: Step, slot: str | None) -> set[int]:
    """Residual features the receiving input depends on (every feature behind a layer norm)."""
    cfg = model.cfg
    every = set(range(cfg.d_model))
    if step.kind == "norm":
        return every
    if step.kind != "output" and _norm_of(model, step) is not None:
        ln = _norm_of(model, step)
        return _nonzero(ln.W_select, 0) if hasattr(ln, "W_select") else every
    if step.kind == "output":
        return every if cfg.final_ln else _nonzero(model.unembed.W_U, 0)
    block = model.blocks[step.layer]
    if step.kind == "mlp":
        mlp = block.mlp
        units = sorted(_nonzero(mlp.W_out, 0))
        return _nonzero(mlp.W_in[:, units], 0) if units else set()
    attn, h = block.attn, step.head
    qk = attn.W_Q[h] @ attn.W_K[h].T
    by_slot = {
        "q": lambda: _nonzero(qk, 0),
        "k": lambda: _nonzero(torch.cat([qk, (attn.b_Q[h] @ attn.W_K[h].T).unsqueeze(0)]), 1),
        "v": lambda: _nonzero(attn.W_V[h] @ attn.W_O[h], 0),
    }
    return by_slot[slot]() if slot else set().union(*(f() for f in by_slot.values()))


@dataclass(frozen=True)
class CircuitEdge:
    edge: Edge
    features: tuple[str, ...]  # residual labels the edge carries
    through_norm: bool  # the receiver reads it through a layer norm (it reads every feature)
    constant: bool | None = None  # the ablation in use cannot move the carried activation (None: not measured)

    def to_dict(self) -> dict:
        out = {"edge": self.edge.name, "sender": self.edge.sender, "receiver": self.edge.target,
               "features": list(self.features), "through_norm": self.through_norm, "constant": self.constant}
        if self.edge.position is not None:
            out["position"] = self.edge.position
        return out


@dataclass
class Circuit:
    """A model's ground-truth circuit at one granularity: its edges (with the features they carry)
    among all the graph's edges."""

    graph: ModelGraph
    edges: list[CircuitEdge]

    @cached_property
    def edge_set(self) -> frozenset[Edge]:
        return frozenset(c.edge for c in self.edges)

    @property
    def nodes(self) -> list[str]:
        inside = {c.edge.sender for c in self.edges} | {c.edge.receiver for c in self.edges}
        return [n for n in self.graph.nodes if n in inside]

    def contains(self, edge: Edge) -> bool:
        return edge in self.edge_set

    def to_dict(self) -> dict:
        return {
            "granularity": self.graph.granularity,
            "nodes": self.graph.nodes,
            "circuit_nodes": self.nodes,
            "n_edges": len(self.graph.edges),
            "graph_edges": [e.name for e in self.graph.edges],
            "n_circuit_edges": len(self.edges),
            "edges": [c.to_dict() for c in self.edges],
        }


def derive_circuit(model, granularity: str = "head") -> Circuit:
    """The circuit read off the weights (module docstring); ``constant`` is left unmeasured."""
    graph = model_graph(model, granularity)
    labels = model.cfg.residual_labels or tuple(f"d{i}" for i in range(model.cfg.d_model))
    wrote = {s.node: writes(model, s) for s in graph.steps}
    read = {e.target: reads(model, graph.step(e.receiver), e.slot) for e in graph.edges}
    carried = {e: sorted(wrote[e.sender] & read[e.target]) for e in graph.edges}
    live = {"output"}
    for step in reversed(graph.steps):  # receivers after senders: one backward sweep settles liveness
        if step.node in live:
            live |= {e.sender for e in graph.edges_into(step.node) if carried[e]}
    edges = [
        CircuitEdge(e, tuple(labels[i] for i in carried[e]), _through_norm(model, graph.step(e.receiver)))
        for e in graph.edges if carried[e] and e.receiver in live
    ]
    return Circuit(graph, edges)


def _through_norm(model, step: Step) -> bool:
    if step.kind == "norm":
        return True
    if step.kind == "output":
        return bool(model.cfg.final_ln)
    return _norm_of(model, step) is not None

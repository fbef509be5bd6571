"""The exact circuit resolved per token position (``position`` granularity), derived from the qkv
circuit read off the weights, the attention masks, the readout and the words' activations.

Which positions of a circuit edge matter follows backwards from the readout: the output is *live* at
the positions the task's metric reads (the [CLS] or last position, or every symbol position); a live
MLP, norm or output at position i reads its input at i; a head live at query position i reads its
query input at i and its key and value inputs at every key position its mask lets i see. A qkv circuit
edge at position p is in the position circuit when its receiving input is live at p. It is
``constant`` there when the ablation cannot move its carried features at p (the same for every word
of the length under resample or mean ablation, equal to the source under zero or cross-length); a
constant edge carries no information, so it makes its sender live only when it is not constant
(FIRST's FFN output is 0 at every position but the first symbol, so only there do its inputs count).

That last rule reads the words, so the result is checked the way the weights' circuit is: ablating
every edge outside it changes no decision (tests).
"""

from __future__ import annotations

import torch

from exactlens.analysis.circuit.ablation import Batch, unmovable
from exactlens.analysis.circuit.discovery import evidence, logit_difference
from exactlens.analysis.circuit.graph import POSITION, Edge, ModelGraph
from exactlens.analysis.circuit.truth import Circuit, CircuitEdge, derive_circuit
from exactlens.errors import ExactLensError
from exactlens.model.components import visible_keys


def readout_positions(model, batch: Batch) -> set[int]:
    """The token positions whose outputs the discovery metric reads: where the gradient of the logit
    difference (linear in the logits) with respect to the logits is non-zero."""
    logits = batch.clean.logits.detach().clone().requires_grad_(True)
    with torch.enable_grad():
        clean = evidence(model, batch.clean.logits, batch.n_positions).detach()
        logit_difference(model, clean, evidence(model, logits, batch.n_positions), batch.n_positions,
                         batch.truth).backward()
    read = (logits.grad != 0).reshape(logits.shape[0], logits.shape[1], -1).any(-1).any(0)
    return {int(p) for p in torch.nonzero(read).flatten()}


def _visible(model, layer: int, batch: Batch) -> torch.Tensor:
    """Bool [query, key]: may query i read key j in this layer (on some word of the batch)."""
    n_pos = batch.tokens.shape[1]
    allowed = visible_keys(model.blocks[layer].attn.mask, n_pos, batch.n_positions, False)
    if allowed is None:
        return torch.ones(n_pos, n_pos, dtype=torch.bool)
    return allowed.reshape(-1, n_pos, n_pos).any(0).cpu()


def position_circuit(model, graph: ModelGraph, batches: list[Batch]) -> Circuit:
    """The position-resolved circuit with its constant edges marked (module docstring); ``batches``:
    words of the graph's one length."""
    if graph.granularity != POSITION:
        raise ExactLensError(f"a position circuit needs a graph at position granularity, got {graph.granularity}")
    whole = derive_circuit(model, "qkv")
    labels = model.cfg.residual_labels or tuple(f"d{i}" for i in range(model.cfg.d_model))
    index = {label: i for i, label in enumerate(labels)}
    by_receiver: dict[str, list[CircuitEdge]] = {}
    for c in whole.edges:
        by_receiver.setdefault(c.edge.receiver, []).append(c)
    n_pos = graph.n_positions
    live = {"output": set().union(*(readout_positions(model, b) for b in batches))}
    found: list[CircuitEdge] = []
    for step in reversed(graph.steps):
        at = live.get(step.node, set())
        if not at or step.node not in by_receiver:
            continue
        if step.kind == "head":
            seen = _visible(model, step.layer, batches[0])
            keys = {j for i in at for j in range(n_pos) if seen[i, j]}
            inputs = {"q": at, "k": keys, "v": keys}
        else:
            inputs = {None: at}
        for c in by_receiver[step.node]:
            dims = [index[f] for f in c.features]
            for p in sorted(inputs[c.edge.slot]):
                constant = all(unmovable(b, c.edge.sender, dims, p) for b in batches)
                edge = Edge(c.edge.sender, c.edge.receiver, c.edge.slot, p)
                found.append(CircuitEdge(edge, c.features, c.through_norm, constant))
                if not constant:
                    live.setdefault(c.edge.sender, set()).add(p)
    order = {e: i for i, e in enumerate(graph.edges)}
    return Circuit(graph, sorted(found, key=lambda c: order[c.edge]))

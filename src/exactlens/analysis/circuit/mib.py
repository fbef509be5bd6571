"""Circuits in and out in MIB's circuit file format (Mueller et al. 2025, circuit localization
track), so that a circuit found by another tool can be scored against an exact one and ours can be
loaded elsewhere.

The format (MIB's example ``circuits/ioi-eap-ig.json``, the layout of the EAP-IG library's graph
JSON, which MIB's evaluation loads) is one JSON object:

* ``cfg``: ``{"n_layers", "n_heads", "parallel_attn_mlp", "d_model"}``;
* ``nodes``: ``{name: {"in_graph": bool}}`` with names ``input`` (the embeddings: token and position
  together, the stream before layer 0), ``a{L}.h{H}`` (attention heads), ``m{L}`` (MLPs), ``logits``;
* ``edges``: ``{"SENDER->RECEIVER": {"score": float, "in_graph": bool}}``, a receiving head's input
  written ``<q>``, ``<k>`` or ``<v>`` (``input->a0.h1<q>``); every edge of a TransformerLens model of
  that size (a sender feeds every later receiver; ``m{L}`` reads layer L's heads).

What maps and what does not: ``embed`` and ``pos`` are both MIB's ``input`` (an ``input`` edge is in
the circuit when either is; its score is the larger); at head granularity a head's one input is
written as its three, read back as in the circuit when any of them is (score: the largest |score|).
MIB's graph has no layer-norm nodes, so post-LN models (whose norms are nodes here) cannot be
written. A model without MLPs, or without the residual around them, lacks some MIB edges: they are
written out of the circuit with score 0, and reading a file that puts one of them in the circuit is
refused. A top-level ``exactlens`` object (ignored by MIB) keeps what MIB cannot hold: the model,
the granularity and each ``input`` edge's split between ``embed`` and ``pos``, so our own files
round-trip exactly.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from exactlens.analysis.circuit.graph import Edge, ModelGraph
from exactlens.errors import ExactLensError

FORMAT_VERSION = "MIB circuit JSON (cfg / nodes / edges, EAP-IG graph layout, edge level)"
EXTRA_KEY = "exactlens"
_EDGE = re.compile(r"^(?P<sender>[^<>]+)->(?P<receiver>[^<>]+?)(?:<(?P<slot>[qkv])>)?$")
_HEAD = re.compile(r"^a(?P<layer>\d+)\.h(?P<head>\d+)$")
_MLP = re.compile(r"^m(?P<layer>\d+)$")


def mib_nodes(n_layers: int, n_heads: int) -> list[str]:
    """MIB's nodes in computation order."""
    names = ["input"]
    for layer in range(n_layers):
        names += [f"a{layer}.h{h}" for h in range(n_heads)] + [f"m{layer}"]
    return names + ["logits"]


def mib_edges(n_layers: int, n_heads: int) -> list[tuple[str, str, str | None]]:
    """MIB's edges (sender, receiver, slot) in its order: each receiver reads every earlier sender."""
    edges = []
    before = ["input"]
    for layer in range(n_layers):
        heads = [f"a{layer}.h{h}" for h in range(n_heads)]
        edges += [(s, h, slot) for h in heads for slot in "qkv" for s in before]
        edges += [(s, f"m{layer}", None) for s in before + heads]
        before = before + heads + [f"m{layer}"]
    return edges + [(s, "logits", None) for s in before]


def mib_name(sender: str, receiver: str, slot: str | None) -> str:
    return f"{sender}->{receiver}" + (f"<{slot}>" if slot else "")


def _ours(node: str) -> list[str]:
    """Our nodes behind a MIB node (``input``: the embeddings)."""
    if node == "input":
        return ["embed", "pos"]
    if node == "logits":
        return ["output"]
    head = _HEAD.match(node)
    if head:
        return [f"L{head['layer']}.H{head['head']}"]
    mlp = _MLP.match(node)
    if mlp:
        return [f"L{mlp['layer']}.MLP"]
    raise ExactLensError(f"{node!r} is not a MIB node (input, a<L>.h<H>, m<L>, logits)")


def _counterparts(graph: ModelGraph, sender: str, receiver: str, slot: str | None) -> list[Edge]:
    """Our edges behind one MIB edge (none where the model lacks it)."""
    our_slot = slot if graph.granularity == "qkv" else None
    found = [Edge(s, r, our_slot) for s in _ours(sender) for r in _ours(receiver)]
    return [e for e in found if e in graph.edge_set]


def _check_positionless(graph: ModelGraph) -> None:
    if graph.n_positions is not None:
        raise ExactLensError("MIB's circuit format has no token positions: write or read circuits at head or qkv "
                             "granularity, not position")


def _check_writable(graph: ModelGraph) -> None:
    _check_positionless(graph)
    norms = [s.node for s in graph.steps if s.kind == "norm"]
    if norms:
        raise ExactLensError(f"MIB's circuit format has no layer-norm nodes, and this post-LN model's graph has "
                             f"{', '.join(norms[:3])}{' ...' if len(norms) > 3 else ''}: it cannot be written")


def _size(model) -> tuple[int, int]:
    return int(model.cfg.n_layers), int(model.cfg.n_heads)


def to_mib(model, graph: ModelGraph, selected: set[Edge], scores: Mapping[Edge, float] | None = None,
           *, what: str = "") -> dict[str, Any]:
    """A circuit (``selected``, with optional ``scores``; without them a circuit edge scores 1) as a
    MIB circuit object."""
    _check_writable(graph)
    scores = {e: (1.0 if e in selected else 0.0) for e in graph.edges} if scores is None else scores
    n_layers, n_heads = _size(model)
    edges: dict[str, dict[str, Any]] = {}
    split: dict[str, dict[str, list]] = {}
    touched: set[str] = set()
    for sender, receiver, slot in mib_edges(n_layers, n_heads):
        name = mib_name(sender, receiver, slot)
        ours = _counterparts(graph, sender, receiver, slot)
        inside = any(e in selected for e in ours)
        edges[name] = {"score": max((float(scores.get(e, 0.0)) for e in ours), default=0.0), "in_graph": inside}
        if inside:
            touched |= {sender, receiver}
        if len(ours) > 1:
            split[name] = {e.sender: [float(scores.get(e, 0.0)), e in selected] for e in ours}
    nodes = {n: {"in_graph": n in touched} for n in mib_nodes(n_layers, n_heads)}
    cfg = {"n_layers": n_layers, "n_heads": n_heads, "parallel_attn_mlp": False, "d_model": int(model.cfg.d_model)}
    extra = {"format": FORMAT_VERSION, "model": model.cfg.model_name, "granularity": graph.granularity,
             "what": what, "input_split": split}
    return {"cfg": cfg, "nodes": nodes, "edges": edges, EXTRA_KEY: extra}


def write_mib(path: str | Path, data: dict[str, Any], *, overwrite: bool = False) -> Path:
    from exactlens.outputs import write_text

    return write_text(path, json.dumps(data) + "\n", overwrite=overwrite, what="circuit file")


def load_mib(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise ExactLensError(f"circuit file {str(path)!r} does not exist")
    from exactlens.jsonio import read_json

    return read_json(path, f"circuit file {str(path)!r}", strict=False)  # a MIB file may hold NaN scores


def from_mib(data: Any, model, graph: ModelGraph, where: str = "circuit file") -> tuple[set[Edge], dict[Edge, float],
                                                                                     bool]:
    """The circuit in a MIB circuit object, on this model's graph: (edges in the circuit, |score| of
    every edge, whether the file had scores). Refuses, in one line naming the first bad edge, an edge
    that is malformed, names a node or slot this model lacks, or is in the circuit where this model
    has no such edge."""
    _check_positionless(graph)
    if not isinstance(data, dict) or not isinstance(data.get("edges"), dict):
        raise ExactLensError(f"{where}: a MIB circuit is a JSON object with an 'edges' object, got "
                             f"{type(data).__name__}{' without edges' if isinstance(data, dict) else ''}")
    n_layers, n_heads = _size(model)
    cfg = data.get("cfg")
    if isinstance(cfg, dict):
        theirs = (cfg.get("n_layers"), cfg.get("n_heads"))
        if theirs != (n_layers, n_heads):
            raise ExactLensError(f"{where}: the circuit is for a model of {theirs[0]} layers x {theirs[1]} heads, "
                                 f"{model.cfg.model_name} has {n_layers} x {n_heads}")
    split = (data.get(EXTRA_KEY) or {}).get("input_split") or {}
    selected: set[Edge] = set()
    scores: dict[Edge, float] = {}
    has_scores = False
    for name, entry in data["edges"].items():
        match = _EDGE.match(name) if isinstance(name, str) else None
        bad = _bad_edge(match, entry, n_layers, n_heads)
        if bad:
            raise ExactLensError(f"{where}: edge {name!r}: {bad}")
        sender, receiver, slot = match["sender"], match["receiver"], match["slot"]
        inside = entry["in_graph"]
        ours = _counterparts(graph, sender, receiver, slot)
        if inside and not ours:
            raise ExactLensError(f"{where}: edge {name!r} is in the circuit, but {model.cfg.model_name} has no such "
                                 f"edge (nodes {', '.join(_ours(sender))} -> {', '.join(_ours(receiver))})")
        score = abs(float(entry.get("score", 1.0 if inside else 0.0)))
        has_scores = has_scores or "score" in entry
        parts = _split_of(split.get(name), ours, inside)
        for e in ours:
            e_score, e_inside = parts[e.sender] if parts else (score, inside)
            scores[e] = max(scores.get(e, 0.0), e_score)
            if e_inside:
                selected.add(e)
    return selected, {e: scores.get(e, 0.0) for e in graph.edges}, has_scores


def _split_of(parts: Any, ours: list[Edge], inside: bool) -> dict[str, tuple[float, bool]] | None:
    """Our own file's split of an ``input`` edge between embed and pos, where it covers every
    counterpart and agrees with the MIB entry (another tool may have edited the entry: then the entry
    holds for both)."""
    if not isinstance(parts, dict) or len(ours) < 2:
        return None
    try:
        split = {e.sender: (abs(float(parts[e.sender][0])), bool(parts[e.sender][1])) for e in ours}
    except (KeyError, TypeError, ValueError, IndexError):
        return None
    return split if any(v[1] for v in split.values()) == inside else None


def _bad_edge(match, entry: Any, n_layers: int, n_heads: int) -> str | None:
    if match is None:
        return "not 'SENDER->RECEIVER' or 'SENDER->a<L>.h<H><q|k|v>'"
    if not isinstance(entry, dict) or not isinstance(entry.get("in_graph"), bool):
        return "needs an object with in_graph true or false"
    score = entry.get("score", 0.0)
    if isinstance(score, bool) or not isinstance(score, (int, float)) or not math.isfinite(score):
        return f"score must be a finite number, got {score!r}"
    nodes = set(mib_nodes(n_layers, n_heads))
    order = {n: i for i, n in enumerate(mib_nodes(n_layers, n_heads))}
    sender, receiver, slot = match["sender"], match["receiver"], match["slot"]
    for node in (sender, receiver):
        if node not in nodes:
            return f"the model ({n_layers} layers x {n_heads} heads) has no node {node!r}"
    if sender == "logits" or receiver == "input":
        return "logits sends nothing and input receives nothing"
    if (slot is not None) != bool(_HEAD.match(receiver)):
        return "a head's input is written <q>, <k> or <v>, and only a head's"
    if not _reads(sender, receiver, order):
        return f"{receiver} does not read {sender} (it comes later)"
    return None


def _reads(sender: str, receiver: str, order: dict[str, int]) -> bool:
    """A receiver reads the senders before it; heads of one layer read no head of theirs."""
    if order[sender] >= order[receiver]:
        return False
    head_s, head_r = _HEAD.match(sender), _HEAD.match(receiver)
    return not (head_s and head_r and head_s["layer"] == head_r["layer"])

"""Edge ablations on a task's words: resample (each word's edge reads the activation of another word
of the same length) or mean (the mean over the words), and the checks a ground-truth circuit must
pass — ablating every edge outside it leaves the decisions unchanged; ablating one edge inside it
changes a decision on some word.
"""

from __future__ import annotations

import weakref
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

import torch

from exactlens.analysis.circuit.forward import GraphRun, mean_outputs, run_graph
from exactlens.analysis.circuit.graph import Edge, ModelGraph
from exactlens.analysis.circuit.truth import Circuit, CircuitEdge
from exactlens.devices import device_of
from exactlens.errors import ExactLensError
from exactlens.resources import torch_threads
from exactlens.tasks import reader as task_reader

ABLATIONS = ("resample", "mean")

_READERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def small_tensor_threads(model):
    """One torch thread for the edge-by-edge loops on the CPU: thousands of operations on tensors of a
    few thousand numbers, where a second thread only adds synchronization (measured on the shared
    2-core machine: ACDC on parity at qkv granularity 0.22 s with one thread, 30 s with two)."""
    return torch_threads(1 if device_of(model).type == "cpu" else None)


def model_reader(model) -> Any:
    """The model's task reader, built once per model and task spec (ablation searches such as ACDC
    decide thousands of times; building the task from its spec each time dominated small models)."""
    key = (repr(getattr(model.cfg, "task", None)), getattr(model.cfg, "decision_rule", None))
    hit = _READERS.get(model)
    if hit is None or hit[0] != key:
        hit = (key, task_reader(model))
        _READERS[model] = hit
    return hit[1]


@dataclass
class Batch:
    """Words of one length, their tokens, and the clean and source (ablation) runs."""

    tokens: torch.Tensor
    n_positions: torch.Tensor
    clean: GraphRun
    source: dict[str, torch.Tensor]


def make_batch(model, graph: ModelGraph, ids: torch.Tensor, ablation: str = "resample", seed: int = 0) -> Batch:
    """Encode symbol ids [B, L] with the model's task and run them; the source of a resample ablation
    is the run on the same words in another order (each word reads another word's activations)."""
    if ablation not in ABLATIONS:
        raise ExactLensError(f"ablation {ablation!r} is unknown; choose one of {', '.join(ABLATIONS)}")
    task = model_reader(model).task
    encoded = task.encode(ids)
    where = device_of(model)  # words are drawn on the CPU; the model may sit on a GPU
    tokens, n_positions = encoded.tokens.to(where), encoded.n_positions.to(where)
    with torch.no_grad():
        clean = run_graph(model, graph, tokens, n_positions)
    if ablation == "mean":
        source = mean_outputs(clean)
    else:  # a random cyclic derangement: word p[i] reads word p[i+1] (seeded: reproducible)
        order = torch.randperm(len(ids), generator=torch.Generator().manual_seed(seed)).to(where)
        other = torch.empty_like(order)
        other[order] = order.roll(-1)
        source = {node: out[other] for node, out in clean.outputs.items()}
    return Batch(tokens, n_positions, clean, source)


def decisions(model, logits: torch.Tensor, n_positions: torch.Tensor) -> torch.Tensor:
    """The model's decisions from full logits (its task's reader)."""
    return model_reader(model).decide(model.select_readout(logits, n_positions), n_positions)


def changed_words(model, graph: ModelGraph, batch: Batch, edges: Collection[Edge]) -> torch.Tensor:
    """bool [B]: the words whose decision changes when these edges are ablated."""
    with torch.no_grad():
        patched = run_graph(model, graph, batch.tokens, batch.n_positions, patched=edges, source=batch.source)
    before = decisions(model, batch.clean.logits, batch.n_positions)
    after = decisions(model, patched.logits, batch.n_positions)
    differs = before != after
    return differs.reshape(differs.shape[0], -1).any(1)


def mark_constant(circuit: Circuit, batches: list[Batch], model) -> Circuit:
    """Mark each circuit edge whose carried features take the same value for every word of a length
    (on these batches: exhaustive ones make it exact) as ``constant``."""
    labels = model.cfg.residual_labels or tuple(f"d{i}" for i in range(model.cfg.d_model))
    index = {label: i for i, label in enumerate(labels)}
    marked = []
    for c in circuit.edges:
        dims = [index[f] for f in c.features]
        same = all(_same_for_every_word(b.clean.outputs[c.edge.sender][..., dims]) for b in batches)
        marked.append(CircuitEdge(c.edge, c.features, c.through_norm, same))
    return Circuit(circuit.graph, marked)


def _same_for_every_word(values: torch.Tensor) -> bool:
    """Every row equals the first (NaN equal to NaN: eps = 0 layer norms give NaN at positions that
    nothing reads)."""
    first = values[:1]
    return bool(((values == first) | (values.isnan() & first.isnan())).all())


@dataclass
class CircuitCheck:
    """What ablations say about a circuit on some words."""

    outside_changed: int  # words whose decision changes with every edge outside the circuit ablated
    inside_changed: dict[str, int]  # edge -> words whose decision changes with that edge alone ablated
    n_words: int

    @property
    def unnecessary(self) -> list[str]:
        """Circuit edges whose ablation alone changed no decision."""
        return [name for name, n in self.inside_changed.items() if n == 0]

    def to_dict(self) -> dict:
        return {"n_words": self.n_words, "outside_changed": self.outside_changed,
                "inside_changed": self.inside_changed, "unnecessary": self.unnecessary}


def check_circuit(model, circuit: Circuit, batches: list[Batch]) -> CircuitCheck:
    """Ablate every edge outside the circuit at once, then each non-constant edge inside it alone."""
    outside = [e for e in circuit.graph.edges if not circuit.contains(e)]
    with small_tensor_threads(model):
        outside_changed = sum(int(changed_words(model, circuit.graph, b, outside).sum()) for b in batches)
        inside = {
            c.edge.name: sum(int(changed_words(model, circuit.graph, b, [c.edge]).sum()) for b in batches)
            for c in circuit.edges if not c.constant
        }
    return CircuitCheck(outside_changed, inside, sum(len(b.tokens) for b in batches))

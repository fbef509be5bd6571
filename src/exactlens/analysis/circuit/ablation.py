"""Edge ablations on a task's words: resample (each word's edge reads the activation of another word
of the same length), mean (the mean over the words), zero (nothing: the sender's output replaced by
0, as in the ACDC paper's tracr experiments and MIB's zero ablation) or cross-length (each word's edge reads the
activation of a word of another length at the aligned position), and the checks a ground-truth
circuit must pass — ablating every edge outside it leaves the decisions unchanged; ablating one edge
inside it changes a decision on some word.

Why cross-length: a value that is the same for every word of one length (the length itself, i/n,
a [CLS] indicator) cannot be moved by swapping words of that length, so resample and mean ablation
are blind to circuits that compute with it. Positions are aligned as [CLS] to [CLS], symbol i to
symbol min(i, m - 1) of the length-m word, [EOS] to [EOS].
"""

from __future__ import annotations

import weakref
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

import torch

from exactlens.analysis.circuit.forward import GraphRun, mean_outputs, run_graph
from exactlens.analysis.circuit.graph import Edge, ModelGraph
from exactlens.analysis.circuit.truth import Circuit, CircuitEdge
from exactlens.devices import device_of
from exactlens.errors import ExactLensError
from exactlens.resources import torch_threads
from exactlens.tasks import reader as task_reader
from exactlens.tasks.kinds import valid_targets

ABLATIONS = ("resample", "mean", "cross-length", "zero")

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
    ablation: str = "resample"
    truth: torch.Tensor | None = None  # per-position targets: the metric leaves out undefined positions
    stacked: dict[tuple[str, str], torch.Tensor] = field(default_factory=dict, repr=False, compare=False)
    """Clean and source activations repeated on the batch dimension for stacked passes
    (exactlens.analysis.circuit.batched)."""


def _encode_and_run(model, graph: ModelGraph, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, GraphRun]:
    encoded = model_reader(model).task.encode(ids)
    where = device_of(model)  # words are drawn on the CPU; the model may sit on a GPU
    tokens, n_positions = encoded.tokens.to(where), encoded.n_positions.to(where)
    with torch.no_grad():
        return tokens, n_positions, run_graph(model, graph, tokens, n_positions)


def aligned_positions(task, length: int, other_length: int) -> torch.Tensor:
    """For each token position of a length-``length`` word, the position of a length-``other_length``
    word it reads under cross-length ablation: [CLS] -> [CLS], symbol i -> symbol min(i, m - 1),
    [EOS] -> [EOS]."""
    if length > 0 and other_length < 1:
        raise ExactLensError(f"cross-length ablation of words of length {length} needs source words of length >= 1, "
                             f"got {other_length}")
    offset = task.symbol_offset
    symbols = [offset + min(i, other_length - 1) for i in range(length)]
    return torch.tensor(([0] if task.use_cls else []) + symbols
                        + ([offset + other_length] if task.use_eos else []), dtype=torch.long)


def make_batch(model, graph: ModelGraph, ids: torch.Tensor, ablation: str = "resample", seed: int = 0,
               source_ids: torch.Tensor | None = None) -> Batch:
    """Encode symbol ids [B, L] with the model's task and run them. The source of a resample ablation
    is the run on the same words in another order (each word reads another word's activations); of a
    cross-length one, the run on ``source_ids`` [B', M] (words of another length M), each word reading
    one of them (a seeded random pairing, every source word used before any twice) at the aligned
    positions."""
    if ablation not in ABLATIONS:
        raise ExactLensError(f"ablation {ablation!r} is unknown; choose one of {', '.join(ABLATIONS)}")
    if (ablation == "cross-length") != (source_ids is not None):
        raise ExactLensError("source words of another length are given exactly when the ablation is cross-length")
    if source_ids is not None and (source_ids.ndim != 2 or ids.ndim != 2):
        raise ExactLensError(f"words are [count, length] tensors of symbol ids; got {tuple(ids.shape)} and source "
                             f"{tuple(source_ids.shape)}")
    tokens, n_positions, clean = _encode_and_run(model, graph, ids)
    where = tokens.device
    if ablation == "mean":
        source = mean_outputs(clean)
    elif ablation == "zero":
        source = {node: torch.zeros_like(out[:1]) for node, out in clean.outputs.items()}
    elif ablation == "cross-length":
        if len(source_ids) == 0 or source_ids.shape[1] == ids.shape[1]:
            raise ExactLensError(f"cross-length ablation needs source words of a length other than {ids.shape[1]}, "
                                 f"got {tuple(source_ids.shape)}")
        _, _, other = _encode_and_run(model, graph, source_ids)
        # a seeded random pairing: in index order, exhaustive word lists would pair w with a word
        # that extends it (0w), which often shares w's answer
        shuffled = torch.randperm(len(source_ids), generator=torch.Generator().manual_seed(seed))
        rows = shuffled[torch.arange(len(ids)) % len(source_ids)].to(where)
        positions = aligned_positions(model_reader(model).task, ids.shape[1], source_ids.shape[1]).to(where)
        source = {node: out[rows][:, positions] for node, out in other.outputs.items()}
    else:  # a random cyclic derangement: word p[i] reads word p[i+1] (seeded: reproducible)
        order = torch.randperm(len(ids), generator=torch.Generator().manual_seed(seed)).to(where)
        following = torch.empty_like(order)
        following[order] = order.roll(-1)
        source = {node: out[following] for node, out in clean.outputs.items()}
    return Batch(tokens, n_positions, clean, source, ablation, per_position_truth(model_reader(model).task, ids, where))


def per_position_truth(task, ids: torch.Tensor, where: torch.device) -> torch.Tensor | None:
    """The targets of a per-position task's words (which positions are defined), else None."""
    return task.targets(ids).to(where) if task.kind in ("prediction", "regression") else None


def decisions(model, logits: torch.Tensor, n_positions: torch.Tensor) -> torch.Tensor:
    """The model's decisions from full logits (its task's reader)."""
    return model_reader(model).decide(model.select_readout(logits, n_positions), n_positions)


def changed_words(model, graph: ModelGraph, batch: Batch, edges: Collection[Edge]) -> torch.Tensor:
    """bool [B]: the words whose decision changes when these edges are ablated (per-position tasks: at a
    target position; an undefined output, which has no decision to keep, is not read)."""
    with torch.no_grad():
        patched = run_graph(model, graph, batch.tokens, batch.n_positions, patched=edges, source=batch.source)
    before = decisions(model, batch.clean.logits, batch.n_positions)
    after = decisions(model, patched.logits, batch.n_positions)
    differs = before != after
    if batch.truth is not None and differs.ndim == 2:
        differs = differs & valid_targets(model_reader(model).task, batch.n_positions, differs.shape[1], batch.truth)
    return differs.reshape(differs.shape[0], -1).any(1)


def mark_constant(circuit: Circuit, batches: list[Batch], model) -> Circuit:
    """Mark each circuit edge that the batches' ablation cannot move as ``constant``: its carried
    features take the same value for every word of a length (resample, mean; on exhaustive batches
    this is exact), or equal their cross-length source at every aligned position, or are 0 (zero)."""
    labels = model.cfg.residual_labels or tuple(f"d{i}" for i in range(model.cfg.d_model))
    index = {label: i for i, label in enumerate(labels)}
    marked = []
    for c in circuit.edges:
        dims = [index[f] for f in c.features]
        same = all(unmovable(b, c.edge.sender, dims, c.edge.position) for b in batches)
        marked.append(CircuitEdge(c.edge, c.features, c.through_norm, same))
    return Circuit(circuit.graph, marked)


def unmovable(batch: Batch, sender: str, dims: list[int], position: int | None = None) -> bool:
    """The ablation cannot move these features of the sender's output (at ``position``, or anywhere)."""
    where = (..., dims) if position is None else (slice(None), slice(position, position + 1), dims)
    clean = batch.clean.outputs[sender][where]
    if batch.ablation in ("cross-length", "zero"):
        return _equal(clean, batch.source[sender][where])
    return _equal(clean, clean[:1])


def _equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Every entry equal (b broadcast; NaN equal to NaN: eps = 0 layer norms give NaN at positions that
    nothing reads)."""
    return bool(((a == b) | (a.isnan() & b.isnan())).all())


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
    from exactlens.progress import bar

    outside = [e for e in circuit.graph.edges if not circuit.contains(e)]
    checked = [c for c in circuit.edges if not c.constant]
    with small_tensor_threads(model):
        outside_changed = sum(int(changed_words(model, circuit.graph, b, outside).sum()) for b in batches)
        inside = {  # a bar over the edges: long words make each ablation run slow
            c.edge.name: sum(int(changed_words(model, circuit.graph, b, [c.edge]).sum()) for b in batches)
            for c in bar(checked, desc="circuit check", unit="edge")
        }
    return CircuitCheck(outside_changed, inside, sum(len(b.tokens) for b in batches))

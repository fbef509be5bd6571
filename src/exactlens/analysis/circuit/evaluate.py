"""What ``exactlens circuit`` and ``exactlens discover`` compute: a target's ground-truth circuit with
the ablation evidence for it, and a discovery method's edges scored against it (or, for a trained
model, compared with the exact construction's circuit of its task).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from exactlens.analysis.circuit.ablation import ABLATIONS, Batch, check_circuit, make_batch, mark_constant
from exactlens.analysis.circuit.discovery import METHODS, discover
from exactlens.analysis.circuit.graph import GRANULARITIES, ModelGraph, model_graph
from exactlens.analysis.circuit.scoring import score_discovery, set_overlap
from exactlens.analysis.circuit.truth import Circuit, derive_circuit
from exactlens.errors import ExactLensError
from exactlens.tasks import check_length
from exactlens.tasks import reader as task_reader

DEFAULT_WORDS = 64  # per length: every word when there are at most this many
DEFAULT_SPAN = 6  # default lengths: the task's shortest and the next five


def _check_choice(name: str, value: str, allowed: Sequence[str]) -> str:
    if value not in allowed:
        raise ExactLensError(f"{name} {value!r} is unknown; choose one of {', '.join(allowed)}")
    return value


def default_lengths(task) -> list[int]:
    lo = max(task.min_length, 1)
    hi = lo + DEFAULT_SPAN - 1 if task.max_length is None else min(lo + DEFAULT_SPAN - 1, task.max_length)
    return list(range(lo, hi + 1))


def word_batches(model, graph: ModelGraph, lengths: Sequence[int] | None = None, words: int = DEFAULT_WORDS,
                 seed: int = 0, ablation: str = "resample") -> list[Batch]:
    """One batch per length: every word when there are at most ``words``, else ``words`` sampled
    ones; lengths with a single word are skipped (a resample ablation needs another word)."""
    task = task_reader(model).task
    if isinstance(words, bool) or not isinstance(words, int) or words < 2:
        raise ExactLensError(f"words per length must be an integer >= 2, got {words!r}")
    lengths = default_lengths(task) if lengths is None else list(lengths)
    if not lengths:
        raise ExactLensError("give at least one length")
    batches = []
    for length in lengths:
        check_length(length, task.name, task.min_length, task.max_length)
        ids, _ = task.words(length, words, torch.Generator().manual_seed(seed + length), exhaustive_limit=words)
        if len(ids) >= 2:
            batches.append(make_batch(model, graph, ids, ablation, seed))
    if not batches:
        raise ExactLensError(f"no length in {lengths} has two or more words of {task.name}; give longer lengths")
    return batches


def _resolve(target: Any):
    from exactlens.analysis.diff.runs import resolve_trained

    return resolve_trained(target)


def circuit_report(target: Any, *, granularity: str = "head", lengths: Sequence[int] | None = None,
                   words: int = DEFAULT_WORDS, seed: int = 0, ablation: str = "resample",
                   check: bool = True) -> dict[str, Any]:
    """The ground-truth circuit of a construction (by name), a checkpoint or a model, with which of
    its edges are constant on the words, and (``check``) the ablation evidence: decisions changed by
    ablating every edge outside the circuit (should be 0) and by each edge inside it alone."""
    _check_choice("granularity", granularity, GRANULARITIES)
    _check_choice("ablation", ablation, ABLATIONS)
    model, info = _resolve(target)
    circuit = derive_circuit(model, granularity)
    batches = word_batches(model, circuit.graph, lengths, words, seed, ablation)
    circuit = mark_constant(circuit, batches, model)
    result = {"target": info, "model": model.cfg.model_name, "task": task_reader(model).task.spec(),
              "lengths": _word_lengths(model, batches), "ablation": ablation, **circuit.to_dict()}
    if check:
        result["check"] = check_circuit(model, circuit, batches).to_dict()
    return result


def _word_lengths(model, batches: list[Batch]) -> list[int]:
    specials = task_reader(model).task.n_specials
    return [int(b.tokens.shape[1]) - specials for b in batches]


def discover_report(target: Any, method: str, *, granularity: str = "head", against: str | None = None,
                    threshold: float | None = None, lengths: Sequence[int] | None = None,
                    words: int = DEFAULT_WORDS, seed: int = 0, ablation: str = "resample") -> dict[str, Any]:
    """Run a discovery method on a target. A construction is scored against its own circuit (ROC,
    AUROC, precision and recall at the method's threshold); any model is compared with the circuit of
    ``against`` (a construction of the same task) by edge overlap when the two graphs have the same
    nodes."""
    _check_choice("method", method, METHODS)
    _check_choice("granularity", granularity, GRANULARITIES)
    _check_choice("ablation", ablation, ABLATIONS)
    model, info = _resolve(target)
    graph = model_graph(model, granularity)
    batches = word_batches(model, graph, lengths, words, seed, ablation)
    found = discover(model, graph, batches, method, threshold)
    result: dict[str, Any] = {
        "target": info, "model": model.cfg.model_name, "method": method, "granularity": granularity,
        "threshold": found.threshold, "ablation": ablation, "lengths": _word_lengths(model, batches),
        "seconds": round(found.seconds, 3), "details": found.details,
        "edges": [{"edge": e.name, "score": float(found.edge_scores.get(e, 0.0)), "selected": e in found.selected}
                  for e in graph.edges],
        "selected": sorted(e.name for e in found.selected),
    }
    truth_model = None
    if against is not None:
        truth_model, _ = _resolve(against)
    elif info["kind"] == "construction":
        truth_model = model
    if truth_model is not None:
        circuit = derive_circuit(truth_model, granularity)
        if truth_model is model:
            circuit = mark_constant(circuit, batches, model)
            result["score"] = score_discovery(found, circuit).to_dict()
        else:
            result["overlap"] = overlap(found.selected, circuit, graph)
    return result


def overlap(selected, circuit: Circuit, graph: ModelGraph) -> dict[str, Any]:
    """Edge overlap of a discovered set with a circuit of another model (same node names needed)."""
    if circuit.graph.nodes != graph.nodes:
        return {"comparable": False,
                "reason": "the two models' graphs have different nodes (layers, heads or layer norms differ)",
                "nodes": graph.nodes, "circuit_nodes": circuit.graph.nodes}
    o = set_overlap(set(selected), set(circuit.edge_set))
    return {"comparable": True, "circuit_edges": o["truth"], "selected_edges": o["found"], "shared_edges": o["shared"],
            "jaccard": o["jaccard"], "recall": o["recall"], "precision": o["precision"]}


def catalogue(names: Sequence[str], *, granularities: Sequence[str] = GRANULARITIES,
              methods: Sequence[str] = METHODS, words: int = 32, span: int = 4, seed: int = 0) -> list[dict[str, Any]]:
    """Every method on every named construction at every granularity, scored against the ground
    truth: one row per (construction, granularity, method), with the circuit's size and the scores.
    Lengths: the task's shortest and the next ``span - 1``; ``words`` per length."""
    from exactlens.progress import bar

    rows = []
    for name in bar(list(names), desc="circuit catalogue", unit="construction"):
        model, info = _resolve(name)
        task = task_reader(model).task
        lengths = default_lengths(task)[:span]
        for granularity in granularities:
            graph = model_graph(model, granularity)
            batches = word_batches(model, graph, lengths, words, seed)
            circuit = mark_constant(derive_circuit(model, granularity), batches, model)
            for method in methods:
                found = discover(model, graph, batches, method)
                score = score_discovery(found, circuit).to_dict()
                score.pop("roc")
                rows.append({"construction": name, "lengths": _word_lengths(model, batches), **score})
    return rows

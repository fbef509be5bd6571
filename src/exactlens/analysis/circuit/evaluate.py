"""What ``exactlens circuit`` and ``exactlens discover`` compute: a target's ground-truth circuit with
the ablation evidence for it, and a discovery method's edges scored against it (or, for a trained
model, compared with the exact construction's circuit of its task).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from exactlens.analysis.circuit.ablation import ABLATIONS, Batch, check_circuit, make_batch, mark_constant
from exactlens.analysis.circuit.correspond import compare_with_circuit
from exactlens.analysis.circuit.discovery import DEFAULT_IG_STEPS, METHODS, Discovery, check_threshold, discover
from exactlens.analysis.circuit.equivalent import best_match, swappable_heads, valid_circuits
from exactlens.analysis.circuit.faithfulness import METRICS, DivergenceCache, check_metrics, faithfulness, ranked
from exactlens.analysis.circuit.graph import EDGE_GRANULARITIES, GRANULARITIES, POSITION, ModelGraph, model_graph
from exactlens.analysis.circuit.recorded import recorded_circuit, recorded_siit, truth_source
from exactlens.analysis.circuit.request import DiscoverRequest
from exactlens.analysis.circuit.scoring import score_discovery
from exactlens.analysis.circuit.truth import Circuit, derive_circuit
from exactlens.constructions.registry import longest_length
from exactlens.errors import ExactLensError
from exactlens.tasks import check_length
from exactlens.tasks import reader as task_reader
from exactlens.tasks.base import check_seed

DEFAULT_WORDS = 64  # per length: every word when there are at most this many
DEFAULT_SPAN = 6  # default lengths: the task's shortest and the next five


def _check_choice(name: str, value: str, allowed: Sequence[str]) -> str:
    if not isinstance(value, str) or value not in allowed:
        raise ExactLensError(f"{name} {value!r} is unknown; choose one of {', '.join(allowed)}")
    return value


def default_lengths(task, longest: int | None = None) -> list[int]:
    """The task's shortest length and the next five, within the task's limit and ``longest`` (the
    longest length the model answers, e.g. a tracr model's max_seq_len)."""
    lo = max(task.min_length, 1)
    limits = [n for n in (task.max_length, longest) if n is not None]
    hi = lo + DEFAULT_SPAN - 1 if not limits else min(lo + DEFAULT_SPAN - 1, *limits)
    return list(range(lo, hi + 1))


def check_circuit_cost(model, graph: ModelGraph, lengths: Sequence[int], words: int, n_specials: int) -> None:
    """Refuse, before any word is drawn, lengths and words whose ablation runs cannot fit or finish:
    every node's output is kept for the clean and the source run of each length (2 x words x positions
    x d_model per node), and the check runs about 3 + (number of edges) forward passes per length."""
    from exactlens.resources import check_memory, check_work

    if not hasattr(model, "forward_operations"):  # a TransformerLens model: its own checks apply
        return
    item = torch.finfo(model.cfg.torch_dtype).bits // 8
    kept = peak = operations = 0.0
    for length in lengths:
        n_pos = length + n_specials + 1  # a cross-length source may be one longer
        kept += 2.0 * words * n_pos * model.cfg.d_model * len(graph.nodes) * item
        peak = max(peak, float(model.forward_bytes(words, n_pos, hooked=False)))  # hooks read node outputs only
        operations += (3 + len(graph.edges)) * model.forward_operations(words, n_pos)
    what = f"the circuit's ablation runs on up to {words} words at lengths {_span(lengths)}"
    lower = "use fewer words (--words, API words=) or shorter lengths (--lengths)"
    check_memory(kept + peak, what, lower)
    check_work(operations, what, lower)


def _span(lengths: Sequence[int]) -> str:
    return str(list(lengths)) if len(lengths) <= 6 else f"{min(lengths)}..{max(lengths)} ({len(lengths)} lengths)"


def word_batches(model, graph: ModelGraph, lengths: Sequence[int] | None = None, words: int = DEFAULT_WORDS,
                 seed: int = 0, ablation: str = "resample", longest: int | None = None) -> list[Batch]:
    """One batch per length: every word when there are at most ``words``, else ``words`` sampled
    ones. Resample and mean ablation skip lengths with a single word (they need another word of the
    length); a cross-length ablation's source words have length n + 1 (n - 1 at ``longest``, default
    the longest length the model answers; two models compared on the same words pass the shorter of
    theirs, so that both read the same sources), drawn the same way."""
    task = task_reader(model).task
    if isinstance(words, bool) or not isinstance(words, int) or words < 2:
        raise ExactLensError(f"words per length must be an integer >= 2, got {words!r}")
    own = longest_length(model)
    longest = own if longest is None else (longest if own is None else min(longest, own))
    if isinstance(lengths, (str, bytes)) or (lengths is not None and not hasattr(lengths, "__iter__")):
        raise ExactLensError(f"lengths are a list of integers, got {lengths!r}")
    lengths = default_lengths(task, longest) if lengths is None else list(lengths)
    if not lengths:
        raise ExactLensError("give at least one length")
    for length in lengths:
        check_length(length, task.name, task.min_length, longest)
    check_circuit_cost(model, graph, lengths, words, task.n_specials)

    def draw(length: int) -> torch.Tensor:
        return task.words(length, words, torch.Generator().manual_seed(seed + length), exhaustive_limit=words)[0]

    batches = []
    for length in lengths:
        check_length(length, task.name, task.min_length, longest)
        ids = draw(length)
        if ablation == "cross-length":
            batches.append(make_batch(model, graph, ids, ablation, seed, draw(source_length(task, length, longest))))
        elif len(ids) >= 2 or ablation == "zero":  # zero ablation needs no other word
            batches.append(make_batch(model, graph, ids, ablation, seed))
    if not batches:
        raise ExactLensError(f"no length in {lengths} has two or more words of {task.name}; give longer lengths")
    return batches


def shared_longest(a, b) -> int | None:
    """The longest length both models answer (None: any)."""
    known = [n for n in (longest_length(a), longest_length(b)) if n is not None]
    return min(known) if known else None


def source_length(task, length: int, longest: int | None = None) -> int:
    """The length whose words a cross-length ablation reads at ``length``: the next one, or the one
    before at the longest (``longest``, default the task's limit). The empty word cannot be a source:
    its symbol positions would have nothing to read."""
    longest = task.max_length if longest is None else longest
    if longest is None or length < longest:
        return length + 1
    if length - 1 >= max(task.min_length, 1):
        return length - 1
    raise ExactLensError(f"cross-length ablation at length {length} needs words of another length >= 1 to read, "
                         f"and {task.name} allows only lengths {task.min_length}..{longest} here")


POSITION_SPAN_INDEX = 3  # position granularity's default length: the task's shortest + 3


def position_lengths(model, lengths: Sequence[int] | None, longest: int | None = None) -> list[int]:
    """Position granularity reads words of one length (each position is an edge): the one given, or
    the task's shortest length + 3 (within what the model answers)."""
    task = task_reader(model).task
    own = longest_length(model)
    longest = own if longest is None else (longest if own is None else min(longest, own))
    if lengths is None:
        span = default_lengths(task, longest)
        return [span[min(POSITION_SPAN_INDEX, len(span) - 1)]]
    lengths = list(lengths) if hasattr(lengths, "__iter__") and not isinstance(lengths, (str, bytes)) else lengths
    if not isinstance(lengths, list) or len(lengths) != 1:
        raise ExactLensError(f"position granularity resolves edges per token position of words of one length: give "
                             f"one length (--lengths L), got {lengths!r}")
    return lengths


def edge_graph(model, granularity: str, lengths: Sequence[int] | None,
               longest: int | None = None) -> tuple[ModelGraph, Sequence[int] | None]:
    """The model's graph at ``granularity`` and the lengths to run (position granularity: one length,
    whose number of token positions the graph is resolved over)."""
    if granularity != POSITION:
        return model_graph(model, granularity), lengths
    lengths = position_lengths(model, lengths, longest)
    if isinstance(lengths[0], bool) or not isinstance(lengths[0], int):
        raise ExactLensError(f"lengths are whole numbers, got {lengths[0]!r}")
    return model_graph(model, POSITION, lengths[0] + task_reader(model).task.n_specials), lengths


def exact_circuit(model, graph: ModelGraph, batches: list[Batch]) -> Circuit:
    """The model's ground-truth circuit on the graph, its constant edges marked on the batches
    (position granularity: resolved per position, exactlens.analysis.circuit.positions)."""
    if graph.granularity == POSITION:
        from exactlens.analysis.circuit.positions import position_circuit

        return position_circuit(model, graph, batches)
    return mark_constant(derive_circuit(model, graph.granularity), batches, model)


def _resolve(target: Any):
    from exactlens.analysis.diff.runs import resolve_trained

    return resolve_trained(target)


def circuit_report(target: Any, *, granularity: str = "head", lengths: Sequence[int] | None = None,
                   words: int = DEFAULT_WORDS, seed: int = 0, ablation: str = "resample",
                   check: bool = True, out: str | None = None, overwrite: bool = False) -> dict[str, Any]:
    """The ground-truth circuit of a construction (by name), a checkpoint or a model, with which of
    its edges are constant on the words, and (``check``) the ablation evidence: decisions changed by
    ablating every edge outside the circuit (should be 0) and by each edge inside it alone. ``out``:
    also write the circuit in MIB's circuit file format (exactlens.analysis.circuit.mib)."""
    _check_choice("granularity", granularity, EDGE_GRANULARITIES)
    _check_choice("ablation", ablation, ABLATIONS)
    check_seed(seed)
    model, info = _resolve(target)
    graph, lengths = edge_graph(model, granularity, lengths)
    batches = word_batches(model, graph, lengths, words, seed, ablation)
    circuit = exact_circuit(model, graph, batches)
    result = {"target": info, "model": model.cfg.model_name, "task": task_reader(model).task.spec(),
              "lengths": _word_lengths(model, batches), "ablation": ablation, **circuit.to_dict()}
    if check:
        result["check"] = check_circuit(model, circuit, batches).to_dict()
    if out is not None:
        result["circuit_file"] = _write_circuit(out, model, circuit.graph, set(circuit.edge_set), None,
                                                f"the exact circuit of {model.cfg.model_name}", overwrite)
    return result


def _write_circuit(out: str, model, graph: ModelGraph, selected, scores, what: str, overwrite: bool) -> str:
    from exactlens.analysis.circuit.mib import to_mib, write_mib

    return str(write_mib(out, to_mib(model, graph, selected, scores, what=what), overwrite=overwrite))


def file_discovery(path: str, model, graph: ModelGraph) -> Discovery:
    """A circuit from a MIB circuit file as a discovery: its edges selected, its |scores| (1 and 0
    for a file without scores) ranking them."""
    from exactlens.analysis.circuit.discovery import node_scores
    from exactlens.analysis.circuit.mib import from_mib, load_mib

    selected, scores, has_scores = from_mib(load_mib(path), model, graph, where=f"circuit file {path}")
    return Discovery("file", graph.granularity, scores, node_scores(graph, scores), selected, 0.0,
                     details={"score_file": str(path), "scored": has_scores})


def truth_ranking(circuit: Circuit) -> dict:
    """The exact circuit as a ranking: its observable edges, then its constant ones, then the rest
    (no order inside a class: the graph's)."""
    return {c.edge: 1.0 if c.constant else 2.0 for c in circuit.edges}


def faithfulness_fields(cache: DivergenceCache, scores: dict) -> dict[str, Any]:
    return faithfulness(cache, ranked(cache.graph, scores)).to_dict()


def _word_lengths(model, batches: list[Batch]) -> list[int]:
    specials = task_reader(model).task.n_specials
    return [int(b.tokens.shape[1]) - specials for b in batches]


def discover_report(target: Any, method: str = "acdc", request: DiscoverRequest | None = None,
                    **options: Any) -> dict[str, Any]:
    """Run a discovery method on a target. A construction is scored against its own circuit (ROC,
    AUROC, precision and recall at the method's threshold), a SIIT-trained model against the circuit its
    run recorded (exactlens.analysis.circuit.recorded; ``truth`` says which); any model is compared with the circuit of
    ``against`` (a construction of the same task, run on the same words) after mapping its nodes onto
    the construction's by (layer, head) index (exactlens.analysis.circuit.correspond): the graphs may
    differ in depth, heads and layer norms.

    The options are a :class:`~.request.DiscoverRequest` (``request``), or its fields as keywords
    (checked by the request's kinds, as ``el.discover`` checks them): ``granularity``, ``against``,
    ``threshold``, ``lengths``, ``words``, ``seed``, ``ablation``; ``metrics``: auroc (against the truth)
    and/or cpr, cmd (MIB's faithfulness curve of the method's ranking,
    exactlens.analysis.circuit.faithfulness; for a construction the exact circuit's curve beside it);
    ``ig_steps`` (EAP-IG); ``score_file``: score the circuit in this MIB circuit file instead of running
    the method; ``out`` (and ``overwrite``): write the method's circuit (its selected edges and scores)
    as one. ``target`` is used as given (the request's own target is not read)."""
    if request is None:
        from exactlens.requests import from_call

        request = from_call("discover", DiscoverRequest, [target, method], options)
    elif options:
        raise ExactLensError(f"discover_report takes a request or keywords, not both (got {sorted(options)})")
    r = request
    method, granularity, against, threshold, ablation = r.method, r.granularity, r.against, r.threshold, r.ablation
    lengths, words, seed, score_file = r.lengths, r.words, r.seed, r.score_file
    metrics = check_metrics(r.metrics)
    _check_choice("method", method, METHODS)
    _check_choice("granularity", granularity, EDGE_GRANULARITIES)
    _check_choice("ablation", ablation, ABLATIONS)
    check_threshold(threshold)
    check_seed(seed)
    if granularity == POSITION and against is not None:
        raise ExactLensError("position granularity compares a construction with its own circuit only: drop --against "
                             "or use head or qkv granularity")
    model, info = _resolve(target)
    truth_model = siit = None
    if against is None and info["kind"] != "construction":
        siit = recorded_siit(model)  # a SIIT model carries its ground truth (exactlens.analysis.circuit.recorded)
    if against is not None:
        truth_model, _ = _resolve(against)
        _check_same_task(model, truth_model, info, against)
    elif info["kind"] == "construction":
        truth_model = model
    longest = None if truth_model is None else shared_longest(model, truth_model)
    graph, lengths = edge_graph(model, granularity, lengths, longest)
    batches = word_batches(model, graph, lengths, words, seed, ablation, longest)
    if score_file is not None:
        found = file_discovery(score_file, model, graph)
    else:
        found = discover(model, graph, batches, method, threshold, r.ig_steps)
    result: dict[str, Any] = {
        "target": info, "model": model.cfg.model_name, "method": found.method, "granularity": granularity,
        "threshold": found.threshold, "ablation": ablation, "lengths": _word_lengths(model, batches),
        "seconds": round(found.seconds, 3), "details": found.details,
        "edges": [{"edge": e.name, "score": float(found.edge_scores.get(e, 0.0)), "selected": e in found.selected}
                  for e in graph.edges],
        "selected": sorted(e.name for e in found.selected), "metrics": list(metrics),
    }
    cache = DivergenceCache(model, graph, batches) if {"cpr", "cmd"} & set(metrics) else None
    if cache is not None:
        result.update(faithfulness_fields(cache, found.edge_scores))
    if r.out is not None:
        result["circuit_file"] = _write_circuit(r.out, model, graph, found.selected, found.edge_scores,
                                                f"{found.method} on {model.cfg.model_name}", r.overwrite)
    if truth_model is model:
        circuit = exact_circuit(model, graph, batches)
        if "auroc" in metrics:
            result["score"] = score_discovery(found, circuit).to_dict()
            result["equivalent"] = best_match(found.selected, valid_circuits(model, circuit, batches),
                                              {c.edge for c in circuit.edges if c.constant}, swappable_heads(model))
        if cache is not None:
            result["exact_circuit"] = faithfulness_fields(cache, truth_ranking(circuit))
    elif siit is not None:
        result["truth"] = truth_source(siit, granularity)
        if result["truth"]["scored"]:
            circuit = recorded_circuit(model, siit, graph, batches)
            if "auroc" in metrics:
                result["score"] = score_discovery(found, circuit).to_dict()
            if cache is not None:
                result["exact_circuit"] = faithfulness_fields(cache, truth_ranking(circuit))
    elif truth_model is not None:
        truth_batches = word_batches(truth_model, model_graph(truth_model, granularity), lengths, words, seed, ablation,
                                     shared_longest(model, truth_model))
        circuit = mark_constant(derive_circuit(truth_model, granularity), truth_batches, truth_model)
        result["overlap"] = overlap(found, circuit, graph, against)
    return result


def _check_same_task(model, truth_model, info: dict[str, Any], against: str) -> None:
    from exactlens.analysis.diff.runs import task_text

    own, other = task_reader(model).task, task_reader(truth_model).task
    if own != other:
        what = info.get("name") or info.get("path") or model.cfg.model_name
        raise ExactLensError(f"cannot compare {what} with the circuit of {against}: they answer different tasks "
                             f"({task_text(own)} vs {task_text(other)}); compare with a construction of the "
                             f"target's task")


def overlap(found: Discovery, circuit: Circuit, graph: ModelGraph, against: str) -> dict[str, Any]:
    """A discovery on one model against the circuit (constant edges marked) of another model of the
    same task, nodes mapped by index: the edge counts and ratios at the top, the full comparison of
    exactlens.analysis.circuit.correspond below them; ``comparable`` is False, with the reason, when
    no edge of the circuit has a counterpart in the graph, even between components."""
    detail = compare_with_circuit(graph, found, circuit)
    detail.pop("trained_edges")  # the target's edges are listed with their scores already
    edges = detail["edges"]
    reachable = max(edges["truth_with_counterpart"], edges["between_components"]["truth_with_counterpart"])
    head = {"comparable": reachable > 0, "against": against,
            "mapping": "layer and head index"}  # exactlens diff matches heads by attention
    if not edges["truth"]:
        head["reason"] = f"the circuit of {against} has no edge that this ablation can move: nothing to compare"
    elif not reachable:
        head["reason"] = (f"no edge of the circuit of {against} has a counterpart in the target's graph "
                          f"(nodes {graph.nodes} vs {circuit.graph.nodes})")
    return {**head, "circuit_edges": edges["truth"], "selected_edges": edges["found"], "shared_edges": edges["shared"],
            "jaccard": edges["jaccard"], "recall": edges["recall"], "precision": edges["precision"], **detail}


def catalogue(names: Sequence[str], *, granularities: Sequence[str] = GRANULARITIES,
              methods: Sequence[str] = METHODS, words: int = 32, span: int = 4, seed: int = 0,
              ablation: str = "resample", metrics: Sequence[str] | str = METRICS,
              ig_steps: int = DEFAULT_IG_STEPS) -> list[dict[str, Any]]:
    """Every method on every named construction at every granularity, scored against the ground
    truth: one row per (construction, granularity, method), with the circuit's size, the scores, the
    faithfulness curve with CPR and CMD (``metrics``), the exact circuit's CPR and CMD beside them, and
    the seconds the method and its curve took. Lengths: the task's shortest and the next
    ``span - 1`` (position granularity: the last of them alone); ``words`` per length."""
    _check_choice("ablation", ablation, ABLATIONS)
    metrics = check_metrics(metrics)
    import time

    from exactlens.progress import bar

    rows = []
    for name in bar(list(names), desc="circuit catalogue", unit="construction"):
        model, info = _resolve(name)
        task = task_reader(model).task
        lengths = default_lengths(task)[:span]
        for granularity in granularities:
            graph, used = edge_graph(model, granularity, lengths if granularity != POSITION else lengths[-1:])
            batches = word_batches(model, graph, used, words, seed, ablation)
            circuit = exact_circuit(model, graph, batches)
            cache = DivergenceCache(model, graph, batches) if {"cpr", "cmd"} & set(metrics) else None
            exact = faithfulness_fields(cache, truth_ranking(circuit)) if cache is not None else {}
            for method in methods:
                found = discover(model, graph, batches, method, ig_steps=ig_steps)
                score = score_discovery(found, circuit).to_dict()
                score.pop("roc")
                row = {"construction": name, "lengths": _word_lengths(model, batches), "ablation": ablation, **score}
                if cache is not None:
                    start = time.perf_counter()
                    row.update(faithfulness_fields(cache, found.edge_scores))
                    row["faithfulness_seconds"] = round(time.perf_counter() - start, 3)
                    row["exact_cpr"], row["exact_cmd"] = exact["cpr"], exact["cmd"]
                rows.append(row)
    return rows

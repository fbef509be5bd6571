"""The timeline's work: every checkpoint loaded and checked first, the exact side prepared once, then one
diff per checkpoint sharing the words, the exact side's runs, the alignment's pairs, the exact circuit and
the previous checkpoint's DAS subspaces (Context.carry); one row per checkpoint; the events.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from exactlens.analysis.diff.context import Context, ExactSide, prepare_exact, prepare_trained
from exactlens.analysis.diff.orchestrator import run_parts
from exactlens.analysis.diff.request import ECHOED
from exactlens.analysis.diff.runs import DEFAULT_LENGTHS, words
from exactlens.analysis.timeline.events import events
from exactlens.analysis.timeline.request import TimelineRequest, check_long_words, resolved
from exactlens.analysis.timeline.sources import Origin, Source, sources_of
from exactlens.devices import device_name
from exactlens.errors import ExactLensError
from exactlens.jsonio import jsonable
from exactlens.progress import say as stderr_say
from exactlens.requests import from_call, options_of

__all__ = ["checkpoint_row", "timeline"]


@torch.no_grad()
def timeline(run: Any, against: str, request: Any = None, *, progress: Callable[[str], None] | None = None,
             **options: Any) -> dict[str, Any]:
    """Compare every checkpoint of ``run`` with the construction ``against`` (docs/formation.md): the JSON-ready
    ``checkpoints`` rows and ``events``. The options are
    :class:`~exactlens.analysis.timeline.request.TimelineRequest`'s fields, as a ``request`` or as keywords."""
    start = time.perf_counter()
    request = _request_of(run, against, request, options)
    say = progress or (lambda message: stderr_say(message, request.quiet))
    if request.long_lengths is not None:  # refused before any checkpoint is read
        for length in request.long_lengths:
            check_long_words(length, request.strings, _count(request.target))
    sources, origin = sources_of(request.target, request.steps, request.model)
    lengths, lengths_source = _lengths(request.lengths, origin)
    req = resolved(request, lengths)
    shared = prepare_exact(against, req)
    contexts = _prepare_all(sources, shared, req, say)
    first = contexts[0]
    long_lengths, long_source = _long_lengths(request.long_lengths, origin, first.lengths)
    long_words = _long_words(first, shared, long_lengths, req, len(sources))
    carry: dict[str, Any] = {}
    rows = []
    for n, source in enumerate(sources):
        began = time.perf_counter()
        ctx, contexts[n] = contexts[n], None  # the checkpoint's model and runs are let go after its row
        ctx.carry = carry
        sections, summary = run_parts(ctx, req)
        row = checkpoint_row(source, sections, summary, req.parts)
        row["long_accuracy"], reason = _long_accuracy(ctx, long_words)
        if reason:
            row["reasons"]["long_accuracy"] = reason
        row["seconds"] = time.perf_counter() - began
        rows.append(row)
        say(f"timeline: step {source.step} ({n + 1}/{len(sources)}) in {row['seconds']:.1f} s")
    result = {
        "run": {"kind": origin.kind, "path": origin.path, "checkpoints": len(rows),
                "train_length": origin.train_length, "test_length": origin.test_length},
        "trained": first.side.info, "exact": first.exact.info, "task": first.task.spec(),
        "settings": {"lengths": first.lengths, "lengths_source": lengths_source, "skipped_lengths": first.skipped,
                     "long_lengths": long_lengths, "long_lengths_source": long_source,
                     **{name: getattr(req, name) for name in ECHOED}, "das_warm_steps": req.das_warm_steps,
                     "parts": list(req.parts), "device": device_name(first.device),
                     "shared": "words, the exact model's runs, DAS pairs and the exact circuit computed once; each "
                               "checkpoint's DAS starts from the previous checkpoint's subspaces"},
        "residual_labels": first.labels,
        "checkpoints": rows,
        "events": events(rows, [w["length"] for w in long_words if w["usable"]] or None),
    }
    result["seconds"] = time.perf_counter() - start
    return jsonable(result)


def _request_of(run: Any, against: str, request: Any, options: dict[str, Any]) -> Any:
    if request is None:
        return from_call("timeline", TimelineRequest, (run, against), {"device": None, **options})
    if options:
        raise ExactLensError(f"timeline takes a request or keyword options, not both (got {', '.join(options)})")
    if not isinstance(request, TimelineRequest):
        raise ExactLensError(f"timeline's request is a TimelineRequest, got {type(request).__name__}")
    for f, opt in options_of(TimelineRequest):
        value = getattr(request, f.name)
        if value is not None or f.default is not None:
            opt.kind.check(opt.api_name or f.name, value)
    return request


def _lengths(lengths: Any, origin: Origin) -> tuple[Any, str]:
    """The lengths every checkpoint is compared on: those given, the run's training lengths, or the diff's."""
    if lengths is not None:
        return lengths, "given"
    if origin.train_length:
        lo, hi = min(origin.train_length), max(origin.train_length)
        if len(origin.train_length) == 2:  # a range of training lengths
            return sorted({lo, hi} | {n for n in DEFAULT_LENGTHS if lo <= n <= hi}), "the run's training lengths"
        return sorted(set(origin.train_length)), "the run's training lengths"
    return None, "the diff's default lengths (those the models accept)"


def _long_lengths(given: Any, origin: Origin, lengths: list[int]) -> tuple[list[int], str]:
    if given is not None:
        return list(given), "given"
    longest = max(lengths)
    if origin.test_length and max(origin.test_length) > longest:
        return [max(origin.test_length)], "the run's test length"
    return [2 * longest], "twice the longest length compared"


def _prepare_all(sources: list[Source], shared: ExactSide, request: Any, say: Callable[[str], None]
                 ) -> list[Context]:
    """Every checkpoint loaded and checked (task, vocabulary, lengths) before any is compared: a bad one
    stops the timeline before any work. Readout warnings are kept for the last checkpoint only (an early
    checkpoint is near chance by nature)."""
    contexts = []
    for n, source in enumerate(sources):
        try:
            model = source.load()
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                ctx = prepare_trained(model, shared, request, lambda message: None)
        except ExactLensError as err:
            said = str(err)
            raise ExactLensError(said if said.startswith(source.label) else f"{source.label}: {said}") from None
        if n == len(sources) - 1:
            for warning in caught:
                warnings.warn(str(warning.message), warning.category, stacklevel=3)
        if contexts and ctx.lengths != contexts[0].lengths:
            raise ExactLensError(f"{source.label} accepts lengths {ctx.lengths}, {sources[0].label} "
                                 f"{contexts[0].lengths}: give lengths= that every checkpoint accepts")
        ctx.say = lambda message: None  # the timeline says one line per checkpoint
        contexts.append(ctx)
    say(f"timeline: {len(contexts)} checkpoints against {shared.construction.name} on lengths {contexts[0].lengths}")
    return contexts


def _count(target: Any) -> int:
    """How many checkpoints a run holds, where known before reading them (a list's length; else 1)."""
    return len(target) if isinstance(target, (list, tuple)) else 1


def _long_words(ctx: Context, shared: ExactSide, long_lengths: list[int], request: Any, checkpoints: int
                ) -> list[dict[str, Any]]:
    """The words of each long length, drawn once; a length a model cannot take, or too long to check (one
    the run recorded, not asked for), says why."""
    task, side = ctx.task, ctx.side
    gen = torch.Generator().manual_seed(int(request.seed) + 1)
    out = []
    for length in long_lengths:
        reasons = []
        try:
            check_long_words(length, request.strings, checkpoints)
        except ExactLensError as err:
            out.append({"length": length, "usable": False, "reason": str(err)})
            continue
        try:
            shared.construction.check_length(length, shared.exact_model)
        except ExactLensError as err:
            reasons.append(str(err))
        if side.max_positions is not None and length + task.n_specials > side.max_positions:
            reasons.append(f"{length + task.n_specials} positions exceed the trained model's n_ctx="
                           f"{side.max_positions}")
        if reasons:
            out.append({"length": length, "usable": False, "reason": "; ".join(reasons)})
            continue
        ids, _ = words(task, length, request.strings, gen)
        batch = task.encode(ids)
        out.append({"length": length, "usable": True, "tokens": batch.tokens, "n_positions": batch.n_positions,
                    "truth": task.targets(ids)})
    return out


def _long_accuracy(ctx: Context, long_words: list[dict[str, Any]]) -> tuple[float | None, str | None]:
    """The checkpoint's accuracy over the long lengths' words (None with the reason where none is usable)."""
    from exactlens.analysis.diff.behaviour import _tolerance

    usable = [w for w in long_words if w["usable"]]
    if not usable:
        return None, "; ".join(f"length {w['length']}: {w['reason']}" for w in long_words) or "no long lengths"
    right = total = 0.0
    for w in usable:
        logits, _ = ctx.side.run(w["tokens"], set())
        decisions = ctx.side.reader.decide(ctx.side.outputs(logits, w["n_positions"]), w["n_positions"])
        tolerance = _tolerance(ctx.exact, w["truth"]) if ctx.task.kind == "regression" else None
        score = ctx.task.score(decisions, w["truth"], w["n_positions"], tolerance)
        right += score.accuracy * len(w["truth"])
        total += len(w["truth"])
    skipped = [w for w in long_words if not w["usable"]]
    return right / total, ("; ".join(f"length {w['length']} left out: {w['reason']}" for w in skipped) or None)


ALIGNMENT_FIELDS = ("variable", "origin", "site", "position", "position_index", "test", "dim", "iia_changed", "iia_ci",
                    "changed_pairs", "random_iia_p95", "verdict", "init", "fit_steps")
"""What a row keeps of each DAS row (site x variable x positions): enough for an IIA map per checkpoint."""


def _mean(values: list[float]) -> float | None:
    return float(np.mean(values)) if values else None


def checkpoint_row(source: Source, sections: dict[str, Any], summary: dict[str, Any], parts: Any
                   ) -> dict[str, Any]:
    """One checkpoint's row from its diff's sections and summary (a part not asked for, or one that does not
    apply, gives null and its reason in ``reasons``)."""
    reasons: dict[str, str] = {}

    def absent(field: str, part: str) -> None:
        reasons[field] = f"the {part} part was not asked for (parts={','.join(parts)})"

    row: dict[str, Any] = {"step": source.step, "epoch": source.epoch, "training": source.metrics}
    if "behaviour" in sections:
        row["accuracy"], row["agreement"] = summary.get("trained_accuracy"), summary.get("agreement")
    else:
        row["accuracy"] = row["agreement"] = None
        absent("accuracy", "behaviour")
        absent("agreement", "behaviour")
    row["long_accuracy"] = None
    if "probes" in sections:
        row["probes"] = {f["label"]: {"r2": f["best_r2"], "site": f["best_site"]}
                         for f in sections["probes"]["features"]}
    else:
        row["probes"] = None
        absent("probes", "probes")
    if "alignment" in sections:
        row["verdicts"] = summary.get("verdicts") or {}
        row["alignment"] = [{key: r.get(key) for key in ALIGNMENT_FIELDS} for r in sections["alignment"]]
        if not row["verdicts"]:
            skipped = sections.get("alignment_details", {}).get("skipped", [])
            reasons["verdicts"] = "no variable fitted" + (
                f" ({'; '.join(str(s['reason']) for s in skipped)})" if skipped else "")
    else:
        row["verdicts"] = row["alignment"] = None
        absent("verdicts", "alignment")
        absent("alignment", "alignment")
    row["attention"] = _attention(sections, reasons, absent)
    row["circuit_overlap"] = _circuit(sections, reasons, absent)
    row["reasons"] = reasons
    return row


def _attention(sections: dict[str, Any], reasons: dict[str, str], absent: Callable[[str, str], None]) -> Any:
    table = sections.get("attention")
    if table is None:
        absent("attention", "attention")
        return None
    tv = {f"L{m['trained_layer']}H{m['trained_head']}~L{m['exact_layer']}H{m['exact_head']}": m["distance"]
          for m in table["matching"]}
    cls = table.get("cls_to_first")
    if cls is None:
        reasons["attention.cls_to_first"] = "the task reads no [CLS] position"
        return {"tv_distance": tv, "cls_to_first": None, "cls_to_first_exact": None}
    return {"tv_distance": tv, "cls_to_first": _mean([r["trained_summed"] for r in cls["rows"]]),
            "cls_to_first_exact": _mean([r["exact_summed"] for r in cls["rows"]])}


def _circuit(sections: dict[str, Any], reasons: dict[str, str], absent: Callable[[str, str], None]) -> Any:
    c = sections.get("circuit")
    if c is None:
        absent("circuit_overlap", "circuit")
        return None
    if not c["available"]:
        reasons["circuit_overlap"] = c["reason"]
        return None
    # between components: a post-LN model's every edge passes through a norm, which a norm-free construction
    # lacks, so its direct edges have no counterpart at all; without norms on either side the two are equal
    joined = c["edges"]["between_components"]
    return {"edge_jaccard": joined["jaccard"], "node_jaccard": c["nodes"]["jaccard"],
            "edge_auroc": joined["auroc"], "edges_shared": joined["shared"], "edges_exact": joined["truth"],
            "edges_found": joined["found"], "edge_comparison": "between components",
            "shared_edges": joined["shared_edges"], "exact_only": joined["exact_only"],
            "found_only": joined.get("found_only", []), "edge_jaccard_direct": c["edges"]["jaccard"]}


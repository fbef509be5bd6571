"""The diff's orchestrator: the request, the context both models share, the plan of steps the chosen
parts need (:func:`exactlens.analysis.diff.parts.plan`), each step run once, the result assembled.

The orchestrator depends on the parts; no part imports it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

from exactlens.analysis.diff.context import Context, prepare
from exactlens.analysis.diff.parts import Part, plan
from exactlens.analysis.diff.request import ECHOED, DiffRequest
from exactlens.devices import device_name
from exactlens.errors import ExactLensError
from exactlens.jsonio import jsonable
from exactlens.progress import say
from exactlens.requests import from_call, options_of

__all__ = ["diff", "request_of", "run_parts"]

PAGE_OPTIONS = ("html", "overwrite")  # the page's (el.diff, exactlens diff), not the comparison's


@torch.no_grad()
def diff(trained: Any, against: str, request: DiffRequest | None = None, *,
         progress: Callable[[str], None] | None = None, **options: Any) -> dict[str, Any]:
    """Compare ``trained`` with the construction ``against`` on the same words.

    The options are :class:`~exactlens.analysis.diff.request.DiffRequest`'s fields, given as a ``request``
    or as keyword arguments (``params``, ``lengths``, ``strings``, ``seed``, ``parts``, ``das_max_dim``,
    ``das_steps``, ``alignment_pairs``, ``untrained_baseline``, ``circuit_method``, ``circuit_granularity``,
    ``circuit_ablation``, ``exact_dtype``, ``test_fraction``, ``intervention_pairs``, ``quiet``, ``device``;
    here ``device`` defaults to None: where the trained model is; a model passed in is copied there, not
    moved). ``lengths``: default :data:`~exactlens.analysis.diff.runs.DEFAULT_LENGTHS`, keeping those both
    models accept; given explicitly, an unusable length is an error. Words are drawn and every comparison
    is computed on the CPU. ``progress``: where progress messages go (default: stderr unless ``quiet``).
    Returns a JSON-ready dict with the fields documented in docs/diff.md; ``summary`` holds one number per
    part."""
    start = time.perf_counter()
    request = request_of(trained, against, request, options)
    ctx = prepare(trained, against, request, progress or _stderr(request.quiet))
    result: dict[str, Any] = {"trained": ctx.side.info, "exact": ctx.exact.info, "task": ctx.task.spec(),
                              "settings": _settings(ctx, request), "residual_labels": ctx.labels}
    sections, summary = run_parts(ctx, request)
    result.update(sections)
    result["summary"] = summary
    result["seconds"] = time.perf_counter() - start
    return jsonable(result)


def run_parts(ctx: Context, request: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """The steps the request's parts need, run once each in the plan's order: the parts' sections and the
    summary (a timeline runs this for each of its models)."""
    sections: dict[str, Any] = {}
    summary: dict[str, Any] = {}
    for step in plan(request.parts):
        done = step.run(ctx, request)
        _check(step, done.sections, done.summary)
        ctx.values[step.name] = done.value
        sections.update(done.sections if step.name in request.parts else {})
        summary.update(done.summary)
    return sections, summary


def request_of(trained: Any, against: str, request: DiffRequest | None, options: dict[str, Any]) -> DiffRequest:
    """The request of one call: the one given, or one from the keyword arguments (checked by its kinds)."""
    if request is not None:
        if options:
            raise ExactLensError(f"diff takes a request or keyword options, not both (got {', '.join(options)})")
        if not isinstance(request, DiffRequest):
            raise ExactLensError(f"diff's request is a DiffRequest, got {type(request).__name__}")
        for f, opt in options_of(DiffRequest):  # one built by hand is checked as the entries check theirs
            value = getattr(request, f.name)
            if value is not None or f.default is not None:
                opt.kind.check(opt.api_name or f.name, value)
        return request
    page = [key for key in PAGE_OPTIONS if key in options]
    if page:
        raise ExactLensError(f"{', '.join(page)}: the page is el.diff's (or exactlens.viz.diff_page."
                             "write_diff_page's), not exactlens.analysis.diff.diff's")
    return from_call("diff", DiffRequest, (trained, against), {"device": None, **options})


def _stderr(quiet: bool) -> Callable[[str], None]:
    return lambda message: say(message, quiet)


def _settings(ctx: Context, request: DiffRequest) -> dict[str, Any]:
    echoed = {name: getattr(request, name) for name in ECHOED}
    readout = ctx.readout.text if ctx.readout is not None else "the model's own"
    return {"lengths": ctx.lengths, "skipped_lengths": ctx.skipped, **echoed, "parts": list(request.parts),
            "readout": readout, "device": device_name(ctx.device)}


def _check(step: Part, sections: dict[str, Any], summary: dict[str, Any]) -> None:
    """A step adds only the sections and summary keys it declares (its declaration in analysis/diff/parts/)."""
    extra = sorted(set(sections) - set(step.sections)) + sorted(set(summary) - set(step.summary))
    if extra:
        raise ExactLensError(f"diff step {step.name!r} added {', '.join(extra)}, which its declaration lacks")

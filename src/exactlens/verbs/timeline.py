"""``exactlens timeline RUN --against NAME [--html FILE] [--json]``: every checkpoint of a run compared with an exact
construction, and when (in what order) the trained model becomes the exact circuit
(:func:`exactlens.analysis.timeline.timeline`; docs/formation.md).

RUN is a run directory trained with ``--checkpoint-every K`` or ``--checkpoints log:N`` (or one seed's
``seedN``); in Python also a train result or a list of models, checkpoint directories, state dicts (with
``model=``) or TransformerLens models (``steps=`` gives their steps). The options are
:class:`exactlens.analysis.timeline.request.TimelineRequest` (the diff's, plus the timeline's).
"""

from __future__ import annotations

from typing import Any

from exactlens.analysis.timeline.request import TimelineRequest
from exactlens.results import Result, View
from exactlens.verbs import VerbSpec, register_verb, tell
from exactlens.verbs.common import num

__all__ = ["TimelineRequest", "format_timeline_text", "run"]


def run(request: Any) -> Result:
    from exactlens.analysis.timeline import timeline

    if request.html is not None:  # before the work: a page that cannot be written is said now, not after minutes
        from exactlens.viz.timeline import check_timeline_page

        check_timeline_page(request.html, request.overwrite)
    label = request.target if isinstance(request.target, str) else type(request.target).__name__
    tell(f"timeline: {label} against {request.against}")
    data = timeline(request.target, request.against, request, progress=tell if request.quiet else None)
    return Result("timeline", data)


def after(request: Any, result: Result, from_cli: bool) -> None:
    """The --html page (exactlens.viz.timeline), after the result is out: a failing page write cannot lose it."""
    if request.html is not None:
        from exactlens.viz.timeline import write_timeline_page

        path = write_timeline_page(result.to_dict(), request.html, checkpoints=request.target,
                                   overwrite=request.overwrite)
        tell(f"timeline: wrote {path}")


def checkpoint_line(row: dict[str, Any]) -> str:
    """One checkpoint: step, accuracy, agreement, long accuracy, the variables computed, the circuit overlap."""
    verdicts = row.get("verdicts")
    computed = "-" if verdicts is None else ", ".join(name for name, v in verdicts.items()
                                                      if v.get("verdict") == "computed") or "none"
    overlap = row.get("circuit_overlap")
    edge = "-" if overlap is None else num(overlap.get("edge_jaccard"), ".2f")
    return (f"  step {row['step']:>8}  accuracy {num(row.get('accuracy'))}  agreement {num(row.get('agreement'))}"
            f"  long {num(row.get('long_accuracy'))}  edge Jaccard {edge}  computed: {computed}"
            f"  ({row.get('seconds', 0.0):.1f} s)")


def format_timeline_text(data: dict[str, Any]) -> str:
    """The timeline as text: one line per checkpoint, then the order of the events."""
    s = data["settings"]
    lines = [f"timeline of {data['run']['checkpoints']} checkpoints against {data['exact']['name']} on lengths "
             f"{s['lengths']} (long: {s['long_lengths']})"]
    lines += [checkpoint_line(row) for row in data["checkpoints"]]
    reasons = {key: why for row in data["checkpoints"] for key, why in row.get("reasons", {}).items()}
    lines += [f"  {key}: null ({why})" for key, why in reasons.items()]
    lines.append(f"order: {data['events']['order']}")
    return "\n".join(lines)


def headline(data: dict[str, Any]) -> list[tuple[str, Any]]:
    e = data["events"]
    unmeasured = set(e.get("not_measured") or ())

    def step(key: str) -> Any:
        return "not measured" if key in unmeasured else e[key]

    return ([("against", data["exact"]["name"]), ("checkpoints", data["run"]["checkpoints"]),
             ("accuracy 0.99 from step", step("behaviour")), ("long lengths 0.99 from step", step("long_behaviour")),
             ("circuit overlap final from step", e["circuit"])]
            + [(f"{name} computed from step", None if v is None else v["step"]) for name, v in e["variables"].items()]
            + [("order", e["order"])])


def plot(result: Result) -> Any:
    """The timeline's figure, exactlens.viz.timeline.timeline_figure (None until that module exists)."""
    import importlib.util

    if importlib.util.find_spec("exactlens.viz.timeline") is None:
        return None
    from exactlens.viz import timeline as figure

    return figure.timeline_figure(result.to_dict())


register_verb(VerbSpec(
    "timeline", "compare every checkpoint of a run with an exact construction: when each variable forms, "
    "against accuracy, length generalisation and circuit overlap", TimelineRequest, run,
    views={"timeline": View(headline, format_timeline_text, plot)}, description=__doc__.split("\n\n")[0],
    after=after, order=55))

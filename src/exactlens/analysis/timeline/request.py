"""The timeline's options, declared once (exactlens.requests): ``exactlens timeline``'s flags and
``el.timeline``'s keyword arguments.

The comparison's options are the diff's (:class:`~exactlens.analysis.diff.request.DiffRequest`'s fields,
taken from it by name, not copied); the timeline adds its own (which checkpoints, their steps, a template
for state dicts, the long lengths, the warm-started DAS steps) and changes three defaults (the parts, the
untrained DAS baseline, the help of ``lengths``). Light at import (no torch).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from exactlens.analysis.diff.request import DiffRequest
from exactlens.requests import Any_, Bool, Int, IntList, Lengths, Path_, TextList, option

__all__ = ["DEFAULT_PARTS", "FROM_DIFF", "TimelineRequest", "check_long_words", "resolved"]

DEFAULT_PARTS = ("behaviour", "probes", "attention", "alignment", "circuit")
"""What a checkpoint's row reports (weights and interventions can be asked for; the row does not show them)."""

FROM_DIFF = ("readout", "param", "lengths", "strings", "seed", "parts", "das_max_dim", "das_steps",
             "alignment_pairs", "pairs", "untrained_baseline", "circuit_method", "circuit_granularity",
             "circuit_ablation", "device", "exact_dtype", "test_fraction", "intervention_pairs", "quiet")
"""DiffRequest's fields the timeline takes (``target`` is the run here; the diff's page options are not its)."""


def _diff_field(name: str, **changes: Any) -> tuple[str, Any, Any]:
    """One of DiffRequest's fields, its option changed where the timeline's differs."""
    f = next(f for f in dataclasses.fields(DiffRequest) if f.name == name)
    opt = f.metadata["option"]
    default = changes.pop("default", f.default)
    if changes:
        opt = dataclasses.replace(opt, **changes)
    if f.default_factory is not dataclasses.MISSING and default is dataclasses.MISSING:
        return name, f.type, dataclasses.field(default_factory=f.default_factory, metadata={"option": opt})
    return name, f.type, dataclasses.field(default=default, metadata={"option": opt})


CHANGED = {
    "lengths": {"help": "word lengths A:B[:STEP] or a,b,c (default: the run's training lengths where its run.json "
                        "or train result records them, else the diff's 1..32)"},
    "parts": {"default": DEFAULT_PARTS, "kind": TextList(choices=DiffRequest.__dataclass_fields__["parts"].metadata[
        "option"].kind.choices), "help": f"comma-separated diff parts (default: {','.join(DEFAULT_PARTS)})"},
    "untrained_baseline": {"default": False, "flag": "--untrained-baseline", "negate": False,
                           "help": "also fit DAS on an untrained model at every checkpoint (default off: the "
                                   "step-0 checkpoint is the run's own untrained model)"},
}

_OWN = [
    ("target", Any, dataclasses.field(metadata={"option": dataclasses.replace(
        DiffRequest.__dataclass_fields__["target"].metadata["option"], metavar="RUN", api_name="run",
        help="a run directory with checkpoints (exactlens train --checkpoint-every K; or one seed's seedN); in "
             "Python also a train result, or a list of models, checkpoint directories, state dicts (with "
             "model=) or TransformerLens models")})),
    ("against", str, DiffRequest.__dataclass_fields__["against"]),
]

_TAIL = [
    ("steps", Any, option(None, kind=IntList(0), cli=False,
                          help="the steps of a list of checkpoints, increasing (default 0, 1, ...)")),
    ("model", Any, option(None, kind=Any_(), cli=False,
                          help="a model whose shape the state dicts in a list fill (required for state dicts)")),
    ("long_lengths", Any, option(None, kind=Lengths(0), metavar="LENGTHS",
                                 help="longer lengths for length generalisation (default: the run's test length "
                                      "when it is longer than the longest length, else twice the longest)")),
    ("das_warm_steps", Any, option(None, kind=Int(1), metavar="N",
                                   help="Adam steps of a DAS fit warm-started from the previous checkpoint's "
                                        "subspace (default: a quarter of --das-steps, at least 10)")),
]

_PAGE = [  # the page (exactlens.viz.timeline.write_timeline_page), as the diff's --html
    ("html", Any, option(None, kind=Path_(), metavar="FILE",
                         help="also write an HTML page: the figure, the table of checkpoints, the IIA per checkpoint "
                              "and attention views at the first, middle and last checkpoint (in FILE_stem_files/)")),
    ("overwrite", bool, option(False, kind=Bool(), help="replace an existing --html page and its files")),
]
_TAIL += _PAGE

TimelineRequest = dataclasses.make_dataclass(
    "TimelineRequest",
    _OWN + [_diff_field(name, **CHANGED.get(name, {})) for name in FROM_DIFF] + _TAIL,
    frozen=True)
TimelineRequest.__module__ = __name__
TimelineRequest.__doc__ = ("``exactlens timeline RUN --against NAME ...`` / ``el.timeline(run, against, ...)``: "
                           "the diff's options (exactlens.analysis.diff.request.DiffRequest) and the timeline's.")


def resolved(request: Any, lengths: Any) -> Any:
    """The request each checkpoint is compared with: its ``lengths`` and the warm-started DAS steps settled
    (the diff's parts read the same fields from it as from a DiffRequest)."""
    warm = request.das_warm_steps if request.das_warm_steps is not None else max(10, request.das_steps // 4)
    return dataclasses.replace(request, lengths=lengths, das_warm_steps=min(warm, request.das_steps))


WORD_POSITION_BYTES = 64  # per position of a long word kept for every checkpoint: ids, tokens, truth, residuals


def check_long_words(length: int, strings: int, checkpoints: int) -> None:
    """The timeline's one estimate of a long length's cost: the words kept, and at least one attention score per
    query and key for every checkpoint; refused beyond the memory or work limit before any word is drawn. Asked by
    ``timeline`` before any checkpoint is read, for a run's recorded test length before its words are drawn, and by
    a sweep's spec check."""
    from exactlens.resources import check_memory, check_work

    what = f"long length {length:,} ({strings:,} words, {checkpoints:,} checkpoint{'s' if checkpoints != 1 else ''})"
    lower = "give shorter --long-lengths (or fewer --strings)"
    check_memory(float(strings) * (length + 2) * WORD_POSITION_BYTES, what, lower)
    check_work(float(checkpoints) * strings * float(length + 2) ** 2, what, lower)

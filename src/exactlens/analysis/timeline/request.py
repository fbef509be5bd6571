"""The timeline's options, declared once (exactlens.requests): ``exactlens timeline``'s flags and
``el.timeline``'s keyword arguments.

The comparison's options are the diff's, inherited (:class:`~exactlens.analysis.diff.request.DiffOptions`: a new
diff option is one field there); the timeline adds its own (which checkpoints, their steps, a template for state
dicts, the long lengths, the warm-started DAS steps, its page) and changes the run's metavar, two defaults (the
parts, the untrained DAS baseline) and the help of ``lengths``. Light at import (no torch).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from exactlens.analysis.diff.parts import PARTS
from exactlens.analysis.diff.request import DiffOptions
from exactlens.requests import Any_, Bool, Int, IntList, Lengths, Path_, TextList, option

__all__ = ["DEFAULT_PARTS", "TimelineRequest", "check_long_words", "resolved"]

DEFAULT_PARTS = ("behaviour", "probes", "attention", "alignment", "circuit")
"""What a checkpoint's row reports (weights and interventions can be asked for; the row does not show them)."""


@dataclass(frozen=True)
class TimelineRequest(DiffOptions):
    """``exactlens timeline RUN --against NAME ...`` / ``el.timeline(run, against, ...)``: the diff's options
    (inherited from DiffOptions; the four redeclared here keep their place and change their default or help) and the
    timeline's own."""

    target: Any = option(positional=True, kind=Any_(), metavar="RUN", api_name="run",
                         help="a run directory with checkpoints (exactlens train --checkpoint-every K; or one seed's "
                              "seedN); in Python also a train result, or a list of models, checkpoint directories, "
                              "state dicts (with model=) or TransformerLens models")
    lengths: list | None = option(None, kind=Lengths(0),
                                  help="word lengths A:B[:STEP] or a,b,c (default: the run's training lengths where "
                                       "its run.json or train result records them, else the diff's 1..32)")
    parts: tuple = option(DEFAULT_PARTS, kind=TextList(choices=PARTS), metavar="PART,...",
                          help=f"comma-separated diff parts (default: {','.join(DEFAULT_PARTS)})")
    untrained_baseline: bool = option(False, kind=Bool(), flag="--untrained-baseline",
                                      help="also fit DAS on an untrained model at every checkpoint (default off: the "
                                           "step-0 checkpoint is the run's own untrained model)")
    steps: Any = option(None, kind=IntList(0), cli=False,
                        help="the steps of a list of checkpoints, increasing (default 0, 1, ...)")
    model: Any = option(None, kind=Any_(), cli=False,
                        help="a model whose shape the state dicts in a list fill (required for state dicts)")
    long_lengths: Any = option(None, kind=Lengths(0), metavar="LENGTHS",
                               help="longer lengths for length generalisation (default: the run's test length when it "
                                    "is longer than the longest length, else twice the longest)")
    das_warm_steps: Any = option(None, kind=Int(1), metavar="N",
                                 help="Adam steps of a DAS fit warm-started from the previous checkpoint's subspace "
                                      "(default: a quarter of --das-steps, at least 10)")
    # the page (exactlens.viz.timeline.write_timeline_page), as the diff's --html
    html: Any = option(None, kind=Path_(), metavar="FILE",
                       help="also write an HTML page: the figure, the table of checkpoints, the IIA per checkpoint "
                            "and attention views at the first, middle and last checkpoint (in FILE_stem_files/)")
    overwrite: bool = option(False, kind=Bool(), help="replace an existing --html page and its files")


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

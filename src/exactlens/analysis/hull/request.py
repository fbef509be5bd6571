"""The request of ``hull`` (unselectable keys), beside the functions that take its defaults (the tolerance of
exactlens.analysis.hull.keys, .model, .random): light (no torch), so the verb's module imports it at
``exactlens --help``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from exactlens.interop.readout import ReadoutKind
from exactlens.requests import Float, Int, Lengths, Text, device_option, option

__all__ = ["HullRequest"]


@dataclass(frozen=True)
class HullRequest:
    target: Any = option(None, positional=True, metavar="CHECKPOINT_DIR | NAME",
                         help="a checkpoint directory or a construction name (see `exactlens list`); omitted: "
                              "random keys without and with layer norm (Brody Fig. 1c/1d)")
    tol: float = option(1e-9, kind=Float(0.0, 1.0, open_lo=True, open_hi=True),
                        help="relative tolerance of the hull check (default 1e-9)")
    seed: int = option(0, kind=Int(0), help="seed of the sampled words / tokens / keys")
    lengths: list | None = option(None, kind=Lengths(0), help="word lengths whose keys are checked, A:B[:STEP] or "
                                  "a,b,c (default: a few up to the construction's longest); for a checkpoint "
                                  "directory, numbers of token positions (default 4, 8, 16)")
    device: Any = device_option("the model runs there; keys come back to the CPU for the linear programs")
    task: str | None = option(None, kind=Text(), metavar="NAME",
                              help="the task of a model that records none (a TransformerLens or Hugging Face model): "
                                   "its words are sampled")
    readout: Any = option(None, kind=ReadoutKind(), metavar="POSITION[/OUTPUTS]",
                          help="where such a model answers (default: the task's; see `exactlens task NAME`)")

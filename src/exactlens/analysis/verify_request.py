"""The requests of ``verify`` and ``precision``, beside the functions that take their defaults
(exactlens.analysis.verify): light (no torch), so the verbs' modules import them at ``exactlens --help``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from exactlens.interop.readout import readout_option
from exactlens.requests import ConstructionRequest, Int, Lengths, model_target_option, option, task_option

__all__ = ["ModelTargetRequest", "PrecisionRequest", "VerifyRequest"]


@dataclass(frozen=True)
class ModelTargetRequest(ConstructionRequest):
    """A construction's options, or a model's: NAME is a construction or a model (exactlens.interop.model_target),
    with the task and readout of a model that records none."""

    name: Any = model_target_option()
    task: str | None = task_option()
    readout: Any = readout_option()


@dataclass(frozen=True)
class VerifyRequest(ModelTargetRequest):
    lengths: list | None = option(None, kind=Lengths(0), help="A:B[:STEP] (inclusive) or a,b,c; default 1:12 (up to "
                                  "the construction's longest)")
    strings: int = option(1000, kind=Int(1), help="random strings per length (short lengths: all)")


@dataclass(frozen=True)
class PrecisionRequest(ModelTargetRequest):
    max_length: int | None = option(None, kind=Int(1), help="longest length scanned (default 1000, or the "
                                    "construction's longest stated length; a model's: its position table's)")
    strings: int = option(64, kind=Int(1), help="random strings per length, plus the hard ones")

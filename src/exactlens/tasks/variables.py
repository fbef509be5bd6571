"""Named causal variables of a task: quantities of the input that a solution may compute.

A variable is a function of the input words (e.g. "first symbol", "ones", "depth at i",
"previous category"). Where the task's answer is a known function of the variable and the rest
of the input, the variable also says what the answer becomes when its value is *set*: that is
the high-level causal model an interchange intervention is scored against (Geiger et al.'s
interchange-intervention accuracy). For a (base, source) pair of words,

    counterfactual(base, source) = intervene(base, values(source))

is the target the task would give if the base word's variable took the source word's value.
Setting a variable to the base word's own value gives the base word's target back, for every
word: tests check this identity for every variable of every task.

``scope`` is "word" (one value per word, e.g. [B] or [B, k]) or "position" (one value per
symbol position, [B, L]; base and source must then have the same length).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from exactlens.errors import ExactLensError

SCOPES = ("word", "position")


@dataclass(frozen=True)
class CausalVariable:
    name: str
    scope: str
    compute: Callable[[torch.Tensor], torch.Tensor]  # symbol ids [B, L] -> values
    intervene: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None  # (base ids, values) -> targets
    description: str = ""

    def __post_init__(self) -> None:
        if self.scope not in SCOPES:
            raise ExactLensError(f"variable {self.name!r}: scope must be one of {SCOPES}, got {self.scope!r}")

    def values(self, ids: torch.Tensor) -> torch.Tensor:
        return self.compute(ids)

    @property
    def interventional(self) -> bool:
        """True when setting the variable has a known effect on the answer."""
        return self.intervene is not None

    def counterfactual(self, base: torch.Tensor, source: torch.Tensor) -> torch.Tensor:
        """The targets of the base words with this variable set to the source words' values."""
        if self.intervene is None:
            raise ExactLensError(f"variable {self.name!r} has no known effect on the answer (no intervene)")
        if base.shape[0] != source.shape[0]:
            raise ExactLensError(f"base and source batches differ in size: {base.shape[0]} vs {source.shape[0]}")
        if self.scope == "position" and base.shape[1] != source.shape[1]:
            raise ExactLensError(
                f"variable {self.name!r} has one value per position: base and source words need the same "
                f"length, got {base.shape[1]} and {source.shape[1]}"
            )
        return self.intervene(base, self.compute(source))

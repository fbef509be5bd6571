"""The ExactTransformer copy of a model read by a callable readout: its full logits are kept (every
position, every output) and :meth:`CalledReadout.select_readout` applies the user's function to them, so
every verb that reads outputs through ``select_readout`` (verify, discover, the diff) reads what the user
reads. Its ``cfg.readout`` is ``per_position`` (the logits whole); the task's reader decides on what the
callable returns."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from exactlens.model import ExactTransformer


class CalledReadout(ExactTransformer):
    def __init__(self, cfg: Any, readout_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]):
        super().__init__(cfg)
        self.readout_fn = readout_fn

    def select_readout(self, logits: torch.Tensor, n_positions: torch.Tensor) -> torch.Tensor:
        return self.readout_fn(logits, n_positions)

"""A model exactlens did not build, read through its own forward pass where its weights cannot be copied
into an ExactTransformer (rotary positions, RMS norm, a vocabulary larger than the task's ...): what
``verify`` and ``precision`` need of a model (``readout``, ``cfg``, ``forward_operations``), nothing more.
Verbs that read weights or hooks of a copy (discover, hull) refuse such a model with the copy's reason."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from exactlens.interop.readout import Readout

__all__ = ["DirectModel"]


@dataclass
class DirectConfig:
    """The few config fields verify and precision read (an ExactConfig's names)."""

    task: dict[str, Any]
    dtype: str
    n_ctx: int
    model_name: str
    readout: str = "per_position"  # the readout is applied in DirectModel.readout, never by the caller
    decision_rule: str | None = None
    learned_positions: bool = True  # its context caps the lengths, whatever its positional scheme
    metadata: dict[str, Any] = field(default_factory=dict)

    @property
    def torch_dtype(self) -> torch.dtype:
        return torch.float64 if self.dtype == "float64" else torch.float32


class DirectModel(torch.nn.Module):
    """``model`` answering ``task`` as ``spec`` reads it, run as it is (eval mode, its own device)."""

    def __init__(self, model: Any, task: Any, spec: Readout, facts: dict[str, Any], refused: str):
        super().__init__()
        self.model = model
        self.task = task
        self.spec = spec
        self.facts = facts
        self.refused = refused  # why no ExactTransformer copy was made
        param = next(iter(model.parameters()))
        self.cfg = DirectConfig(task=task.spec(), dtype="float64" if param.dtype == torch.float64 else "float32",
                                n_ctx=int(facts["n_ctx"]), model_name=f"{facts['source']} ({task.name}, readout "
                                                                      f"{spec.text})")

    @property
    def device(self) -> torch.device:
        return next(iter(self.model.parameters())).device

    def forward_operations(self, batch: int, n_pos: int) -> float:
        """Multiply-adds of one forward pass (attention, MLP, unembedding), for the work limit."""
        f = self.facts
        width = f["n_heads"] * f["d_head"]
        per_layer = n_pos * (4 * f["d_model"] * width + 2 * n_pos * width + 2 * f["d_model"] * f["d_mlp"])
        return float(batch * (f["n_layers"] * per_layer + n_pos * f["d_model"] * f["d_vocab_out"]))

    @torch.no_grad()
    def readout(self, tokens: torch.Tensor, n_positions: torch.Tensor | None = None, *, readout_only: bool = False,
                max_score_bytes: int | None = None) -> torch.Tensor:
        if n_positions is None:
            n_positions = torch.full((tokens.shape[0],), tokens.shape[1], dtype=torch.long)
        self.model.eval()
        logits = self.model(tokens.to(self.device)).detach().cpu().to(self.cfg.torch_dtype)
        return self.spec.apply(self.task, logits, n_positions.cpu())

    def select_readout(self, logits: torch.Tensor, n_positions: torch.Tensor) -> torch.Tensor:
        return self.spec.apply(self.task, logits, n_positions)

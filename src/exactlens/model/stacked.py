"""R runs of one configuration as one computation: the model's own forward, mapped over runs.

Training several seeds (or settings that share an architecture) pays a step's fixed cost once:
every parameter gets a leading run axis [R, ...], inputs are [R, batch, pos], and
``torch.vmap`` maps :meth:`ExactTransformer.run` (the forward pass of every model) over the run
axis, so each kernel is launched once for all runs. The mapped module is ``models[0]``: a hook
added to it applies to every run (hooks on the other models are not called). Runs share no parameter
and no gradient (a loss that sums per-run losses gives each run its own gradient), so this is
R independent models computed together. There is no second implementation of the model here:
whatever the model computes, the stacked runs compute (tests compare them for every
construction and every switch).

One run needs no mapping: :class:`SingleRun` calls the model itself on its own parameters (no
``functional_call``, no per-parameter views in the graph, ~1 ms less per step at the training
loop's small sizes) and shows them with a run axis of 1, so that the training loop treats one run
and many alike; :func:`training_runs` picks the one or the other. :class:`FlatLeaves` holds the trainable
parameters of either in one flat buffer for the optimizer, and :func:`check_drawn` checks the training loop's
own words once per shape (both for speed; docs/training.md, Speed).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from exactlens.errors import ExactLensError
from exactlens.model.fastpath import FastPath, HandReadout
from exactlens.model.transformer import ExactTransformer


class _Run(nn.Module):
    """Calls the model's checked-input forward, so that torch.func.functional_call can map it."""

    def __init__(self, model: ExactTransformer):
        super().__init__()
        self.m = model

    def forward(self, tokens: torch.Tensor, n_positions: torch.Tensor, padded: bool, readout_only: bool):
        logits = self.m.run(tokens, n_positions, padded, readout_only=readout_only)
        return self.m.select_readout(logits, n_positions)


class StackedRuns:
    """R models of one configuration, computed together; ``params`` are what an optimizer updates."""

    def __init__(self, models: Sequence[ExactTransformer]):
        if not models:
            raise ExactLensError("StackedRuns needs at least one model")
        first = models[0].cfg.to_dict()
        for model in models[1:]:
            if model.cfg.to_dict() != first:
                raise ExactLensError("stacked models must share one configuration (the same ExactConfig)")
        self.models = list(models)
        self._run = _Run(models[0])
        tables = [dict(m.named_parameters()) for m in models]
        self.params = {
            name: torch.stack([t[name].detach() for t in tables]).requires_grad_(param.requires_grad)
            for name, param in tables[0].items()
        }
        self._shapes: set[tuple] = set()

    def __len__(self) -> int:
        return len(self.models)

    @property
    def trainable(self) -> list[torch.Tensor]:
        return [p for p in self.params.values() if p.requires_grad]

    def readout(self, tokens: torch.Tensor, n_positions: torch.Tensor, readout_only: bool = True,
                drawn: bool = False) -> torch.Tensor:
        """Each run's readout on its own batch: tokens [R, B, pos] (right-padded), n_positions [R, B]
        -> outputs [R, B, ...] (the shapes of ExactTransformer.readout). ``drawn``: the words are the training
        loop's own (see ``check_drawn``)."""
        runs = len(self.models)
        if tokens.ndim != 3 or tokens.shape[0] != runs or n_positions.shape != tokens.shape[:2]:
            raise ExactLensError(
                f"stacked input must be tokens [R={runs}, batch, pos] and n_positions [R, batch], got "
                f"{tuple(tokens.shape)} and {tuple(n_positions.shape)}"
            )
        base = self._run.m
        if drawn:
            padded = check_drawn(base, tokens.flatten(0, 1), n_positions.flatten(), self._shapes)
        else:
            _, padded = base._check_input(tokens.flatten(0, 1), n_positions.flatten())
        weights = {f"m.{name}": value for name, value in self.params.items()}

        def one(params: dict[str, torch.Tensor], t: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
            return torch.func.functional_call(self._run, params, (t, n, padded, readout_only))

        if runs == 1:  # one run: its parameters seen through the run axis, no mapping needed
            return one({k: v[0] for k, v in weights.items()}, tokens[0], n_positions[0].long())[None]
        return torch.vmap(one)(weights, tokens, n_positions.long())

    @torch.no_grad()
    def sync(self) -> None:
        """Copy run r of every stacked parameter into models[r]."""
        for r, model in enumerate(self.models):
            for name, param in model.named_parameters():
                param.copy_(self.params[name][r])

    def train(self, mode: bool = True) -> StackedRuns:
        for model in self.models:
            model.train(mode)
        return self

    def set_fused(self, fused: bool) -> StackedRuns:
        """Fused kernels in the mapped forward (ExactTransformer.set_fused)."""
        self._run.m.set_fused(fused)
        return self

    def grad(self, name: str) -> torch.Tensor | None:
        """The gradient of parameter ``name``, [R, ...] (None before a backward pass)."""
        return self.params[name].grad

    def freeze(self, name: str) -> None:
        """Train parameter ``name`` no more (no gradient, left out of ``trainable``)."""
        self.params[name].requires_grad_(False)

    def close(self) -> None:
        """Nothing to undo (SingleRun's counterpart restores the model's flags)."""


class SingleRun:
    """One model with the interface of StackedRuns (R = 1), run directly: the optimizer updates the
    model's own parameters (``trainable``), ``params`` shows them as [1, ...] views (so a penalty or a
    check written for the run axis reads them unchanged, gradients included), and ``readout`` calls
    ``ExactTransformer.run`` with no mapping. Numerically the same computation as
    ``StackedRuns([model])``: the same operations on the same values (tests/train/test_single_run.py)."""

    def __init__(self, model: ExactTransformer, fast: bool = True):
        self.models = [model]
        self.model = model
        self.fast = FastPath(model) if fast else None
        self._own = dict(model.named_parameters())
        self._flags = {name: p.requires_grad for name, p in self._own.items()}
        self._shapes: set[tuple] = set()

    def __len__(self) -> int:
        return 1

    @property
    def params(self) -> dict[str, torch.Tensor]:
        """Every parameter with a run axis of 1 (views: gradients flow to the model's parameters)."""
        return {name: p.unsqueeze(0) for name, p in self._own.items()}

    @property
    def trainable(self) -> list[torch.Tensor]:
        return [p for p in self._own.values() if p.requires_grad]

    def readout(self, tokens: torch.Tensor, n_positions: torch.Tensor, readout_only: bool = True,
                drawn: bool = False) -> torch.Tensor:
        """StackedRuns.readout for one run: tokens [1, B, pos], n_positions [1, B] -> outputs [1, B, ...]."""
        if tokens.ndim != 3 or tokens.shape[0] != 1 or n_positions.shape != tokens.shape[:2]:
            raise ExactLensError(
                f"stacked input must be tokens [R=1, batch, pos] and n_positions [R, batch], got "
                f"{tuple(tokens.shape)} and {tuple(n_positions.shape)}"
            )
        model = self.model
        if drawn:
            checked = n_positions[0].long()
            padded = check_drawn(model, tokens[0], checked, self._shapes)
        else:
            checked, padded = model._check_input(tokens[0], n_positions[0])
        if self.fast is not None and model.training:
            out = self.fast.readout(tokens[0], padded, readout_only)
            if out is not None:
                return out[None]
        logits = model.run(tokens[0], checked, padded, readout_only=readout_only)
        return model.select_readout(logits, checked)[None]

    def by_hand(self, tokens: torch.Tensor, n_positions: torch.Tensor) -> HandReadout | None:
        """The training loop's own words (``readout(..., drawn=True)``) through FastPath.by_hand: outputs [B] or
        [B, out] with no autograd and their backward to call, or None where the hand-written path does not
        apply (then ``readout`` runs)."""
        if self.fast is None or not self.model.training:
            return None
        padded = check_drawn(self.model, tokens[0], n_positions[0].long(), self._shapes)
        return self.fast.by_hand(tokens[0], padded)

    def use_flat(self, flat: FlatLeaves) -> None:
        """The optimizer updates ``flat``: the hand-written readout gives it one gradient (model.fastpath)."""
        if self.fast is not None:
            self.fast.use_flat(flat.flat, flat.leaves)

    def sync(self) -> None:
        """Nothing to copy: the optimizer updates the model's own parameters."""

    def train(self, mode: bool = True) -> SingleRun:
        self.model.train(mode)
        return self

    def set_fused(self, fused: bool) -> SingleRun:
        self.model.set_fused(fused)
        return self

    def grad(self, name: str) -> torch.Tensor | None:
        """The gradient of parameter ``name`` as [1, ...] (a view: changing it changes the model's)."""
        grad = self._own[name].grad
        return None if grad is None else grad.unsqueeze(0)

    def freeze(self, name: str) -> None:
        """Train parameter ``name`` no more, until ``close`` gives the model back its own flags."""
        self._own[name].requires_grad_(False)

    def close(self) -> None:
        """Restore each parameter's requires_grad as the model had it (``freeze`` changes them)."""
        if self.fast is not None:
            self.fast.flat = None  # the flat buffer is released with the optimizer
        for name, p in self._own.items():
            p.requires_grad_(self._flags[name])


class FlatLeaves:
    """Leaf tensors (parameters) laid out in one flat buffer, with their gradients in another: an optimizer
    updates ``flat`` (one tensor: one fused Adam call and one zeroing per step instead of one per parameter) and
    each leaf sees the update, being a view of it; each leaf's gradient is a view of ``flat.grad``, into which
    backward adds in place. ``zero_grad`` zeroes the one buffer; ``release`` gives every leaf its own storage back
    (its values and last gradient), as it had before. The same values step for step: 0 + g is g (the sign of a
    zero aside), and the optimizer's arithmetic is per element (tests/train/test_bit_identical.py)."""

    def __init__(self, leaves: Sequence[torch.Tensor]):
        self.leaves = list(leaves)
        with torch.no_grad():
            self.flat = torch.cat([t.detach().reshape(-1) for t in self.leaves]).requires_grad_(True)
        self.flat.grad = torch.zeros_like(self.flat)
        offset = 0
        for leaf in self.leaves:
            n = leaf.numel()
            leaf.data = self.flat.detach()[offset : offset + n].view_as(leaf)
            leaf.grad = self.flat.grad[offset : offset + n].view_as(leaf)
            offset += n

    def zero_grad(self) -> None:
        self.flat.grad.zero_()

    def release(self) -> None:
        for leaf in self.leaves:
            leaf.data = leaf.detach().clone()
            leaf.grad = None if leaf.grad is None else leaf.grad.clone()


def flat_or_not(leaves: list[torch.Tensor]) -> FlatLeaves | None:
    """FlatLeaves of the leaves when there are several, all of one dtype and device (else None)."""
    if len(leaves) < 2 or len({(t.dtype, t.device) for t in leaves}) > 1:
        return None
    return FlatLeaves(leaves)


def check_drawn(model: ExactTransformer, tokens: torch.Tensor, n_positions: torch.Tensor, seen: set[tuple]) -> bool:
    """Whether some row is padded, for words [B, pos] the training loop drew (the task's encoder checked their
    ids): the model's whole input check (ids, positions, the forward pass's work and memory) runs once per shape
    and padding, recorded in ``seen``; after that only the padding is read (one comparison instead of the
    checks' reductions and limits, every step)."""
    padded = bool((n_positions != tokens.shape[1]).any())
    key = (tuple(tokens.shape), padded)
    if key not in seen:
        model._check_input(tokens, n_positions)
        seen.add(key)
    return padded


def training_runs(models: Sequence[ExactTransformer]) -> StackedRuns | SingleRun:
    """What the training loop computes its runs with: SingleRun for one model, else StackedRuns."""
    return SingleRun(models[0]) if len(models) == 1 else StackedRuns(models)

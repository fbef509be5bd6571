"""Training data: fresh words from the task every epoch, tokenized into right-padded batches.

A batch holds words whose lengths are either one fixed |w| or drawn uniformly from an
inclusive range; words of different lengths are right-padded and carry n_positions (the model
masks padded keys and computes positional features from the real n). Targets are the task's
(``Task.targets``): membership bits, class indices, or one entry per symbol position (padded
with 0 past a word's end; the task's target mask says which entries are real).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from exactlens.errors import ExactLensError
from exactlens.tasks import Task

PAD_ID = 0  # any valid token id: padded keys are masked and padded queries are never read


@dataclass
class Batch:
    tokens: torch.Tensor  # [batch, pos] long, right-padded
    n_positions: torch.Tensor  # [batch] real positions (|w| + specials)
    targets: torch.Tensor  # [batch] or [batch, L]: the task's targets
    lengths: torch.Tensor  # [batch] |w|

    def __len__(self) -> int:
        return self.tokens.shape[0]

    @property
    def padded(self) -> bool:
        return bool((self.n_positions != self.tokens.shape[1]).any())

    def to(self, device: torch.device) -> Batch:
        """The batch on ``device`` (itself when it is there already)."""
        if self.tokens.device == torch.device(device):
            return self
        return Batch(*(t.to(device) for t in (self.tokens, self.n_positions, self.targets, self.lengths)))

    def rows(self, index: torch.Tensor | slice) -> Batch:
        """A sub-batch (padding trimmed to its longest row)."""
        n_pos = self.n_positions[index]
        width = int(n_pos.max())
        targets = self.targets[index]
        if targets.ndim == 2:
            targets = targets[:, : int(self.lengths[index].max())]
        return Batch(self.tokens[index][:, :width], n_pos, targets, self.lengths[index])


def check_lengths(lengths: int | tuple[int, int], what: str = "train_length") -> tuple[int, int]:
    """A fixed |w| or an inclusive range (lo, hi) -> (lo, hi)."""
    if isinstance(lengths, bool):
        raise ExactLensError(f"{what} must be an integer |w| >= 0 or a range (lo, hi), got {lengths!r}")
    if isinstance(lengths, int):
        lo = hi = lengths
    elif (
        isinstance(lengths, (tuple, list))
        and len(lengths) == 2
        and all(isinstance(v, int) and not isinstance(v, bool) for v in lengths)
    ):
        lo, hi = lengths
    else:
        raise ExactLensError(f"{what} must be an integer |w| >= 0 or a range (lo, hi), got {lengths!r}")
    if lo < 0 or hi < lo:
        raise ExactLensError(f"{what} range must satisfy 0 <= lo <= hi, got ({lo}, {hi})")
    return lo, hi


def assemble(task: Task, groups: list[torch.Tensor]) -> Batch:
    """Words grouped by length (each [count, length] symbol ids) -> one right-padded batch,
    rows in the order of the groups."""
    groups = [g for g in groups if g.shape[0] > 0]
    if not groups:
        raise ExactLensError("empty batch: give at least one word")
    encoded = [task.encode(g) for g in groups]
    width = max(e.tokens.shape[1] for e in encoded)
    pad = torch.nn.functional.pad
    tokens = torch.cat([pad(e.tokens, (0, width - e.tokens.shape[1]), value=PAD_ID) for e in encoded])
    n_positions = torch.cat([e.n_positions for e in encoded])
    targets = [task.targets(g) for g in groups]
    if targets[0].ndim == 2:
        longest = max(g.shape[1] for g in groups)
        targets = [pad(t, (0, longest - t.shape[1])) for t in targets]
    lengths = torch.cat([torch.full((g.shape[0],), g.shape[1], dtype=torch.long) for g in groups])
    return Batch(tokens, n_positions, torch.cat(targets), lengths)


def sample_batch(
    task: Task, count: int, lengths: tuple[int, int], generator: torch.Generator, held_out: bool = False
) -> Batch:
    """count fresh words; |w| = lo when lo == hi, else uniform on lo..hi (inclusive), one draw per
    word. ``held_out``: the task's test words (Task.sample_held_out; the same law for generated tasks)."""
    if count < 1:
        raise ExactLensError(f"a batch needs at least one word, got count={count}")
    draw = task.sample_held_out if held_out else task.sample
    lo, hi = lengths
    if lo == hi:
        return assemble(task, [draw(lo, count, generator)])
    drawn = torch.randint(lo, hi + 1, (count,), generator=generator)
    values, counts = torch.unique(drawn, return_counts=True)  # sorted lengths
    return assemble(task, [draw(int(v), int(c), generator) for v, c in zip(values, counts, strict=True)])


def split(batch: Batch, size: int) -> list[Batch]:
    """Consecutive slices of at most size rows (padding trimmed to each slice's longest row)."""
    return [batch.rows(slice(start, start + size)) for start in range(0, len(batch), size)]

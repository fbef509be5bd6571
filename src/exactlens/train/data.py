"""Training data: fresh random words every epoch, tokenized into right-padded batches.

A batch holds words whose lengths are either one fixed |w| or drawn uniformly from an
inclusive range; words of different lengths are right-padded and carry n_positions
(the model masks padded keys and computes positional features from the real n).
Targets are membership bits (float, for a sigmoid readout) for languages and class
indices (long, for a logits readout) for tasks such as MAJORITY.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from exactlens.errors import ExactLensError
from exactlens.languages import Language

PAD_ID = 0  # any valid token id: padded keys are masked and padded queries are never read


@dataclass
class Batch:
    tokens: torch.Tensor  # [batch, pos] long, right-padded
    n_positions: torch.Tensor  # [batch] real positions (|w| + specials)
    targets: torch.Tensor  # [batch]: float 0/1 (membership) or long class index (tasks)
    lengths: torch.Tensor  # [batch] |w|

    def __len__(self) -> int:
        return self.tokens.shape[0]

    @property
    def padded(self) -> bool:
        return bool((self.n_positions != self.tokens.shape[1]).any())


def is_task(language: Language) -> bool:
    """Classification tasks (targets are class indices) rather than languages (bits)."""
    return bool(getattr(language, "is_task", False))


def targets_of(language: Language, symbol_ids: torch.Tensor) -> torch.Tensor:
    if is_task(language):
        return language.targets(symbol_ids).long()
    return language.membership(symbol_ids).float()


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


def assemble(language: Language, groups: list[torch.Tensor]) -> Batch:
    """Words grouped by length (each [count, length] symbol ids) -> one right-padded batch,
    rows in the order of the groups."""
    groups = [g for g in groups if g.shape[0] > 0]
    if not groups:
        raise ExactLensError("empty batch: give at least one word")
    encoded = [language.encode(g) for g in groups]
    width = max(e.tokens.shape[1] for e in encoded)
    if len(encoded) == 1:
        tokens = encoded[0].tokens
    else:
        rows = [torch.nn.functional.pad(e.tokens, (0, width - e.tokens.shape[1]), value=PAD_ID) for e in encoded]
        tokens = torch.cat(rows)
    n_positions = torch.cat([e.n_positions for e in encoded])
    targets = torch.cat([targets_of(language, g) for g in groups])
    lengths = torch.cat([torch.full((g.shape[0],), g.shape[1], dtype=torch.long) for g in groups])
    return Batch(tokens, n_positions, targets, lengths)


def sample_batch(language: Language, count: int, lengths: tuple[int, int], generator: torch.Generator) -> Batch:
    """count fresh words; |w| = lo when lo == hi, else uniform on lo..hi (inclusive), one draw per word."""
    if count < 1:
        raise ExactLensError(f"a batch needs at least one word, got count={count}")
    lo, hi = lengths
    if lo == hi:
        return assemble(language, [language.sample(lo, count, generator)])
    drawn = torch.randint(lo, hi + 1, (count,), generator=generator)
    values, counts = torch.unique(drawn, return_counts=True)  # sorted lengths
    groups = [language.sample(int(v), int(c), generator) for v, c in zip(values, counts, strict=True)]
    return assemble(language, groups)


def split(batch: Batch, size: int) -> list[Batch]:
    """Consecutive slices of at most size rows (padding trimmed to each slice's longest row)."""
    out = []
    for start in range(0, len(batch), size):
        n_pos = batch.n_positions[start : start + size]
        width = int(n_pos.max())
        out.append(
            Batch(
                batch.tokens[start : start + size, :width],
                n_pos,
                batch.targets[start : start + size],
                batch.lengths[start : start + size],
            )
        )
    return out

"""Shin & Matzinger 2025: category pairs of adjacent tokens (a regression task).

Token categories X_1..X_M are i.i.d. uniform over N categories; the target at
position i >= 2 is Y_i = q_true(X_{i-1}, X_i) (§1). Position 1 has no target
and is masked out of every loss. Categories are numbered 0..N-1 here (the paper
counts from 1); positions are numbered from 0, so the first position (index 0)
is the one without a target. The model input is the paper's matrix X: column i
is the one-hot category of X_i concatenated with the one-hot position i
(d_model = N + M), made by a fixed embedding table (exactlens.constructions.
shin_matzinger) from the category tokens; there is no [CLS].

q_true is an N x N matrix with q_true[a, b] = q(a, b):
- "code": the two-digit category-pair code of eq. 2.15, base * (a+1) + (b+1)
  with base = max(10, N+1) (for N <= 9: 11, 12, ..., the paper's A_2);
- "normal": i.i.d. standard normal entries (§4), drawn from a seed.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from exactlens.errors import ExactLensError
from exactlens.resources import check_memory
from exactlens.tasks.base import Task
from exactlens.tasks.variables import CausalVariable

Q_KINDS = ("code", "normal")


# Up-front size checks: q_true is [N, N] float64 and the model's attention matrices are [d, d] with
# d = N + M (several of them, float64 while built): 5 square float64 matrices of the larger side bound both.
SQUARE_MATRICES = 5


def check_categories(categories: int) -> int:
    if not isinstance(categories, int) or isinstance(categories, bool) or categories < 1:
        raise ExactLensError(f"categories (N) must be an integer >= 1, got {categories!r}")
    check_memory(SQUARE_MATRICES * 8.0 * categories**2, f"N={categories} categories ([N, N] matrices, float64)",
                 "use fewer --categories")
    return categories


def check_positions(positions: int) -> int:
    if not isinstance(positions, int) or isinstance(positions, bool) or positions < 2:
        raise ExactLensError(f"positions (M) must be an integer >= 2 (a pair needs two tokens), got {positions!r}")
    check_memory(SQUARE_MATRICES * 8.0 * positions**2, f"M={positions} positions ([M, M] matrices, float64)",
                 "use fewer --positions")
    return positions


def pair_code(categories: int) -> torch.Tensor:
    """Eq. 2.15: q[a, b] = base*(a+1) + (b+1), base = max(10, N+1) (float64 [N, N])."""
    n = check_categories(categories)
    base = max(10, n + 1)
    digits = torch.arange(1, n + 1, dtype=torch.float64)
    return base * digits[:, None] + digits[None, :]


def normal_q(categories: int, seed: int) -> torch.Tensor:
    """§4: q_true with i.i.d. standard normal entries (float64 [N, N]), from a seed."""
    n = check_categories(categories)
    gen = torch.Generator().manual_seed(int(seed))
    return torch.randn(n, n, generator=gen, dtype=torch.float64)


def make_q(kind: str, categories: int, seed: int = 0) -> torch.Tensor:
    if kind == "code":
        return pair_code(categories)
    if kind == "normal":
        return normal_q(categories, seed)
    raise ExactLensError(f"q_true kind {kind!r} is unknown; choose one of {', '.join(Q_KINDS)}")


def check_q(q_true: torch.Tensor, categories: int | None = None) -> torch.Tensor:
    """A finite square float matrix (as float64); its size must match categories if given."""
    if not isinstance(q_true, torch.Tensor) or q_true.ndim != 2 or q_true.shape[0] != q_true.shape[1]:
        shape = tuple(q_true.shape) if isinstance(q_true, torch.Tensor) else type(q_true).__name__
        raise ExactLensError(f"q_true must be a square [N, N] tensor, got {shape}")
    if categories is not None and q_true.shape[0] != categories:
        raise ExactLensError(f"q_true is {tuple(q_true.shape)} but there are N={categories} categories")
    if not q_true.is_floating_point() or not torch.isfinite(q_true).all():
        raise ExactLensError("q_true must hold finite floating-point values")
    return q_true.double()


def pair_targets(categories: torch.Tensor, q_true: torch.Tensor) -> torch.Tensor:
    """Y [batch, M] (float64): Y[:, i] = q_true[X[:, i-1], X[:, i]] for i >= 1, Y[:, 0] = 0."""
    if categories.ndim != 2 or categories.shape[1] < 1:
        raise ExactLensError(f"categories must be [batch, M], got shape {tuple(categories.shape)}")
    q = check_q(q_true)
    y = torch.zeros(categories.shape, dtype=torch.float64)
    y[:, 1:] = q[categories[:, :-1], categories[:, 1:]]
    return y


def target_mask(positions: int) -> torch.Tensor:
    """bool [M]: the positions that have a target (all but the first)."""
    mask = torch.ones(check_positions(positions), dtype=torch.bool)
    mask[0] = False
    return mask


@dataclass
class PairBatch:
    """One batch of the task: categories [batch, M] (also the token ids), targets [batch, M]
    (float64, 0 at the masked first position) and the loss mask [M]."""

    categories: torch.Tensor
    targets: torch.Tensor
    mask: torch.Tensor

    def __len__(self) -> int:
        return self.categories.shape[0]


class PairGenerator:
    """Seeded batches of the task for one q_true: ``PairGenerator(q, M, seed).batch(1000)``."""

    def __init__(self, q_true: torch.Tensor, positions: int, seed: int = 0):
        self.q_true = check_q(q_true)
        self.categories = self.q_true.shape[0]
        self.positions = check_positions(positions)
        self.generator = torch.Generator().manual_seed(int(seed))

    def batch(self, size: int) -> PairBatch:
        if not isinstance(size, int) or isinstance(size, bool) or size < 1:
            raise ExactLensError(f"batch size must be an integer >= 1, got {size!r}")
        x = torch.randint(0, self.categories, (size, self.positions), generator=self.generator)
        return PairBatch(x, pair_targets(x, self.q_true), target_mask(self.positions))


class Pairs(Task):
    """The task: words are sequences of category symbols "0".."N-1" (no [CLS] or [EOS]); the target
    at every position but the first is q_true(X_(i-1), X_i), a real number (kind "regression")."""

    name = "pairs"
    kind = "regression"
    use_cls = False
    use_eos = False
    min_length = 2
    first_target = 1

    def __init__(self, categories: int = 10, q: str = "normal", seed: int = 0):
        self.n_categories = check_categories(categories)
        if q not in Q_KINDS:
            raise ExactLensError(f"q_true kind {q!r} is unknown; choose one of {', '.join(Q_KINDS)}")
        self.q_kind, self.q_seed = q, seed
        self.alphabet = tuple(str(c) for c in range(self.n_categories))
        self.q_true = make_q(q, self.n_categories, seed)

    @property
    def params(self) -> dict:
        return {"categories": self.n_categories, "q": self.q_kind, "seed": self.q_seed}

    def target(self, word) -> list:
        """[None, q(X_1, X_2), q(X_2, X_3), ...] for one word (plain Python)."""
        cats = [int(s) for s in self.symbols_of(word)]
        self.check_length(len(cats))
        return [None] + [float(self.q_true[a, b]) for a, b in zip(cats, cats[1:], strict=False)]

    def targets(self, symbol_ids: torch.Tensor) -> torch.Tensor:
        return pair_targets(symbol_ids, self.q_true)

    def variables(self) -> list[CausalVariable]:
        def previous(ids: torch.Tensor) -> torch.Tensor:
            out = torch.zeros(ids.shape, dtype=torch.long)  # position 0 has no target: its value is unused
            out[:, 1:] = ids[:, :-1]
            return out

        def answer(base: torch.Tensor, prev: torch.Tensor) -> torch.Tensor:
            y = self.q_true[prev.long(), base.long()]
            y[:, 0] = 0.0
            return y

        def pair_value(ids: torch.Tensor) -> torch.Tensor:
            return pair_targets(ids, self.q_true)

        def set_value(base: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
            y = value.to(self.q_true.dtype).clone()
            y[:, 0] = 0.0
            return y

        return [
            CausalVariable("previous category", "position", previous, answer, "X_(i-1) at position i"),
            CausalVariable("pair value", "position", pair_value, set_value,
                           "q_true(X_(i-1), X_i) at position i: the pair logic's result"),
        ]

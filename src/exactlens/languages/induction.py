"""Induction-head tasks (Transformer Cookbook §9.1; Elhage et al. 2021).

A word w_1 ... w_L (L >= 1) over the letters a, b, c, ... (num_symbols of them,
default 3). The target is one symbol, predicted at the last position L; let
x = w_L and let J = {j < L : w_j = x} be the earlier occurrences of x.

- induction-recent (§9.1.1): w_{j+1} for the largest j in J (the symbol that
  followed the most recent earlier occurrence); x itself when J is empty.
- induction-frequent (§9.1.2): the symbol y that most often follows x, i.e.
  maximizing c(y) = |{j in J : w_{j+1} = y}|; ties go to the alphabetically first
  y, as the cookbook suggests. When J is empty every count is 0 and the rule gives
  the first letter, "a" (this is what the cookbook's comparison step returns).

The model reads out one logit per symbol at the last position (class = symbol id).
"""

from __future__ import annotations

import string
from collections.abc import Sequence

import torch

from exactlens.errors import ExactLensError
from exactlens.languages.base import Language, check_length

MAX_SYMBOLS = 26


class _Induction(Language):
    use_cls = True
    use_eos = False
    is_task = True

    def __init__(self, num_symbols: int = 3):
        if not isinstance(num_symbols, int) or isinstance(num_symbols, bool) or not 2 <= num_symbols <= MAX_SYMBOLS:
            raise ExactLensError(
                f"{self.name}: num_symbols must be an integer in [2, {MAX_SYMBOLS}], got {num_symbols!r}"
            )
        self.num_symbols = num_symbols
        self.alphabet = tuple(string.ascii_lowercase[:num_symbols])

    @property
    def classes(self) -> tuple[str, ...]:
        return self.alphabet

    def contains(self, word: str | Sequence[str]) -> bool:
        raise ExactLensError(f"{self.name} is a prediction task: use target(word) / targets(ids), not membership")

    def membership(self, symbol_ids: torch.Tensor) -> torch.Tensor:
        raise ExactLensError(f"{self.name} is a prediction task: use target(word) / targets(ids), not membership")

    def target(self, word: str | Sequence[str]) -> int:
        symbols = [self.alphabet.index(s) for s in self.symbols_of(word)]
        if not symbols:
            raise ExactLensError(f"{self.name}: the empty word has no last symbol (length must be >= 1)")
        x = symbols[-1]
        followers = [symbols[j + 1] for j in range(len(symbols) - 1) if symbols[j] == x]
        return self._choose(x, followers)

    def _choose(self, x: int, followers: list[int]) -> int:
        raise NotImplementedError

    def targets(self, symbol_ids: torch.Tensor) -> torch.Tensor:
        if symbol_ids.ndim != 2 or symbol_ids.shape[1] == 0:
            raise ExactLensError(
                f"{self.name}: words must be [batch, length >= 1], got shape {tuple(symbol_ids.shape)}"
            )
        ids = symbol_ids.long()
        x = ids[:, -1:]
        is_earlier = ids[:, :-1] == x  # [batch, L-1]: w_j = x for j < L
        follower = ids[:, 1:]  # w_{j+1}
        return self._choose_batch(ids[:, -1], is_earlier, follower)

    def _choose_batch(self, x: torch.Tensor, is_earlier: torch.Tensor, follower: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def sample(self, length: int, count: int, generator: torch.Generator) -> torch.Tensor:
        check_length(length, self.name, min_length=1)
        return super().sample(length, count, generator)

    def all_words(self, length: int) -> torch.Tensor:
        check_length(length, self.name, min_length=1)
        return super().all_words(length)


class InductionRecent(_Induction):
    name = "induction-recent"

    def _choose(self, x: int, followers: list[int]) -> int:
        return followers[-1] if followers else x

    def _choose_batch(self, x, is_earlier, follower):
        positions = torch.arange(is_earlier.shape[1]).expand_as(is_earlier)
        last = torch.where(is_earlier, positions, -1).max(dim=1).values if is_earlier.shape[1] else x * 0 - 1
        found = last >= 0
        picked = follower.gather(1, last.clamp(min=0).unsqueeze(1)).squeeze(1) if is_earlier.shape[1] else x
        return torch.where(found, picked, x)

    def hard_words(self, length: int) -> torch.Tensor:
        """The current symbol x = a occurs often with different followers, the most
        recent occurrence far from the end or right before it; plus no earlier
        occurrence at all (answer: x itself)."""
        check_length(length, self.name, min_length=1)
        k = self.num_symbols
        rows = [[(p % (k - 1)) + 1 for p in range(length - 1)] + [0]]  # a occurs only at the end
        if length >= 3:
            rows.append([0, k - 1] + [(p % (k - 1)) + 1 for p in range(length - 3)] + [0])  # a far back
            # a b a c a b a c ... a: every follower of a differs from the previous one
            rows.append([0 if p % 2 == 0 else 1 + (p // 2) % (k - 1) for p in range(length - 1)] + [0])
            rows.append([1] * (length - 2) + [0, 0])  # most recent occurrence right before: a a
        return torch.tensor(rows, dtype=torch.long)


class InductionFrequent(_Induction):
    name = "induction-frequent"

    def _choose(self, x: int, followers: list[int]) -> int:
        counts = [followers.count(y) for y in range(self.num_symbols)]
        return counts.index(max(counts))  # first (alphabetically smallest) maximum

    def _choose_batch(self, x, is_earlier, follower):
        hits = torch.nn.functional.one_hot(follower, self.num_symbols) * is_earlier.unsqueeze(-1)
        counts = hits.sum(dim=1)  # [batch, symbols]
        is_top = counts == counts.max(dim=1, keepdim=True).values
        index = torch.arange(self.num_symbols).expand_as(counts)
        return torch.where(is_top, index, self.num_symbols).min(dim=1).values

    def hard_words(self, length: int) -> torch.Tensor:
        """Near-ties: x = a is followed by the LAST letter m + 1 times and by b m times
        (the winner loses any tie), and exact ties between b and the last letter
        (the alphabetical rule decides)."""
        check_length(length, self.name, min_length=1)
        last = self.num_symbols - 1
        rows = [[last] * (length - 1) + [0]]
        pairs = (length - 1) // 2
        if pairs >= 2:
            body = [[0, last] if p % 2 == 0 else [0, 1] for p in range(pairs)]
            flat = [s for pair in body for s in pair]
            rows.append(flat + [0] * (length - len(flat)))  # ends in a; ties or near-ties
            swapped = [s for pair in body[::-1] for s in pair]
            rows.append(swapped + [0] * (length - len(swapped)))
            rows.append([0, last] + [0, 1] * (pairs - 1) + [0] * (length - 2 * pairs))
        return torch.tensor(rows, dtype=torch.long)

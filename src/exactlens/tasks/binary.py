"""Membership tasks over {0, 1}: PARITY, FIRST (Chiang & Cholak 2022, §1) and ONE (Nowak et al. 2022, §1).

PARITY = {w : w has an odd number of 1s};  FIRST = {w : w_1 = 1};  ONE = {w : w has exactly one 1}.
PARITY and FIRST draw uniform random bits (the papers' sampler); ONE draws its number of ones
from a Poisson law (Nowak et al. App. B.2), since uniform bits almost never hit the language.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from exactlens.tasks.base import Task, check_count, check_length
from exactlens.tasks.variables import CausalVariable

ONE_POISSON_RATE = 1.5  # Nowak et al. App. B.2


def ones(ids: torch.Tensor) -> torch.Tensor:
    """Number of 1s per word [B]."""
    return ids.long().sum(dim=1)


class Parity(Task):
    name = "parity"
    alphabet = ("0", "1")

    def contains(self, word: str | Sequence[str]) -> bool:
        ones = 0
        for symbol in self.symbols_of(word):
            if symbol == "1":
                ones += 1
        return ones % 2 == 1

    def membership(self, symbol_ids: torch.Tensor) -> torch.Tensor:
        return symbol_ids.sum(dim=1) % 2 == 1

    def variables(self) -> list[CausalVariable]:
        return [
            CausalVariable("ones", "word", ones, lambda base, k: k % 2 == 1, "k, the number of 1s"),
            CausalVariable("parity", "word", lambda ids: ones(ids) % 2, lambda base, p: p == 1, "k mod 2"),
        ]

    def hard_words(self, length: int) -> torch.Tensor:
        """Words 1^k 0^(L-k) for k = 0..3, L-3..L and 25 counts spread in between.

        The construction's decision hinges on the value computed at position k
        (and rounding grows with the number of positions before k), so what
        matters is the count k, not where the ones are.
        """
        check_length(length, self.name, min_length=0)
        counts = set(range(min(4, length + 1))) | set(range(max(0, length - 3), length + 1))
        counts |= {round(length * j / 26) for j in range(1, 26)}
        k = torch.tensor(sorted(counts)).unsqueeze(1)
        return (torch.arange(length).unsqueeze(0) < k).long()


class First(Task):
    name = "first"
    alphabet = ("0", "1")

    def contains(self, word: str | Sequence[str]) -> bool:
        symbols = self.symbols_of(word)
        return len(symbols) > 0 and symbols[0] == "1"

    def membership(self, symbol_ids: torch.Tensor) -> torch.Tensor:
        return (first_symbol(symbol_ids) == 1) & (symbol_ids.shape[1] > 0)

    def variables(self) -> list[CausalVariable]:
        return [CausalVariable("first symbol", "word", first_symbol, lambda base, w1: w1 == 1, "w_1 (0 or 1)")]

    def hard_words(self, length: int) -> torch.Tensor:
        """1 0^(L-1) and 0 1^(L-1): w_1 disagrees with every other symbol, the
        worst case for models whose non-first positions leak (§5.2), plus 1^L, 0^L."""
        check_length(length, self.name, min_length=0)
        if length == 0:
            return torch.zeros(0, 0, dtype=torch.long)
        rest = length - 1
        rows = [[1] + [0] * rest, [0] + [1] * rest, [1] * length, [0] * length]
        return torch.tensor(rows, dtype=torch.long)


def first_symbol(ids: torch.Tensor) -> torch.Tensor:
    """w_1 per word [B] (0 for the empty word, which is not in FIRST)."""
    if ids.shape[1] == 0:
        return torch.zeros(ids.shape[0], dtype=torch.long)
    return ids[:, 0].long()


class One(Task):
    name = "one"
    alphabet = ("0", "1")

    def contains(self, word: str | Sequence[str]) -> bool:
        count = 0
        for symbol in self.symbols_of(word):
            if symbol == "1":
                count += 1
        return count == 1

    def membership(self, symbol_ids: torch.Tensor) -> torch.Tensor:
        return symbol_ids.sum(dim=1) == 1

    def variables(self) -> list[CausalVariable]:
        return [CausalVariable("ones", "word", ones, lambda base, k: k == 1, "k, the number of 1s")]

    def sample(self, length: int, count: int, generator: torch.Generator) -> torch.Tensor:
        """Poisson(1.5) ones at uniform positions (App. B.2).

        A Poisson draw above |w| cannot be placed; such draws are redrawn, i.e.
        the number of ones follows Poisson(1.5) conditioned on k <= |w|.
        """
        self.check_length(length)
        check_count(count, self.name)
        if count == 0:
            return torch.zeros(0, length, dtype=torch.long)
        rate = torch.full((count,), ONE_POISSON_RATE, dtype=torch.float64)
        drawn = torch.poisson(rate, generator=generator).long()
        while bool((drawn > length).any()):
            redraw = drawn > length
            drawn[redraw] = torch.poisson(rate[redraw], generator=generator).long()
        # k ones at uniform positions: the k smallest of `length` uniform keys.
        keys = torch.rand(count, length, generator=generator)
        rank = keys.argsort(dim=1).argsort(dim=1)
        return (rank < drawn.unsqueeze(1)).long()

    def hard_words(self, length: int) -> torch.Tensor:
        """Counts k = 0, 1, 2 (the decision boundary of I[k = 1]) with the ones at
        the start, the end and spread out, plus 1^L."""
        check_length(length, self.name, min_length=0)
        rows = [[0] * length]
        if length >= 1:
            rows += [[1] + [0] * (length - 1), [0] * (length - 1) + [1], [1] * length]
        if length >= 2:
            rows += [[1, 1] + [0] * (length - 2), [1] + [0] * (length - 2) + [1]]
        return torch.tensor(rows, dtype=torch.long).reshape(len(rows), length)

"""PARITY and FIRST over {0, 1} (Chiang & Cholak 2022, §1).

PARITY = {w : w has an odd number of 1s};  FIRST = {w : w_1 = 1}.
The sampler is the papers' one: uniform random bits.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from exactlens.languages.base import Language, check_length


class Parity(Language):
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


class First(Language):
    name = "first"
    alphabet = ("0", "1")

    def contains(self, word: str | Sequence[str]) -> bool:
        symbols = self.symbols_of(word)
        return len(symbols) > 0 and symbols[0] == "1"

    def membership(self, symbol_ids: torch.Tensor) -> torch.Tensor:
        if symbol_ids.shape[1] == 0:
            return torch.zeros(symbol_ids.shape[0], dtype=torch.bool)
        return symbol_ids[:, 0] == 1

    def hard_words(self, length: int) -> torch.Tensor:
        """1 0^(L-1) and 0 1^(L-1): w_1 disagrees with every other symbol, the
        worst case for models whose non-first positions leak (§5.2), plus 1^L, 0^L."""
        check_length(length, self.name, min_length=0)
        if length == 0:
            return torch.zeros(0, 0, dtype=torch.long)
        rest = length - 1
        rows = [[1] + [0] * rest, [0] + [1] * rest, [1] * length, [0] * length]
        return torch.tensor(rows, dtype=torch.long)

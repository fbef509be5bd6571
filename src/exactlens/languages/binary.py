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
        """Words with k = 0, 1, 2, ..., length ones (every count once): the
        construction's value at position k decides, so every k is exercised,
        with the ones both packed left and packed right."""
        check_length(length, self.name, min_length=0)
        k = torch.arange(length + 1).unsqueeze(1)
        i = torch.arange(length).unsqueeze(0)
        left = (i < k).long()
        right = (i >= length - k).long()
        return torch.cat([left, right])


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

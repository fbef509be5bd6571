"""Induction-head tasks (Transformer Cookbook §9.1; Elhage et al. 2021), one prediction per position.

A word w_1 ... w_L (L >= 1) over the letters a, b, c, ... (num_symbols of them, default 3).
At every position i the target is one symbol, computed from the prefix w_1 ... w_i: let
x = w_i and J = {j < i : w_j = x} the earlier occurrences of x.

- induction-recent (§9.1.1): w_{j+1} for the largest j in J (the symbol that followed the
  most recent earlier occurrence); x itself when J is empty.
- induction-frequent (§9.1.2): the symbol y that most often follows x, i.e. maximizing
  c(y) = |{j in J : w_{j+1} = y}|; ties go to the alphabetically first y, as the cookbook
  suggests. When J is empty every count is 0 and the rule gives the first letter, "a"
  (what the cookbook's comparison step returns).

The cookbook states the task at the last position; its constructions are causal, so they
answer it for every prefix at once, and the task asks for all of them (kind "prediction",
one logit per symbol at every position; class = symbol id).

Causal variable: "previous symbol" at position i (w_{i-1}; none at the first position), the
one fact the first layer of an induction circuit moves. Setting it changes the answer as the
rule above computed from the set previous symbols (keys) and the word's own symbols (queries,
copied values).
"""

from __future__ import annotations

import string
from collections.abc import Sequence

import torch

from exactlens.errors import ExactLensError
from exactlens.tasks.base import Task, check_int, check_length
from exactlens.tasks.variables import CausalVariable

MAX_SYMBOLS = 26


class _Induction(Task):
    kind = "prediction"
    use_cls = True
    use_eos = False
    min_length = 1

    def __init__(self, num_symbols: int = 3):
        self.num_symbols = check_int(num_symbols, f"{self.name}: num_symbols", 2, MAX_SYMBOLS)
        self.alphabet = tuple(string.ascii_lowercase[:num_symbols])

    @property
    def params(self) -> dict:
        return {"num_symbols": self.num_symbols}

    def target(self, word: str | Sequence[str]) -> list[int]:
        """The answer at every position of one word (plain Python)."""
        symbols = [self.alphabet.index(s) for s in self.symbols_of(word)]
        if not symbols:
            raise ExactLensError(f"{self.name}: the empty word has no symbol to predict at (length must be >= 1)")
        answers = []
        for i, x in enumerate(symbols):
            followers = [symbols[j + 1] for j in range(i) if symbols[j] == x]
            answers.append(self._choose(x, followers))
        return answers

    def _choose(self, x: int, followers: list[int]) -> int:
        raise NotImplementedError

    def targets(self, symbol_ids: torch.Tensor) -> torch.Tensor:
        """[B, L]: the answer at every position."""
        return self._answers(symbol_ids, previous_symbols(symbol_ids, self.num_symbols))

    def _answers(self, symbol_ids: torch.Tensor, previous: torch.Tensor) -> torch.Tensor:
        """Answers when the symbol before position j is previous[:, j] (num_symbols = none): a match is
        a key j <= i whose previous symbol is w_i, and it proposes w_j."""
        if symbol_ids.ndim != 2 or symbol_ids.shape[1] == 0:
            raise ExactLensError(
                f"{self.name}: words must be [batch, length >= 1], got shape {tuple(symbol_ids.shape)}"
            )
        ids = symbol_ids.long()
        length = ids.shape[1]
        causal = torch.ones(length, length, dtype=torch.bool).tril()  # [query i, key j]: j <= i
        match = (previous.long()[:, None, :] == ids[:, :, None]) & causal  # [B, i, j]
        return self._choose_batch(ids, match)

    def _choose_batch(self, ids: torch.Tensor, match: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def variables(self) -> list[CausalVariable]:
        return [
            CausalVariable(
                "previous symbol",
                "position",
                lambda ids: previous_symbols(ids, self.num_symbols),
                self._answers,
                f"w_(i-1) at position i ({self.num_symbols} = none, at the first position)",
            )
        ]


def previous_symbols(ids: torch.Tensor, none: int) -> torch.Tensor:
    """w_(i-1) at every position i, [B, L]; ``none`` at the first position."""
    out = torch.full(ids.shape, none, dtype=torch.long)
    out[:, 1:] = ids[:, :-1].long()
    return out


class InductionRecent(_Induction):
    name = "induction-recent"

    def _choose(self, x: int, followers: list[int]) -> int:
        return followers[-1] if followers else x

    def _choose_batch(self, ids, match):
        keys = torch.arange(ids.shape[1]).expand_as(match)
        last = torch.where(match, keys, -1).max(dim=2).values  # most recent matching key, [B, i]
        picked = ids.gather(1, last.clamp(min=0))
        return torch.where(last >= 0, picked, ids)

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

    def _choose_batch(self, ids, match):
        proposals = torch.nn.functional.one_hot(ids, self.num_symbols)  # key j proposes w_j, [B, j, y]
        counts = match.to(torch.long) @ proposals  # [B, i, y]
        is_top = counts == counts.max(dim=2, keepdim=True).values
        index = torch.arange(self.num_symbols).expand_as(counts)
        return torch.where(is_top, index, self.num_symbols).min(dim=2).values

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

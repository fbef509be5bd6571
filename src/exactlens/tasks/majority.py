"""MAJORITY (Brody, Alon & Yahav 2023, §4.1 and App. E.1): the most frequent class.

A word is a sequence t_1 ... t_L of tokens from k classes C_1 ... C_k (default
k = 20, Brody et al. train on L = 50). The target is the class that occurs most
often. This is a classification task, not a language: the model reads out k
logits at [CLS] (position 0) and predicts their argmax.

Ties (two or more classes share the top count) are not covered by the paper. We
define the target of a tied word as the tied class with the smallest index (the
first in alphabet order), and the sampler avoids ties by default (it rejects
tied words and draws again), so training and random checks see a unique
majority. Exhaustive checks enumerate every word, ties included.

Symbols are the letters a, b, c, ... (one character each, so words are plain
strings: "aabbbcc" -> class b, as in the paper's example).

``per_position=True`` is the paper's own framing (§4.1: "for a, a, b, b, b, c, c the model is
trained to predict the output b, b, b, b, b, b"): a prediction task whose target at every symbol
position is the whole word's majority class (an encoder sees the whole word at every position).
"""

from __future__ import annotations

import string
from collections.abc import Sequence

import torch

from exactlens.errors import ExactLensError
from exactlens.tasks.base import Task, check_count, check_int, check_length
from exactlens.tasks.variables import CausalVariable

MAX_CLASSES = 26  # one letter per class
SAMPLE_ROUNDS = 10_000  # rejection rounds before the sampler gives up


class Majority(Task):
    name = "majority"
    kind = "classification"
    use_cls = True
    use_eos = False
    min_length = 1

    def __init__(self, num_classes: int = 20, allow_ties: bool = False, per_position: bool = False):
        self.num_classes = check_int(num_classes, "majority: num_classes", 2, MAX_CLASSES)
        for name, value in (("allow_ties", allow_ties), ("per_position", per_position)):
            if not isinstance(value, bool):
                raise ExactLensError(f"majority: {name} must be true or false, got {value!r}")
        self.allow_ties = allow_ties
        self.per_position = per_position
        self.kind = "prediction" if per_position else "classification"
        self.alphabet = tuple(string.ascii_lowercase[:num_classes])

    @property
    def params(self) -> dict:
        params = {"num_classes": self.num_classes, "allow_ties": self.allow_ties}
        if self.per_position:  # absent when False: configs saved before the option read the same
            params["per_position"] = True
        return params

    def variables(self) -> list[CausalVariable]:
        return [CausalVariable("counts", "word", self.counts, self._from_counts, "occurrences of each class, [B, k]")]

    def _from_counts(self, ids: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        answer = _first_top(ids, counts)
        return answer[:, None].expand(ids.shape).clone() if self.per_position else answer

    # ---- targets ---------------------------------------------------------------

    def target(self, word: str | Sequence[str]) -> int | list[int]:
        """Index of the most frequent class of one word (ties -> smallest index); per_position: that
        index at every symbol position."""
        answer = self._majority(word)
        return [answer] * len(self.symbols_of(word)) if self.per_position else answer

    def _majority(self, word: str | Sequence[str]) -> int:
        symbols = self.symbols_of(word)
        if not symbols:
            raise ExactLensError("majority: the empty word has no majority class (length must be >= 1)")
        counts = {symbol: 0 for symbol in self.alphabet}
        for symbol in symbols:
            counts[symbol] += 1
        best = max(counts.values())
        for index, symbol in enumerate(self.alphabet):  # first class with the top count
            if counts[symbol] == best:
                return index
        raise AssertionError("unreachable")

    def counts(self, symbol_ids: torch.Tensor) -> torch.Tensor:
        """Class counts [batch, num_classes] of words ids [batch, length]."""
        ids = symbol_ids.long()  # scatter_add: the same integers as one_hot(...).sum(1), 30x faster at [6000, 50]
        return torch.zeros(ids.shape[0], self.num_classes, dtype=torch.long, device=ids.device).scatter_add_(
            1, ids, torch.ones_like(ids))

    def targets(self, symbol_ids: torch.Tensor) -> torch.Tensor:
        """Vectorized target: class index [batch] (ties -> smallest tied index); per_position: [batch, L]."""
        if symbol_ids.ndim != 2 or symbol_ids.shape[1] == 0:
            raise ExactLensError(f"majority: words must be [batch, length >= 1], got shape {tuple(symbol_ids.shape)}")
        answer = _first_top(symbol_ids, self.counts(symbol_ids))
        return answer[:, None].expand(symbol_ids.shape).clone() if self.per_position else answer

    def is_tied(self, symbol_ids: torch.Tensor) -> torch.Tensor:
        """True where two or more classes share the top count."""
        counts = self.counts(symbol_ids)
        return (counts == counts.max(dim=1, keepdim=True).values).sum(dim=1) > 1

    # ---- sampling --------------------------------------------------------------

    def sample(self, length: int, count: int, generator: torch.Generator) -> torch.Tensor:
        """Uniform random words; tied words are rejected and redrawn unless allow_ties."""
        self.check_length(length)
        check_count(count, self.name)
        words = torch.randint(0, self.num_classes, (count, length), generator=generator)
        if self.allow_ties or count == 0:
            return words
        for _ in range(SAMPLE_ROUNDS):
            tied = self.is_tied(words)
            if not tied.any():
                return words
            words[tied] = torch.randint(0, self.num_classes, (int(tied.sum()), length), generator=generator)
        raise ExactLensError(f"majority: could not draw {count} untied words of length {length}")

    def hard_words(self, length: int) -> torch.Tensor:
        """Near-ties whose winner is the LAST class: it leads the runner-up (class 0,
        which wins any tie) by exactly one, in three orders (winner first, last,
        interleaved); plus 'every class c times, the last class c + 1 times' where
        it fits, and the all-last-class word. These are the words whose top two
        logits are closest."""
        check_length(length, self.name, min_length=1)
        k, last = self.num_classes, self.num_classes - 1
        rows: list[list[int]] = [[last] * length]
        runner = (length - 1) // 2  # count of class 0; the last class gets runner + 1
        if runner >= 1:
            filler = [1] * (length - 2 * runner - 1)  # 0 or 1 symbol of class 1 (count 1 <= runner)
            winner, second = [last] * (runner + 1), [0] * runner
            rows.append(winner + second + filler)
            rows.append(second + filler + winner)
            rows.append([s for pair in zip(second, winner, strict=False) for s in pair] + [last] + filler)
        if length >= 2:
            # classes 0..r-1 occur p + 1 times, the others p times, the last class p + 2 times
            p, r = divmod(length - 2, k)
            spread = [c for c in range(k - 1) for _ in range(p + (c < r))] + [last] * (p + 2)
            rows.append(spread)
        return torch.tensor(rows, dtype=torch.long)


def _first_top(ids: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """The class with the largest count, the smallest index among ties, [B]."""
    is_top = counts == counts.max(dim=1, keepdim=True).values
    index = torch.arange(counts.shape[1]).expand_as(counts)
    return torch.where(is_top, index, counts.shape[1]).min(dim=1).values

"""ONE and PALINDROME over {0, 1} (Nowak et al. 2022, §1 and Appendix B).

ONE = {w : w contains exactly one 1};  PALINDROME = {w : w = reverse(w)}.

Uniform random bits almost never hit either language, so the samplers are the
paper's (Appendix B): ONE draws the number of ones from Poisson(1.5) and puts
them at uniformly random positions; PALINDROME draws a uniform half, mirrors it
(with a random middle symbol for odd |w|) and, for the negatives, flips one
symbol that is not the middle one.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from exactlens.errors import ExactLensError
from exactlens.languages.base import Language, check_length

ONE_POISSON_RATE = 1.5  # Appendix B.2


def _check_count(count: int, what: str) -> None:
    if not isinstance(count, int) or isinstance(count, bool) or count < 1:
        raise ExactLensError(f"{what}: count must be a positive integer, got {count!r}")


class One(Language):
    name = "one"
    alphabet = ("0", "1")

    def contains(self, word: str | Sequence[str]) -> bool:
        ones = 0
        for symbol in self.symbols_of(word):
            if symbol == "1":
                ones += 1
        return ones == 1

    def membership(self, symbol_ids: torch.Tensor) -> torch.Tensor:
        return symbol_ids.sum(dim=1) == 1

    def sample(self, length: int, count: int, generator: torch.Generator) -> torch.Tensor:
        """Poisson(1.5) ones at uniform positions (App. B.2).

        A Poisson draw above |w| cannot be placed; such draws are redrawn, i.e.
        the number of ones follows Poisson(1.5) conditioned on k <= |w|.
        """
        check_length(length, self.name, min_length=0)
        _check_count(count, self.name)
        rate = torch.full((count,), ONE_POISSON_RATE, dtype=torch.float64)
        ones = torch.poisson(rate, generator=generator).long()
        while bool((ones > length).any()):
            redraw = ones > length
            ones[redraw] = torch.poisson(rate[redraw], generator=generator).long()
        # k ones at uniform positions: the k smallest of `length` uniform keys.
        keys = torch.rand(count, length, generator=generator)
        rank = keys.argsort(dim=1).argsort(dim=1)
        return (rank < ones.unsqueeze(1)).long()

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


class Palindrome(Language):
    name = "palindrome"
    alphabet = ("0", "1")
    use_eos = True  # §3.2.1: the construction needs the sequence symmetric, CLS ... EOS

    def contains(self, word: str | Sequence[str]) -> bool:
        symbols = self.symbols_of(word)
        left, right = 0, len(symbols) - 1
        while left < right:
            if symbols[left] != symbols[right]:
                return False
            left += 1
            right -= 1
        return True

    def membership(self, symbol_ids: torch.Tensor) -> torch.Tensor:
        return (symbol_ids == symbol_ids.flip(1)).all(dim=1)

    def palindromes(self, length: int, count: int, generator: torch.Generator) -> torch.Tensor:
        """Uniform palindromes: a random half, a random middle for odd |w|, the mirror (App. B.3)."""
        check_length(length, self.name, min_length=0)
        _check_count(count, self.name)
        half = torch.randint(0, 2, (count, length // 2), generator=generator)
        middle = torch.randint(0, 2, (count, length % 2), generator=generator)
        return torch.cat([half, middle, half.flip(1)], dim=1)

    def one_flip_negatives(self, length: int, count: int, generator: torch.Generator) -> torch.Tensor:
        """Palindromes with one symbol flipped, uniformly among the non-middle positions (App. B.3)."""
        if length < 2:
            raise ExactLensError(f"{self.name}: every word of length {length} is a palindrome; no negatives")
        words = self.palindromes(length, count, generator)
        flippable = torch.tensor([i for i in range(length) if 2 * i != length - 1])
        where = flippable[torch.randint(0, len(flippable), (count,), generator=generator)]
        words[torch.arange(count), where] ^= 1
        return words

    def sample(self, length: int, count: int, generator: torch.Generator) -> torch.Tensor:
        """Each word is a palindrome or a one-flip negative with probability 1/2
        (the paper does not state the mix; lengths 0 and 1 have only palindromes)."""
        check_length(length, self.name, min_length=0)
        _check_count(count, self.name)
        words = self.palindromes(length, count, generator)
        if length < 2:
            return words
        negative = torch.rand(count, generator=generator) < 0.5
        flipped = self.one_flip_negatives(length, count, generator)
        return torch.where(negative.unsqueeze(1), flipped, words)

    def hard_words(self, length: int) -> torch.Tensor:
        """The cases rounding breaks first in Nowak et al.'s construction.

        A mismatch at the pair (j, L+1-j) (positions counted with [CLS] at 0) moves
        its logit by 2^j / (2^n - 1) (App. A), so flips of the outermost symbols
        (j = 1, 2) carry the smallest signal, while the rounding error grows with
        the mass of ones (the largest terms of the softmax sums) and with how the
        terms happen to round: flips at both ends of 1^L, 0^L, the alternating
        palindrome, 1 0^(L-2) 1 and 16 random palindromes (seeded by L, so the
        list is fixed), together with the unflipped palindromes themselves
        (false rejections).
        """
        check_length(length, self.name, min_length=0)
        bases = [[1] * length, [0] * length, [min(i, length - 1 - i) % 2 for i in range(length)]]
        if length >= 2:
            bases.append([1] + [0] * (length - 2) + [1])
        bases += self.palindromes(length, 16, torch.Generator().manual_seed(length)).tolist()
        rows = []
        for base in bases:
            rows.append(list(base))
            for position in sorted({0, 1, length - 2, length - 1}):
                if 0 <= position < length and 2 * position != length - 1:
                    flipped = list(base)
                    flipped[position] ^= 1
                    rows.append(flipped)
        words = torch.tensor(rows, dtype=torch.long).reshape(len(rows), length)
        return torch.unique(words, dim=0) if length else words

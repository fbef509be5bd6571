"""PALINDROME over {0, 1} (Nowak et al. 2022, §1 and Appendix B): {w : w = reverse(w)}.

Uniform random bits almost never give a palindrome, so the sampler is the paper's
(Appendix B.3): a uniform half, mirrored (with a random middle symbol for odd |w|), and
for the negatives one flipped symbol that is not the middle one.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from exactlens.errors import ExactLensError
from exactlens.tasks.base import Task, check_count, check_length
from exactlens.tasks.variables import CausalVariable


def mirror(ids: torch.Tensor) -> torch.Tensor:
    """The mirrored symbol w_(L+1-i) at every position i [B, L]."""
    return ids.long().flip(1)


def mismatches(ids: torch.Tensor) -> torch.Tensor:
    """Number of mismatched pairs (i, L+1-i), i < L+1-i, per word [B]."""
    half = ids.shape[1] // 2
    return (ids[:, :half] != ids.flip(1)[:, :half]).long().sum(dim=1)


class Palindrome(Task):
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

    def variables(self) -> list[CausalVariable]:
        return [
            CausalVariable("mismatches", "word", mismatches, lambda base, m: m == 0, "mismatched pairs (i, L+1-i)"),
            CausalVariable(
                "mirror symbol",
                "position",
                mirror,
                lambda base, mirrored: (base.long() == mirrored).all(dim=1),
                "w_(L+1-i) at position i: a palindrome iff it equals w_i everywhere",
            ),
        ]

    def palindromes(self, length: int, count: int, generator: torch.Generator) -> torch.Tensor:
        """Uniform palindromes: a random half, a random middle for odd |w|, the mirror (App. B.3)."""
        check_length(length, self.name, min_length=0)
        check_count(count, self.name)
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
        check_count(count, self.name)
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

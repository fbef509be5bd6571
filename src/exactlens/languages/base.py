"""Formal languages: alphabet, membership, sampler, tokenizer.

A word w is a Python string of one-character symbols ("0110") or a sequence of
symbol strings. ``length`` always means |w|, the number of symbols of w; the
tokenizer adds the special tokens ([CLS] first, [EOS] last where the language
uses them), so a word of length L becomes L + (number of specials) positions.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch

from exactlens.errors import ExactLensError

CLS = "[CLS]"
EOS = "[EOS]"


@dataclass
class TokenBatch:
    """Right-padded token ids [batch, pos] with the real positions of each row."""

    tokens: torch.Tensor
    n_positions: torch.Tensor

    def __len__(self) -> int:
        return self.tokens.shape[0]


class Language:
    """Base class. Subclasses set name, alphabet, and implement ``contains``,
    ``membership`` (vectorized) and optionally ``sample`` / ``hard_strings``."""

    name: str = ""
    alphabet: tuple[str, ...] = ()
    use_cls: bool = True
    use_eos: bool = False

    # ---- vocabulary ------------------------------------------------------------

    @property
    def vocab(self) -> tuple[str, ...]:
        """Token names by id: the alphabet, then [CLS], then [EOS] if used."""
        return self.alphabet + ((CLS,) if self.use_cls else ()) + ((EOS,) if self.use_eos else ())

    @property
    def n_specials(self) -> int:
        return int(self.use_cls) + int(self.use_eos)

    def token_id(self, name: str) -> int:
        return self.vocab.index(name)

    def symbols_of(self, word: str | Sequence[str]) -> list[str]:
        try:
            symbols = list(word)
        except TypeError:
            raise ExactLensError(
                f"{self.name}: a word is a string or a sequence of symbols, got {type(word).__name__}"
            ) from None
        bad: list = []  # in order of appearance: symbols may be unhashable or not mutually comparable
        for s in symbols:
            if s not in self.alphabet and s not in bad:
                bad.append(s)
        if bad:
            raise ExactLensError(
                f"{self.name}: symbols {bad} are not in the alphabet {list(self.alphabet)} "
                f"(special tokens are added by the tokenizer, not by the caller)"
            )
        return symbols

    def to_ids(self, words: Iterable[str | Sequence[str]]) -> list[list[int]]:
        return [[self.alphabet.index(s) for s in self.symbols_of(w)] for w in words]

    # ---- membership ------------------------------------------------------------

    def contains(self, word: str | Sequence[str]) -> bool:
        """Exact membership of one word, written independently of any model."""
        raise NotImplementedError

    def membership(self, symbol_ids: torch.Tensor) -> torch.Tensor:
        """Vectorized membership of words of equal length, ids [batch, length] -> bool [batch]."""
        raise NotImplementedError

    def targets(self, symbol_ids: torch.Tensor) -> torch.Tensor:
        """What a model must output for each word: membership bits here; tasks
        (majority, induction, ...) override with class indices or per-position targets."""
        return self.membership(symbol_ids)

    # ---- sampling --------------------------------------------------------------

    def sample(self, length: int, count: int, generator: torch.Generator) -> torch.Tensor:
        """count words of the given length as symbol ids [count, length]."""
        check_length(length, self.name, min_length=0)
        return torch.randint(0, len(self.alphabet), (count, length), generator=generator)

    def all_words(self, length: int) -> torch.Tensor:
        """Every word of the given length, ids [|alphabet|^length, length]."""
        check_length(length, self.name, min_length=0)
        k = len(self.alphabet)
        if k**length > 2**22:
            raise ExactLensError(f"{k}^{length} words are too many to enumerate (limit 2^22)")
        index = torch.arange(k**length).unsqueeze(1)
        powers = k ** torch.arange(length - 1, -1, -1)
        return (index // powers) % k

    def hard_words(self, length: int) -> torch.Tensor:
        """Words that a construction finds hardest at this length (subclasses override)."""
        return torch.zeros(0, length, dtype=torch.long)

    # ---- tokenization ----------------------------------------------------------

    def encode(self, symbol_ids: torch.Tensor) -> TokenBatch:
        """Symbol ids [batch, length] -> tokens with the specials added."""
        if symbol_ids.ndim != 2:
            raise ExactLensError(f"symbol ids must be [batch, length], got shape {tuple(symbol_ids.shape)}")
        if symbol_ids.shape[0] == 0:
            raise ExactLensError("empty batch: give at least one word")
        if symbol_ids.numel() and (int(symbol_ids.min()) < 0 or int(symbol_ids.max()) >= len(self.alphabet)):
            raise ExactLensError(f"symbol ids must lie in [0, {len(self.alphabet)})")
        parts = []
        batch = symbol_ids.shape[0]
        if self.use_cls:
            parts.append(torch.full((batch, 1), self.token_id(CLS), dtype=torch.long))
        parts.append(symbol_ids.long())
        if self.use_eos:
            parts.append(torch.full((batch, 1), self.token_id(EOS), dtype=torch.long))
        tokens = torch.cat(parts, dim=1)
        return TokenBatch(tokens, torch.full((batch,), tokens.shape[1], dtype=torch.long))

    def tokenize(self, words: Sequence[str | Sequence[str]]) -> TokenBatch:
        """Words (possibly of different lengths) -> right-padded tokens and n_positions."""
        if isinstance(words, str):
            raise ExactLensError("tokenize takes a list of words; wrap a single word in a list")
        ids = self.to_ids(words)
        if not ids:
            raise ExactLensError("empty batch: give at least one word")
        n_pos = [len(w) + self.n_specials for w in ids]
        width = max(n_pos)
        tokens = torch.zeros(len(ids), width, dtype=torch.long)
        for row, word in enumerate(ids):
            encoded = self.encode(torch.tensor([word], dtype=torch.long).reshape(1, len(word))).tokens[0]
            tokens[row, : len(encoded)] = encoded
        return TokenBatch(tokens, torch.tensor(n_pos, dtype=torch.long))

    def labels(self, words: Sequence[str | Sequence[str]]) -> torch.Tensor:
        return torch.tensor([self.contains(w) for w in words], dtype=torch.bool)

    def decode(self, symbol_ids: torch.Tensor) -> list[str]:
        return ["".join(self.alphabet[int(i)] for i in row) for row in symbol_ids]


def check_length(length: int, what: str, min_length: int = 1, max_length: int | None = None) -> None:
    if not isinstance(length, int) or isinstance(length, bool):
        raise ExactLensError(f"{what}: length must be an integer, got {length!r}")
    if length < min_length:
        raise ExactLensError(f"{what}: length {length} is below the minimum {min_length}")
    if max_length is not None and length > max_length:
        raise ExactLensError(f"{what}: length {length} exceeds the stated limit {max_length}")

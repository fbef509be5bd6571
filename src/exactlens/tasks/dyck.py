"""Dyck languages with an optional depth bound (Transformer Cookbook §9.2).

Dyck-k: well-nested words over k bracket pairs, S -> eps | S S | o_t S c_t.
Dyck-k-D: the words of Dyck-k whose nesting depth (the largest number of unclosed
open brackets over all prefixes) is at most D. Dyck-1 is k = 1 with no bound.

Alphabet: "(" ")" for k = 1, then "[" "]", "{" "}", "<" ">" (k <= 4); symbol id 2t
opens and 2t + 1 closes pair t.

Sampler: random words from a mix that makes membership non-trivial (uniform random
words are almost never in the language): half are uniform over the members of the
length (uniform over depth-bounded Dyck paths, bracket types uniform), a quarter are
members with one symbol replaced (near misses), a quarter are uniform random words.
Membership is always computed, never assumed from the mix.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import torch

from exactlens.errors import ExactLensError
from exactlens.tasks.base import Task, check_count, check_length
from exactlens.tasks.variables import CausalVariable

BRACKETS = ("()", "[]", "{}", "<>")


class Dyck(Task):
    name = "dyck"
    use_cls = True
    use_eos = False

    def __init__(self, k: int = 1, max_depth: int | None = None):
        if not isinstance(k, int) or isinstance(k, bool) or not 1 <= k <= len(BRACKETS):
            raise ExactLensError(f"dyck: k (bracket pairs) must be an integer in [1, {len(BRACKETS)}], got {k!r}")
        if max_depth is not None and (not isinstance(max_depth, int) or isinstance(max_depth, bool) or max_depth < 1):
            raise ExactLensError(f"dyck: max_depth must be an integer >= 1 or None (unbounded), got {max_depth!r}")
        self.k = k
        self.max_depth = max_depth
        self.alphabet = tuple(symbol for pair in BRACKETS[:k] for symbol in pair)

    @property
    def params(self) -> dict:
        return {"k": self.k, "max_depth": self.max_depth}

    # ---- membership ------------------------------------------------------------

    def contains(self, word: str | Sequence[str]) -> bool:
        """Stack algorithm: every close matches the last unclosed open of its pair."""
        stack: list[int] = []
        for symbol in self.symbols_of(word):
            index = self.alphabet.index(symbol)
            if index % 2 == 0:
                stack.append(index // 2)
                if self.max_depth is not None and len(stack) > self.max_depth:
                    return False
            elif not stack or stack.pop() != index // 2:
                return False
        return not stack

    def membership(self, symbol_ids: torch.Tensor) -> torch.Tensor:
        """Vectorized over a batch: every conjunct of ``conditions`` holds (its one stack walk)."""
        return self._member_with(symbol_ids)

    # ---- causal variables: membership = balance 0 AND no violation AND types match AND depth <= D

    def depths(self, symbol_ids: torch.Tensor) -> torch.Tensor:
        """Prefix depth after each symbol, #open - #close (types ignored), [B, L]."""
        return torch.where(symbol_ids % 2 == 0, 1, -1).cumsum(dim=1)

    def conditions(self, symbol_ids: torch.Tensor) -> dict[str, torch.Tensor]:
        """The conjuncts of membership per word, bool [B]: balanced, no violation (no prefix closes
        more than it opens), types match (every close matches the last unclosed open, where there is
        one), depth within the bound."""
        batch, length = symbol_ids.shape
        depth = self.depths(symbol_ids) if length else torch.zeros(batch, 1, dtype=torch.long)
        stack = torch.zeros(batch, length + 1, dtype=torch.long)
        height = torch.zeros(batch, dtype=torch.long)
        types_ok = torch.ones(batch, dtype=torch.bool)
        rows = torch.arange(batch)
        for pos in range(length):
            symbol = symbol_ids[:, pos].long()
            opening, pair = symbol % 2 == 0, symbol // 2
            top = stack[rows, (height - 1).clamp(min=0)]
            types_ok &= opening | (height == 0) | (top == pair)  # a close on an empty stack is a violation
            stack[rows, height] = torch.where(opening, pair, stack[rows, height])
            height = torch.where(opening, height + 1, (height - 1).clamp(min=0))
        bound = self.max_depth
        return {
            "balanced": depth[:, -1] == 0,
            "no violation": (depth >= 0).all(dim=1),
            "types match": types_ok,
            "depth ok": (
                (depth.max(dim=1).values <= bound) if bound is not None else torch.ones(batch, dtype=torch.bool)
            ),
        }

    def _member_with(self, base: torch.Tensor, **set_to: torch.Tensor) -> torch.Tensor:
        cond = self.conditions(base) | set_to
        return cond["balanced"] & cond["no violation"] & cond["types match"] & cond["depth ok"]

    def variables(self) -> list[CausalVariable]:
        out = [
            CausalVariable(
                "balance", "word", lambda ids: self.depths(ids)[:, -1] if ids.shape[1] else ids.sum(1) * 0,
                lambda base, b: self._member_with(base, balanced=b == 0), "#open - #close of the word",
            ),
            CausalVariable(
                "violation", "word", lambda ids: ~self.conditions(ids)["no violation"],
                lambda base, v: self._member_with(base, **{"no violation": ~v}),
                "some prefix closes more brackets than it opens",
            ),
        ]
        if self.k == 1:  # with one bracket type the depth profile decides membership
            bound = self.max_depth

            def from_depth(base: torch.Tensor, depth: torch.Tensor) -> torch.Tensor:
                if depth.shape[1] == 0:
                    return torch.ones(base.shape[0], dtype=torch.bool)
                ok = (depth >= 0).all(dim=1) & (depth[:, -1] == 0)
                return ok & (depth.max(dim=1).values <= bound) if bound is not None else ok

            out.append(CausalVariable("depth", "position", self.depths, from_depth, "prefix depth after symbol i"))
        return out

    def depth(self, word: str | Sequence[str]) -> int:
        """Largest number of unclosed opens over the prefixes (brackets' types ignored)."""
        depth = best = 0
        for symbol in self.symbols_of(word):
            depth += 1 if self.alphabet.index(symbol) % 2 == 0 else -1
            best = max(best, depth)
        return best

    # ---- sampling --------------------------------------------------------------

    def _path_counts(self, length: int, bound: int) -> list[list[int]]:
        return _path_counts(length, bound)

    def sample_members(self, length: int, count: int, generator: torch.Generator) -> torch.Tensor:
        """count members of the given (even) length, uniform over the language's words."""
        check_length(length, self.name, min_length=0)
        if length % 2:
            raise ExactLensError(f"dyck: no word of odd length {length} is a member")
        bound = length // 2 if self.max_depth is None else min(self.max_depth, length // 2)
        counts = self._path_counts(length, bound)
        # P(step up | remaining p, height h) = counts[p-1][h+1] / counts[p][h], as float64.
        up = torch.zeros(length + 1, bound + 2, dtype=torch.float64)
        for p in range(1, length + 1):
            for h in range(bound + 1):
                if counts[p][h]:
                    up[p, h] = (counts[p - 1][h + 1] if h + 1 <= bound else 0) / counts[p][h]
        words = torch.zeros(count, length, dtype=torch.long)
        height = torch.zeros(count, dtype=torch.long)
        stack = torch.zeros(count, length + 1, dtype=torch.long)
        rows = torch.arange(count)
        for pos in range(length):
            go_up = torch.rand(count, generator=generator, dtype=torch.float64) < up[length - pos, height]
            pair = torch.randint(0, self.k, (count,), generator=generator)
            top = stack[rows, (height - 1).clamp(min=0)]
            words[:, pos] = torch.where(go_up, 2 * pair, 2 * top + 1)
            stack[rows, height] = torch.where(go_up, pair, stack[rows, height])
            height = torch.where(go_up, height + 1, height - 1)
        return words

    def sample(self, length: int, count: int, generator: torch.Generator) -> torch.Tensor:
        check_length(length, self.name, min_length=0)
        check_count(count, self.name)
        words = torch.randint(0, len(self.alphabet), (count, length), generator=generator)
        if length == 0 or length % 2 or count == 0:
            return words  # odd lengths have no members: uniform words
        members = count // 2 + count // 4
        words[:members] = self.sample_members(length, members, generator)
        near = torch.arange(count // 2, members)  # one symbol replaced by a different one
        if near.numel():
            where = torch.randint(0, length, (near.numel(),), generator=generator)
            shift = torch.randint(1, len(self.alphabet), (near.numel(),), generator=generator)
            words[near, where] = (words[near, where] + shift) % len(self.alphabet)
        return words[torch.randperm(count, generator=generator)]

    def hard_words(self, length: int) -> torch.Tensor:
        """Words whose decision hinges on one small quantity: a single prefix violation
        at the end ("()"* ... ")("), one unclosed open at the end, the deepest
        allowed nest and one level deeper, a type mismatch at the innermost pair."""
        check_length(length, self.name, min_length=0)
        if length < 2:
            return torch.zeros(0, length, dtype=torch.long)
        o, c = 0, 1  # pair 0
        half, rows = length // 2, []
        flat = [o, c] * half + [o] * (length % 2)
        rows.append(flat)
        if length % 2 == 0:
            rows.append([o, c] * (half - 1) + [c, o])  # balanced count, violated at the last-but-one symbol
            rows.append([o, c] * (half - 1) + [o, o])  # ends with two unclosed opens
            depth = half if self.max_depth is None else min(half, self.max_depth)
            nest = [o] * depth + [c] * depth
            rows.append(nest + [o, c] * (half - depth))
            rows.append([o, c] * (half - depth) + nest)
            if depth + 1 <= half:
                deeper = [o] * (depth + 1) + [c] * (depth + 1)
                rows.append([o, c] * (half - depth - 1) + deeper)
            if self.k > 1:
                mismatch = list(nest)
                mismatch[depth] = 2 * 1 + 1  # close of pair 1 where pair 0 is open
                rows.append(mismatch + [o, c] * (half - depth))
        return torch.tensor(rows, dtype=torch.long)


def count_members(length: int, k: int = 1, max_depth: int | None = None) -> int:
    """Number of words of Dyck-k(-D) of this length (a closed form check for samplers)."""
    if length % 2:
        return 0
    bound = length // 2 if max_depth is None else min(max_depth, length // 2)
    return Dyck(k, max_depth)._path_counts(length, bound)[length][0] * k ** (length // 2)


@functools.lru_cache(maxsize=64)
def _path_counts(length: int, bound: int) -> list[list[int]]:
    """counts[p][h]: number of height paths of p more steps from height h down to 0
    that stay in [0, bound] (exact integers)."""
    counts = [[0] * (bound + 2) for _ in range(length + 1)]
    counts[0][0] = 1
    for p in range(1, length + 1):
        for h in range(bound + 1):
            counts[p][h] = (counts[p - 1][h + 1] if h + 1 <= bound else 0) + (counts[p - 1][h - 1] if h else 0)
    return counts

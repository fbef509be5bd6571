"""The task protocol: every question verify, precision, train, diff and the report ask of a task.

A task is a set of words over an alphabet with, for each word, a target: a membership bit, a
class, a class per symbol, or a real value per symbol (:mod:`exactlens.tasks.kinds`). A word is
a Python string of one-character symbols ("0110") or a sequence of symbol strings. ``length``
always means |w|, the number of symbols; the tokenizer adds the special tokens ([CLS] first,
[EOS] last where the task uses them), so a word of length L becomes L + specials positions.

A subclass sets ``name``, ``kind``, ``alphabet`` (and ``use_cls``/``use_eos``, length limits,
``classes``) and implements:

* ``target(word)``: the reference answer for one word, in plain Python, written independently
  of any model and of the vectorized version (``contains(word)`` for membership tasks);
* ``targets(ids)``: the same for a batch of words of one length, vectorized
  (``membership(ids)`` for membership tasks); tests check the two agree;
* optionally ``sample`` (the default draws uniform words), ``hard_words`` (the words a
  construction finds hardest at a length) and ``variables`` (named causal variables).

Deciding and scoring go through the kind (``decide``, ``loss``, ``margin``, ``score``), with the
one signature ``(outputs, n_positions)`` everywhere.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from exactlens.errors import ExactLensError
from exactlens.tasks import kinds
from exactlens.tasks.variables import CausalVariable

CLS = "[CLS]"
EOS = "[EOS]"
EXHAUSTIVE_LIMIT = 2**22  # all_words enumerates at most this many words
UNDEFINED = -100
"""A class target where the task has no answer (e.g. a RASP program's None): cross-entropy's
ignore_index; a value target there is NaN. ``target_mask(..., truth)`` leaves both out."""


@dataclass
class TokenBatch:
    """Right-padded token ids [batch, pos] with the real positions of each row."""

    tokens: torch.Tensor
    n_positions: torch.Tensor

    def __len__(self) -> int:
        return self.tokens.shape[0]


class Task:
    """Base class of every task (see the module docstring)."""

    name: str = ""
    kind: str = "membership"
    alphabet: tuple[str, ...] = ()
    use_cls: bool = True
    use_eos: bool = False
    cls_token: str = CLS  # the name of the first special token (an imported model may use its own, e.g. tracr's BOS)
    min_length: int = 0  # shortest |w| the task is defined for
    max_length: int | None = None  # longest |w| (None: any)
    first_target: int = 0  # per-position kinds: symbol positions before this carry no target

    @property
    def params(self) -> dict[str, Any]:
        """The constructor parameters (JSON values) that rebuild this task with exactlens.tasks.get."""
        return {}

    def spec(self) -> dict[str, Any]:
        """{"name", "kind", "params"}: what a model's config records (ExactConfig.task)."""
        return {"name": self.name, "kind": self.kind, "params": dict(self.params)}

    def __repr__(self) -> str:
        params = ", ".join(f"{k}={v!r}" for k, v in self.params.items())
        return f"{type(self).__name__}({params})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Task) and self.spec() == other.spec()

    def __hash__(self) -> int:
        return hash((self.name, json.dumps(self.params, sort_keys=True, default=str)))

    # ---- vocabulary and tokenization ------------------------------------------------------

    @property
    def vocab(self) -> tuple[str, ...]:
        """Token names by id: the alphabet, then [CLS] (``cls_token``), then [EOS] if used."""
        return self.alphabet + ((self.cls_token,) if self.use_cls else ()) + ((EOS,) if self.use_eos else ())

    @property
    def n_specials(self) -> int:
        return int(self.use_cls) + int(self.use_eos)

    @property
    def symbol_offset(self) -> int:
        """Token position of the first symbol (1 after [CLS], else 0)."""
        return int(self.use_cls)

    @property
    def classes(self) -> tuple[str, ...]:
        """Names of the output classes (membership: reject, accept; classes of a class task)."""
        if self.kind == "membership":
            return ("reject", "accept")
        if self.kind == "regression":
            return ("value",)
        return self.alphabet

    @property
    def n_outputs(self) -> int:
        """Readout width of a standard model of this task (1 for a sigmoid membership logit)."""
        return 1 if self.kind in ("membership", "regression") else len(self.classes)

    @property
    def readout(self) -> str:
        """ExactConfig.readout of a standard model of this task."""
        return kinds.READOUTS[self.kind]

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

    def ids(self, words: Sequence[str | Sequence[str]]) -> torch.Tensor:
        """Words of one length -> symbol ids [batch, length]."""
        if isinstance(words, str):
            raise ExactLensError("give a list of words; wrap a single word in a list")
        rows = self.to_ids(words)
        if not rows:
            raise ExactLensError("empty batch: give at least one word")
        if len({len(r) for r in rows}) > 1:
            lengths = sorted({len(r) for r in rows})
            raise ExactLensError(f"{self.name}: ids() needs words of one length, got lengths {lengths}")
        return torch.tensor(rows, dtype=torch.long).reshape(len(rows), len(rows[0]))

    def encode(self, symbol_ids: torch.Tensor) -> TokenBatch:
        """Symbol ids [batch, length] -> tokens with the specials added."""
        if not isinstance(symbol_ids, torch.Tensor) or symbol_ids.ndim != 2:
            shape = tuple(symbol_ids.shape) if isinstance(symbol_ids, torch.Tensor) else type(symbol_ids).__name__
            raise ExactLensError(f"symbol ids must be a tensor [batch, length], got {shape}")
        if symbol_ids.shape[0] == 0:
            raise ExactLensError("empty batch: give at least one word")
        if symbol_ids.is_floating_point() or symbol_ids.is_complex() or symbol_ids.dtype == torch.bool:
            raise ExactLensError(f"symbol ids must be an integer tensor (ids into the alphabet {list(self.alphabet)}), "
                                 f"got dtype {symbol_ids.dtype}: a float id is never rounded or truncated")
        if symbol_ids.numel() and (int(symbol_ids.min()) < 0 or int(symbol_ids.max()) >= len(self.alphabet)):
            raise ExactLensError(f"symbol ids must lie in [0, {len(self.alphabet)})")
        parts = []
        batch = symbol_ids.shape[0]
        if self.use_cls:
            parts.append(torch.full((batch, 1), self.token_id(self.cls_token), dtype=torch.long))
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
        tokens = torch.zeros(len(ids), max(n_pos), dtype=torch.long)
        for row, word in enumerate(ids):
            encoded = self.encode(torch.tensor([word], dtype=torch.long).reshape(1, len(word))).tokens[0]
            tokens[row, : len(encoded)] = encoded
        return TokenBatch(tokens, torch.tensor(n_pos, dtype=torch.long))

    def decode(self, symbol_ids: torch.Tensor) -> list[str]:
        return ["".join(self.alphabet[int(i)] for i in row) for row in symbol_ids]

    # ---- lengths and words ------------------------------------------------------------------

    def check_length(self, length: int) -> None:
        """A clear error for a length the task is not defined for."""
        check_length(length, self.name, self.min_length, self.max_length)

    def sample(self, length: int, count: int, generator: torch.Generator) -> torch.Tensor:
        """count words of the given length as symbol ids [count, length] (default: uniform)."""
        self.check_length(length)
        check_count(count, self.name)
        return torch.randint(0, len(self.alphabet), (count, length), generator=generator)

    def sample_held_out(self, length: int, count: int, generator: torch.Generator) -> torch.Tensor:
        """Words for testing a trained model: ``sample``'s law for generated tasks; a task over a
        fixed text draws them from its held-out part."""
        return self.sample(length, count, generator)

    def all_words(self, length: int) -> torch.Tensor:
        """Every word of the given length, ids [|alphabet|^length, length]."""
        self.check_length(length)
        k = len(self.alphabet)
        if k**length > EXHAUSTIVE_LIMIT:
            raise ExactLensError(f"{k}^{length} words are too many to enumerate (limit 2^22)")
        index = torch.arange(k**length).unsqueeze(1)
        powers = k ** torch.arange(length - 1, -1, -1)
        return (index // powers) % k

    def hard_words(self, length: int) -> torch.Tensor:
        """Words that constructions find hardest at this length (subclasses override)."""
        return torch.zeros(0, length, dtype=torch.long)

    def words(
        self, length: int, count: int, generator: torch.Generator, exhaustive_limit: int = 4096
    ) -> tuple[torch.Tensor, bool]:
        """Every word of the length when there are at most ``exhaustive_limit``, else ``count``
        sampled ones; (ids, exhaustive)."""
        self.check_length(length)
        if len(self.alphabet) ** length <= exhaustive_limit:
            return self.all_words(length), True
        return self.sample(length, count, generator), False

    # ---- targets -----------------------------------------------------------------------------

    def target(self, word: str | Sequence[str]) -> Any:
        """The reference answer for one word (pure Python): a bool (membership), a class index, or a
        list with one entry per symbol position (per-position kinds; None where there is no target)."""
        if self.kind == "membership":
            return self.contains(word)
        raise NotImplementedError

    def targets(self, symbol_ids: torch.Tensor) -> torch.Tensor:
        """Vectorized answers for words of one length, ids [B, L] -> kind-shaped targets."""
        if self.kind == "membership":
            return self.membership(symbol_ids)
        raise NotImplementedError

    def targets_of(self, words: Sequence[str | Sequence[str]]) -> torch.Tensor:
        """Targets of words of any lengths, in order (per-position targets right-padded with 0;
        ``target_mask`` says which entries are real)."""
        if isinstance(words, str):
            raise ExactLensError("targets_of takes a list of words; wrap a single word in a list")
        rows = self.to_ids(words)
        if not rows:
            raise ExactLensError("empty batch: give at least one word")
        parts = [self.targets(torch.tensor([r], dtype=torch.long).reshape(1, len(r))) for r in rows]
        if self.kind in ("membership", "classification"):
            return torch.cat(parts)
        width = max(len(r) for r in rows)
        return torch.cat([torch.nn.functional.pad(p, (0, width - p.shape[1])) for p in parts])

    def target_mask(self, lengths: torch.Tensor, width: int, truth: torch.Tensor | None = None) -> torch.Tensor:
        """bool [B, width]: the symbol positions that carry a target, for words of the given lengths
        (per-position kinds; every word has exactly one target otherwise). ``truth``: the words'
        targets [B, L]; positions whose target is undefined there (UNDEFINED, NaN) are left out too."""
        j = torch.arange(width, device=lengths.device).unsqueeze(0)
        mask = (j < lengths.unsqueeze(1)) & (j >= self.first_target)
        return mask if truth is None else mask & defined_targets(truth, width)

    def contains(self, word: str | Sequence[str]) -> bool:
        """Membership of one word (membership tasks), written independently of any model."""
        raise ExactLensError(self._not_membership())

    def membership(self, symbol_ids: torch.Tensor) -> torch.Tensor:
        """Vectorized membership, ids [batch, length] -> bool [batch] (membership tasks)."""
        raise ExactLensError(self._not_membership())

    def labels(self, words: Sequence[str | Sequence[str]]) -> torch.Tensor:
        """Membership bits of words of any lengths, from the reference ``contains``."""
        return torch.tensor([self.contains(w) for w in words], dtype=torch.bool)

    def _not_membership(self) -> str:
        return (
            f"{self.name} is a {self.kind} task: its answers are targets (target(word), targets(ids)), "
            "not membership bits"
        )

    # ---- deciding and scoring (by kind) ----------------------------------------------------

    def decide(self, outputs: torch.Tensor, n_positions: torch.Tensor) -> torch.Tensor:
        """The kind's standard decision for a standard readout (a construction with other outputs
        names its own rule: exactlens.tasks.reader)."""
        return kinds.decide(self, outputs, n_positions)

    def loss(self, outputs: torch.Tensor, targets: torch.Tensor, n_positions: torch.Tensor) -> torch.Tensor:
        """Per-word training loss [B] (cross-entropy in nats, or squared error for regression)."""
        return kinds.loss(self, outputs, targets, n_positions)

    def score(
        self,
        predictions: torch.Tensor,
        targets: torch.Tensor,
        n_positions: torch.Tensor,
        tolerance: float | None = None,
    ) -> kinds.Scores:
        return kinds.score(self, predictions, targets, n_positions, tolerance)

    # ---- causal variables ----------------------------------------------------------------------

    def variables(self) -> list[CausalVariable]:
        """Named causal variables (functions of the input) for probes and interchange interventions."""
        return []

    def variable(self, name: str) -> CausalVariable:
        found = {v.name: v for v in self.variables()}
        if name not in found:
            raise ExactLensError(f"{self.name} has no variable {name!r}; it has {sorted(found) or 'none'}")
        return found[name]


def defined_targets(truth: torch.Tensor, width: int) -> torch.Tensor:
    """bool [B, width]: per-position targets that are defined (not UNDEFINED, not NaN); positions
    beyond the targets' width have none."""
    if truth.ndim != 2:
        raise ExactLensError(f"per-position targets are [batch, positions], got shape {tuple(truth.shape)}")
    part = truth[:, :width]
    ok = ~part.isnan() if part.is_floating_point() else part != UNDEFINED
    return torch.nn.functional.pad(ok, (0, width - part.shape[1]), value=False)


def check_length(length: int, what: str, min_length: int = 0, max_length: int | None = None) -> None:
    if not isinstance(length, int) or isinstance(length, bool):
        raise ExactLensError(f"{what}: length must be an integer, got {length!r}")
    if length < min_length:
        raise ExactLensError(f"{what}: length {length} is below the minimum {min_length}")
    if max_length is not None and length > max_length:
        raise ExactLensError(f"{what}: length {length} exceeds the stated limit {max_length}")


def check_count(count: int, what: str) -> None:
    if not isinstance(count, int) or isinstance(count, bool) or count < 0:
        raise ExactLensError(f"{what}: count must be an integer >= 0, got {count!r}")


SEED_LIMIT = 2**40  # |seed|: seeds are mixed with lengths (seed * 1_000_003 + n) into torch's 64-bit seeds


def check_seed(seed: Any, minimum: int = -SEED_LIMIT) -> int:
    """A seed: an integer in [minimum, 2^40], or a clear error (never an overflow inside torch)."""
    if isinstance(seed, bool) or not isinstance(seed, int) or not minimum <= seed <= SEED_LIMIT:
        raise ExactLensError(f"seed must be an integer in [{minimum}, 2^40], got {seed!r:.80}")
    return seed


def check_int(value: Any, what: str, low: int, high: int | None = None) -> int:
    """An integer parameter in [low, high] (high None: no upper bound), or a clear error."""
    if not isinstance(value, int) or isinstance(value, bool) or value < low or (high is not None and value > high):
        bound = f"in [{low}, {high}]" if high is not None else f">= {low}"
        raise ExactLensError(f"{what} must be an integer {bound}, got {value!r}")
    return value


Language = Task
"""The name of the task base class before tasks had kinds (membership tasks are languages)."""

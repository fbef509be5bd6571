"""Formal languages and tasks: samplers, exact membership, tokenization."""

import inspect

from exactlens.errors import ExactLensError
from exactlens.languages.base import CLS, EOS, Language, TokenBatch
from exactlens.languages.binary import First, Parity
from exactlens.languages.dyck import Dyck
from exactlens.languages.induction import InductionFrequent, InductionRecent
from exactlens.languages.majority import Majority
from exactlens.languages.nowak import One, Palindrome
from exactlens.languages.pairs import Pairs

LANGUAGES: dict[str, type[Language]] = {"parity": Parity, "first": First}
LANGUAGES.update({"one": One, "palindrome": Palindrome})
LANGUAGES.update({"majority": Majority, "dyck": Dyck, "induction-recent": InductionRecent})
LANGUAGES.update({"induction-frequent": InductionFrequent})
LANGUAGES.update({"pairs": Pairs})


def get(name: str, **params) -> Language:
    """A language by name; params go to its constructor (e.g. num_classes for majority)."""
    if name not in LANGUAGES:
        raise ExactLensError(f"unknown language {name!r}; known: {', '.join(sorted(LANGUAGES))}")
    cls = LANGUAGES[name]
    allowed = set(inspect.signature(cls).parameters) - {"self"}
    if set(params) - allowed:
        unknown = sorted(set(params) - allowed)
        raise ExactLensError(f"language {name!r} takes the parameters {sorted(allowed)}, not {unknown}")
    return cls(**params)


def register(cls: type[Language]) -> type[Language]:
    """Class decorator: make a language available by its name."""
    LANGUAGES[cls.name] = cls
    return cls


__all__ = [
    "CLS", "EOS", "LANGUAGES", "Dyck", "First", "InductionFrequent", "InductionRecent", "Language", "Majority",
    "One", "Palindrome", "Parity", "TokenBatch", "get", "register",
]

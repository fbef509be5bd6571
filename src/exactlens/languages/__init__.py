"""Formal languages and tasks: samplers, exact membership, tokenization."""

from exactlens.errors import ExactLensError
from exactlens.languages.base import CLS, EOS, Language, TokenBatch
from exactlens.languages.binary import First, Parity

LANGUAGES: dict[str, type[Language]] = {"parity": Parity, "first": First}


def get(name: str) -> Language:
    """A language by name."""
    if name not in LANGUAGES:
        raise ExactLensError(f"unknown language {name!r}; known: {', '.join(sorted(LANGUAGES))}")
    return LANGUAGES[name]()


def register(cls: type[Language]) -> type[Language]:
    """Class decorator: make a language available by its name."""
    LANGUAGES[cls.name] = cls
    return cls


__all__ = ["CLS", "EOS", "LANGUAGES", "First", "Language", "Parity", "TokenBatch", "get", "register"]

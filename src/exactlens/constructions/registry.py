"""The registry: construction names -> builders, languages and parameters.

Other modules (and later papers) add entries with :func:`register`.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from exactlens.errors import ExactLensError
from exactlens.languages import Language
from exactlens.languages import get as get_language
from exactlens.model import ExactTransformer


def accept_positive_logit(logits: torch.Tensor) -> torch.Tensor:
    """Sigmoid readout: accept iff sigma(s) > 1/2, i.e. s > 0."""
    return logits > 0


@dataclass
class Construction:
    name: str
    language: str
    build: Callable[..., ExactTransformer]
    paper: str
    summary: str
    max_length: int | None = None  # longest |w| the construction claims (None: any)
    min_length: int = 0  # shortest |w| it is defined for
    decide: Callable[[torch.Tensor], torch.Tensor] = accept_positive_logit
    margin: Callable[[torch.Tensor], torch.Tensor] | None = None  # distance to the decision boundary (verify)
    tags: tuple[str, ...] = field(default_factory=tuple)

    def defaults(self) -> dict[str, Any]:
        """Builder parameters and their defaults (dtype excluded)."""
        sig = inspect.signature(self.build)
        return {k: p.default for k, p in sig.parameters.items() if k != "dtype"}

    def make(self, dtype: str = "float32", **params: Any) -> ExactTransformer:
        unknown = sorted(set(params) - set(self.defaults()))
        if unknown:
            raise ExactLensError(f"{self.name} has no parameters {unknown}; it takes {sorted(self.defaults())}")
        model = self.build(dtype=dtype, **params)
        model.cfg.model_name = self.name  # the registry name (parameters live in cfg.metadata)
        model.eval()
        return model

    def lang(self) -> Language:
        return get_language(self.language)

    def check_length(self, length: int) -> None:
        if length < self.min_length:
            raise ExactLensError(
                f"{self.name} is defined for |w| >= {self.min_length}; length {length} is below its limit"
            )
        if self.max_length is not None and length > self.max_length:
            raise ExactLensError(
                f"{self.name} is stated for |w| <= {self.max_length}; length {length} is beyond its limit"
            )

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "language": self.language,
            "paper": self.paper,
            "summary": self.summary,
            "parameters": self.defaults(),
            "min_length": self.min_length,
            "max_length": self.max_length,
        }


REGISTRY: dict[str, Construction] = {}


def register(construction: Construction) -> Construction:
    if construction.name in REGISTRY:
        raise ExactLensError(f"construction {construction.name!r} is already registered")
    REGISTRY[construction.name] = construction
    return construction


def get(name: str) -> Construction:
    _load_builtin()
    if name not in REGISTRY:
        raise ExactLensError(f"unknown construction {name!r}; known: {', '.join(sorted(REGISTRY))}")
    return REGISTRY[name]


def names() -> list[str]:
    _load_builtin()
    return sorted(REGISTRY)


def build(name: str, dtype: str = "float32", **params: Any) -> ExactTransformer:
    """Build a registered construction: ``build("parity", dtype="float64", c=2.0)``."""
    return get(name).make(dtype=dtype, **params)


_LOADED = False


def _load_builtin() -> None:
    global _LOADED
    if not _LOADED:
        _LOADED = True
        from exactlens.constructions import catalog  # noqa: F401  (registers the built-ins)

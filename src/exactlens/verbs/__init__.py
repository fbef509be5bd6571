"""Verbs: each is declared once, as a :class:`VerbSpec`: its request (a dataclass of options,
exactlens.requests), the function that does the work, and the views of its results
(exactlens.results). The command line (exactlens.cli) and the Python API (exactlens.api) are both
generated from the specs: a verb's flags, keyword arguments, validation and text exist in one place.

``register_verb(VerbSpec(...))`` is how the core's verbs (``exactlens.verbs.<verb>``) and a plug-in's
verbs are added. Every verb module is light at import (no torch): ``exactlens --help`` loads them all.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from exactlens.errors import ExactLensError
from exactlens.plugins import Registry
from exactlens.results import View, register_view

__all__ = ["CORE_VERBS", "VERBS", "Verb", "VerbSpec", "load_core_verbs", "register_verb"]


@dataclass(frozen=True)
class VerbSpec:
    """``exactlens NAME ...`` and ``el.NAME(...)``.

    ``request``: the options (a dataclass of exactlens.requests fields); ``run(request)`` does the work and
    returns a Result (``build`` returns a model); ``views``: how each kind of result it returns shows
    itself; ``after(request, result, from_cli)`` runs once the result is printed (the CLI) or returned
    (the API), e.g. to write a page, so a failing write cannot lose the result; ``cli``/``api``: which
    entries exist; ``json``: whether the CLI has ``--json`` (one JSON object on stdout)."""

    name: str
    help: str
    request: type
    run: Callable[[Any], Any]
    views: Mapping[str, View] = field(default_factory=dict)
    description: str | None = None
    order: int = 500  # position in `exactlens --help`
    after: Callable[[Any, Any, bool], None] | None = None
    cli: bool = True
    api: bool = True
    json: bool = True


VERBS: dict[str, Any] = Registry("verbs")

CORE_VERBS = ("listing", "task", "build", "verify", "precision", "train", "diff", "timeline", "hull", "circuit",
              "discover", "report", "sweep")
"""The core's verb modules (exactlens.verbs.<name>); each registers its spec when imported."""


@dataclass(frozen=True)
class Verb:
    """The older form of a command-line-only verb (before VerbSpec), still accepted from plug-ins:
    ``add_arguments`` fills its argparse parser, ``run(args)`` does the work and prints."""

    name: str
    help: str
    add_arguments: Callable[[Any], None]
    run: Callable[[Any], None]
    description: str | None = None
    order: int = 500


def register_verb(spec: Any) -> Any:
    """Add a verb (a :class:`VerbSpec`; the older :class:`Verb` gives a command-line verb only)."""
    if not isinstance(spec, (VerbSpec, Verb)):
        raise ExactLensError(f"register_verb takes a VerbSpec, got {type(spec).__name__}")
    if VERBS.peek(spec.name) not in (None, spec):
        raise ExactLensError(f"a verb named {spec.name!r} is already registered")
    VERBS[spec.name] = spec
    for kind, view in getattr(spec, "views", {}).items():
        register_view(kind, view)
    return spec


def load_core_verbs() -> None:
    """Import the core's verb modules (each registers itself; light, no torch)."""
    for name in CORE_VERBS:
        importlib.import_module(f"exactlens.verbs.{name}")


_messages = {"on": False}


def tell(message: str) -> None:
    """A one-line progress message on stderr from a verb: shown on the command line (where the user waits
    for the verb), not from the Python API (where the result is the answer)."""
    if _messages["on"]:
        from exactlens.progress import say

        say(message)


def messages_on(on: bool) -> None:
    """Whether :func:`tell` prints (the command line turns it on)."""
    _messages["on"] = bool(on)

"""The verb registry: each verb is declared once, as a :class:`VerbSpec`: its request (a dataclass of options,
exactlens.requests), the function that does the work, and the views of its results (exactlens.results). The
command line (exactlens.cli), the Python API (exactlens.api) and the sweep engine (exactlens.sweep) all find a
verb here by its name: a verb's flags, keyword arguments, validation and text exist in one place.

``register_verb(VerbSpec(...))`` (public as ``exactlens.verbs.register_verb``) is how the core's verbs
(``exactlens.verbs.<verb>``) and a plug-in's verbs are added. The module sits in the bottom layer: it imports
no verb. The core's verb modules are found by name (``CORE_VERBS``, as the plug-ins are by their entry
points) when the registry is first read, so a fresh sweep worker finds every verb too. Every verb module is
light at import (no torch): ``exactlens --help`` loads them all.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from exactlens.errors import ExactLensError
from exactlens.plugins import Registry
from exactlens.requests import FlagsOf, api_parameters, from_call, options_of
from exactlens.results import View, register_view

__all__ = ["CORE_VERBS", "VERBS", "VerbSpec", "find_verb", "load_core_verbs", "messages_on", "register_verb", "tell",
           "verb_function"]


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
"""The core's verb modules (exactlens.verbs.<name>), found by name like the plug-ins' entry points; each
registers its spec when imported."""


def register_verb(spec: Any) -> Any:
    """Add a verb (a :class:`VerbSpec`)."""
    if not isinstance(spec, VerbSpec):
        raise ExactLensError(f"register_verb takes a VerbSpec, got {type(spec).__name__}")
    if VERBS.peek(spec.name) not in (None, spec):
        raise ExactLensError(f"a verb named {spec.name!r} is already registered")
    VERBS[spec.name] = spec
    for kind, view in spec.views.items():
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


def find_verb(name: str) -> VerbSpec | None:
    """The verb named ``name`` (the core's and the plug-ins' loaded first), or None."""
    load_core_verbs()
    spec = VERBS.get(name)  # reading the registry loads the plug-ins
    return spec if isinstance(spec, VerbSpec) else None


def verb_function(spec: VerbSpec) -> Callable[..., Any]:
    """``el.NAME``: the request from the arguments (checked by the request's kinds), the work, the verb's
    ``after`` (e.g. a page written), the result."""

    def verb(*args: Any, **kwargs: Any) -> Any:
        request = from_call(spec.name, spec.request, args, kwargs)
        result = spec.run(request)
        if spec.after is not None:
            spec.after(request, result, False)
        return result

    params, extra = api_parameters(spec.request)
    signature = []
    for name, f, opt in params:
        kind = inspect.Parameter.POSITIONAL_OR_KEYWORD if opt.positional_in_api else inspect.Parameter.KEYWORD_ONLY
        default = inspect.Parameter.empty if f.default is dataclasses.MISSING else f.default
        if f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
            default = f.default_factory()  # type: ignore[misc]
        signature.append(inspect.Parameter(name, kind, default=default))
    if extra is not None:
        signature.append(inspect.Parameter(extra, inspect.Parameter.VAR_KEYWORD))
    verb.__name__ = verb.__qualname__ = spec.name
    verb.__doc__ = _docstring(spec, params, extra)
    verb.__signature__ = inspect.Signature(signature)  # type: ignore[attr-defined]
    return verb


def _docstring(spec: VerbSpec, params: list, extra: str | None) -> str:
    lines = [f"``exactlens {spec.name}``: {spec.help}.", "", spec.description or "", "", "Options:"]
    lines += [f"    {name}: {opt.help}" for name, _, opt in params if opt.help]
    flags_only = []
    for f, opt in options_of(spec.request):
        if isinstance(opt.kind, FlagsOf):  # e.g. train's TrainOptions, each a flag
            flags_only += [(g.name, o) for g, o in options_of(opt.kind.options) if o.help]
        elif opt.cli and not opt.api and opt.help:
            flags_only.append((f.name, opt))
    if extra is not None and flags_only:  # e.g. train's TrainOptions: flags on the command line, keywords here
        lines += ["", f"Keyword arguments taken through ``**{extra}``:"]
        lines += [f"    {name}: {opt.help}" for name, opt in flags_only]
    return "\n".join(lines)

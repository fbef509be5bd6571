"""The notebook-first API: the command line's verbs as functions (``import exactlens as el``).

Every function here is generated from a verb's declaration (exactlens.verbs): ``el.verify("first",
lengths="1:8")`` takes the options of ``exactlens verify first --lengths 1:8`` as keyword arguments
(positional where the command line has them as words), checked the same way, with ``device`` among
them (``"auto"``, the default as on the command line: CUDA if present, else MPS, else the CPU). Each
returns a :class:`~exactlens.results.Result`: a read-only mapping holding exactly the CLI's ``--json``
object (``.to_dict()``), which shows itself in Jupyter as a compact table of headline figures with a
small plot (``_repr_html_``), prints as the CLI's text, and draws ``.plot()``. A plug-in's verbs (e.g.
``el.pairlogic``) come the same way. Long work shows progress bars (exactlens.progress).
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from exactlens.requests import api_parameters, from_call, options_of
from exactlens.results import VIEWS, Result, View, register_view
from exactlens.verbs import VERBS, VerbSpec, load_core_verbs

__all__ = ["API", "Result", "VIEWS", "View", "api_function", "register_api", "register_view"]

_EXTRA: dict[str, Callable[..., Any]] = {}  # functions registered directly (register_api)
_MADE: dict[str, Callable[..., Any]] = {}


def api_function(spec: VerbSpec) -> Callable[..., Any]:
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
    flags_only = [(f.name, opt) for f, opt in options_of(spec.request) if opt.cli and not opt.api and opt.help]
    if extra is not None and flags_only:  # e.g. train's TrainOptions: flags on the command line, keywords here
        lines += ["", f"Keyword arguments taken through ``**{extra}``:"]
        lines += [f"    {name}: {opt.help}" for name, opt in flags_only]
    return "\n".join(lines)


class _Api(Mapping):
    """name -> the API function of every verb with an API (generated once, when first asked), and those
    registered with :func:`register_api`."""

    def _names(self) -> list[str]:
        load_core_verbs()
        return sorted({n for n, v in VERBS.items() if getattr(v, "api", False)} | set(_EXTRA))

    def __getitem__(self, name: str) -> Callable[..., Any]:
        if name in _EXTRA:
            return _EXTRA[name]
        if name not in _MADE:
            load_core_verbs()
            spec = VERBS.get(name)
            if not isinstance(spec, VerbSpec) or not spec.api:
                raise KeyError(name)
            _MADE[name] = api_function(spec)
        return _MADE[name]

    def __contains__(self, name: object) -> bool:
        return name in self._names()

    def __iter__(self) -> Iterator[str]:
        return iter(self._names())

    def __len__(self) -> int:
        return len(self._names())


API: Mapping[str, Callable[..., Any]] = _Api()


def register_api(name: str, function: Callable[..., Any]) -> None:
    """Make ``exactlens.<name>`` a function of the API without a declared verb (kept for plug-ins; a
    plug-in's ``register_verb(VerbSpec(...))`` gives both its command and its function)."""
    _EXTRA[name] = function


def __getattr__(name: str) -> Any:
    """``exactlens.api.verify`` etc.: the generated functions."""
    if name.startswith("_"):
        raise AttributeError(name)
    try:
        return API[name]
    except KeyError:
        raise AttributeError(f"module 'exactlens.api' has no attribute {name!r}") from None

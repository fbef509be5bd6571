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

from collections.abc import Callable, Iterator, Mapping
from typing import Any

from exactlens.results import VIEWS, Result, View, register_view
from exactlens.verb_registry import VERBS, VerbSpec, load_core_verbs, verb_function

__all__ = ["API", "Result", "VIEWS", "View", "register_view"]

_MADE: dict[str, Callable[..., Any]] = {}

class _Api(Mapping):
    """name -> the API function of every verb with an API (generated once, when first asked)."""

    def _names(self) -> list[str]:
        load_core_verbs()
        return sorted(n for n, v in VERBS.items() if v.api)

    def __getitem__(self, name: str) -> Callable[..., Any]:
        if name not in _MADE:
            load_core_verbs()
            spec = VERBS.get(name)
            if not isinstance(spec, VerbSpec) or not spec.api:
                raise KeyError(name)
            _MADE[name] = verb_function(spec)
        return _MADE[name]

    def __contains__(self, name: object) -> bool:
        return name in self._names()

    def __iter__(self) -> Iterator[str]:
        return iter(self._names())

    def __len__(self) -> int:
        return len(self._names())


API: Mapping[str, Callable[..., Any]] = _Api()


def __getattr__(name: str) -> Any:
    """``exactlens.api.verify`` etc.: the generated functions."""
    if name.startswith("_"):
        raise AttributeError(name)
    try:
        return API[name]
    except KeyError:
        raise AttributeError(f"module 'exactlens.api' has no attribute {name!r}") from None

"""Names a package imports when first used (PEP 562), so that importing the package stays light
(``exactlens --help`` and ``list`` load no torch); and what a lower layer uses that a higher one provides
(:func:`provide`, :func:`provided`: an import that would run upward, injected from above instead)."""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Callable, Mapping
from typing import Any


def lazy_names(package: str, where: Mapping[str, str], *, submodules: bool = False
               ) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The package's ``__getattr__`` and ``__dir__``: ``where[name]`` is the submodule (relative to
    the package) that defines ``name``, imported on first use and the name kept in the package; with
    ``submodules``, any other public name that is a submodule is imported (``tasks.kinds``)."""
    namespace = sys.modules[package].__dict__

    def __getattr__(name: str) -> Any:
        if name in where:
            value = getattr(importlib.import_module(f"{package}.{where[name]}"), name)
            namespace[name] = value
            return value
        if submodules and not name.startswith("_") and importlib.util.find_spec(f"{package}.{name}") is not None:
            return importlib.import_module(f"{package}.{name}")
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(where))

    return __getattr__, __dir__


_PROVIDED: dict[str, Any] = {}


def provide(slot: str, target: str) -> None:
    """Fill ``slot`` with ``target`` ("package.module:attribute"), imported when first used. The slots: "siit_side"
    (exactlens.train.siit's analysis, exactlens.analysis.diff.siit_side: training sits below analysis, so the
    package ``exactlens``, at the top, provides it when imported)."""
    _PROVIDED[slot] = target


def provided(slot: str) -> Any:
    """What ``slot`` was filled with (imported on first use); an error naming the slot where none was provided."""
    from exactlens.errors import ExactLensError

    if slot not in _PROVIDED:
        raise ExactLensError(f"nothing provides {slot!r} (exactlens.lazy.provide; the package exactlens does when "
                             "imported)")
    value = _PROVIDED[slot]
    if isinstance(value, str):
        module, _, attribute = value.partition(":")
        value = _PROVIDED[slot] = getattr(importlib.import_module(module), attribute)
    return value

"""A package that is also a verb: ``exactlens.train`` is the training package and, called, the API's
``train`` verb (``import exactlens as el; el.train("first")``). The verb is named by a string and
looked up when called, so the package does not import the API."""

from __future__ import annotations

import importlib
import types
from typing import Any


class CallablePackage(types.ModuleType):
    def _verb(self) -> Any:
        module, _, name = self.__dict__["__exactlens_verb__"].partition(":")
        return getattr(importlib.import_module(module), name)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._verb()(*args, **kwargs)

    @property  # type: ignore[misc]
    def __doc__(self) -> str:  # type: ignore[override]
        """The package's text, then the verb's (``help(el.train)`` lists the options of a call)."""
        own = self.__dict__.get("__doc__") or ""
        return f"{own.rstrip()}\n\nCalled as a function:\n\n{self._verb().__doc__}"

    @property
    def __signature__(self) -> Any:
        """The verb's signature (``inspect.signature(el.train)`` lists its options)."""
        import inspect

        return inspect.signature(self._verb())


def make_callable(module: types.ModuleType, verb: str) -> None:
    """Make ``module`` callable as ``verb`` ("package.module:function")."""
    module.__exactlens_verb__ = verb
    module.__class__ = CallablePackage

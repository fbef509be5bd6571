"""A package that is also a verb: ``exactlens.train`` is the training package and, called, the API's
``train`` verb (``import exactlens as el; el.train("first")``). The verb is named and found in the verb
registry (exactlens.verb_registry) when called, so the package imports no verb and not the API."""

from __future__ import annotations

import types
from typing import Any


class CallablePackage(types.ModuleType):
    def _verb(self) -> Any:
        from exactlens.verb_registry import find_verb, verb_function

        name = self.__dict__["__exactlens_verb__"]
        spec = find_verb(name)
        if spec is None:
            from exactlens.errors import ExactLensError

            raise ExactLensError(f"no verb named {name!r} is registered")
        return verb_function(spec)

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
    """Make ``module`` callable as the verb named ``verb`` (e.g. "train")."""
    module.__exactlens_verb__ = verb
    module.__class__ = CallablePackage

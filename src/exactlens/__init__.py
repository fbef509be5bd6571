"""exactlens: the hand-built transformers of the theory literature as hooked TransformerLens models.

``import exactlens as el`` gives the verbs of the command line as functions (exactlens.api):
``el.build``, ``el.verify``, ``el.precision``, ``el.train``, ``el.diff``, ``el.hull``, ``el.report``
and the plug-ins' (``el.pairlogic``); their results show themselves in Jupyter. (``el.train`` is also
the package ``exactlens.train``: calling it runs the verb.) Everything is imported when first used,
so ``import exactlens`` (and ``exactlens --version``) is quick.
"""

import importlib
import importlib.util
from typing import Any

from exactlens import lazy as _lazy
from exactlens.errors import ExactLensError
from exactlens.version import __version__

# Training sits below analysis: SIIT's analysis side is provided from here, the top (named, imported when used).
_lazy.provide("siit_side", "exactlens.analysis.diff.siit_side:SIDE")

__all__ = ["ExactConfig", "ExactLensError", "ExactTransformer", "__version__"]

_MODEL_NAMES = ("ExactConfig", "ExactTransformer")


def __getattr__(name: str) -> Any:
    """The model classes, submodules, then the API's verbs (a plug-in's once the plug-ins loaded)."""
    if name.startswith("_"):
        raise AttributeError(name)
    if name in _MODEL_NAMES:
        return getattr(importlib.import_module("exactlens.model"), name)
    if importlib.util.find_spec(f"exactlens.{name}") is not None:
        return importlib.import_module(f"exactlens.{name}")  # exactlens.train: the package, callable as the verb
    from exactlens.api import API
    from exactlens.plugins import load_plugins

    if name not in API:
        load_plugins()
    if name in API:
        return API[name]
    raise AttributeError(f"module 'exactlens' has no attribute {name!r} (verbs: {', '.join(sorted(API))})")


def __dir__() -> list[str]:
    from exactlens.api import API
    from exactlens.plugins import load_plugins

    load_plugins()
    return sorted(set(globals()) | set(_MODEL_NAMES) | set(API))

"""exactlens: the hand-built transformers of the theory literature as hooked TransformerLens models.

``import exactlens as el`` gives the verbs of the command line as functions (exactlens.api):
``el.build``, ``el.verify``, ``el.precision``, ``el.train``, ``el.diff``, ``el.hull``, ``el.report``
and the plug-ins' (``el.pairlogic``); their results show themselves in Jupyter. (``el.train`` is also
the package ``exactlens.train``: calling it runs the verb.)
"""

import importlib
import importlib.util
from typing import Any

import exactlens.train as _train_package
from exactlens.api import API, make_callable
from exactlens.errors import ExactLensError
from exactlens.model import ExactConfig, ExactTransformer
from exactlens.version import __version__

make_callable(_train_package, API["train"])

__all__ = ["ExactConfig", "ExactLensError", "ExactTransformer", "__version__"]


def __getattr__(name: str) -> Any:
    """Submodules as usual; else the API's verbs (a plug-in's are there once the plug-ins loaded)."""
    if name.startswith("_"):
        raise AttributeError(name)
    if name in API:
        return API[name]
    if importlib.util.find_spec(f"exactlens.{name}") is not None:
        return importlib.import_module(f"exactlens.{name}")
    from exactlens.plugins import load_plugins

    load_plugins()
    if name in API:
        return API[name]
    raise AttributeError(f"module 'exactlens' has no attribute {name!r} (verbs: {', '.join(sorted(API))})")


def __dir__() -> list[str]:
    from exactlens.plugins import load_plugins

    load_plugins()
    return sorted(set(globals()) | set(API))

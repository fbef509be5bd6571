"""tracr, imported on first use, with a clear error where it is missing."""

from __future__ import annotations

from types import ModuleType

from exactlens.errors import ExactLensError

INSTALL_HINT = "tracr is not installed: pip install 'exactlens[tracr]'"


def rasp() -> ModuleType:
    """tracr.rasp.rasp (RASP expressions and tracr's evaluator)."""
    try:
        from tracr.rasp import rasp as module
    except ImportError as err:
        raise ExactLensError(f"{INSTALL_HINT} ({err})") from err
    return module


def compiler() -> ModuleType:
    """The package tracr.compiler with the passes that compile_program runs (imports jax and haiku)."""
    try:
        import tracr.compiler as package
        from tracr.compiler import (  # noqa: F401  (submodules, reached as package attributes)
            basis_inference,
            craft_graph_to_model,
            craft_model_to_transformer,
            expr_to_craft_graph,
            nodes,
            rasp_to_graph,
            validating,
        )
    except ImportError as err:
        raise ExactLensError(f"{INSTALL_HINT} ({err})") from err
    return package


def craft() -> ModuleType:
    """The package tracr.craft (bases and transformer blocks)."""
    try:
        import tracr.craft as package
        from tracr.craft import bases, transformers  # noqa: F401
    except ImportError as err:
        raise ExactLensError(f"{INSTALL_HINT} ({err})") from err
    return package

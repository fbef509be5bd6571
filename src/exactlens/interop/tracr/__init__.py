"""Compiled RASP programs (tracr; Lindner et al. 2023, "Tracr: Compiled Transformers as a Laboratory
for Interpretability") as exactlens constructions.

* :func:`compile_program`: a RASP program -> a :class:`CompiledProgram` (tracr's compiled model and
  the program graph it was compiled from);
* :func:`from_tracr`: a compiled model (or tracr's ``AssembledTransformerModel``) -> an
  :class:`~exactlens.model.ExactTransformer` with the same weights, residual labels and outputs;
* :class:`TracrTask`: the task a registered program answers, its targets from the program's RASP
  evaluation and its SOps as causal variables;
* :func:`register_program`: a user's program as the construction and task ``tracr-<name>``
  (tracr's library programs are registered by the plug-in ``tracr``, :mod:`.library`).

Importing this package does not import tracr or jax; using it does (``pip install 'exactlens[tracr]'``).
See docs/tracr.md.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "CompiledProgram", "TracrTask", "compile_program", "decode_outputs", "from_tracr", "program_names",
    "register_program",
]

_WHERE = {
    "CompiledProgram": "exactlens.interop.tracr.compile",
    "compile_program": "exactlens.interop.tracr.compile",
    "from_tracr": "exactlens.interop.tracr.convert",
    "decode_outputs": "exactlens.interop.tracr.convert",
    "TracrTask": "exactlens.interop.tracr.task",
    "register_program": "exactlens.interop.tracr.library",
    "program_names": "exactlens.interop.tracr.library",
}


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(_WHERE[name]), name)

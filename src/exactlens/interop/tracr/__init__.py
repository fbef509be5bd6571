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

from exactlens.lazy import lazy_names

__all__ = [
    "CompiledProgram", "TracrTask", "compile_program", "decode_outputs", "from_tracr", "program_names",
    "register_program",
]

_WHERE = {
    "CompiledProgram": "compile",
    "compile_program": "compile",
    "from_tracr": "convert",
    "decode_outputs": "convert",
    "TracrTask": "task",
    "register_program": "library",
    "program_names": "library",
}


__getattr__, __dir__ = lazy_names(__name__, _WHERE)

"""The registry of RASP programs and what is built from them, cached per process: the program (a
canonical copy), its graph with tracr's value sets, the compiled model. The task
(:class:`~exactlens.interop.tracr.TracrTask`) and the constructions read it; registering happens in
:mod:`exactlens.interop.tracr.library`."""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from exactlens.errors import ExactLensError
from exactlens.interop.tracr.compile import COMPILER_BOS, COMPILER_PAD, check_max_seq_len

PAPER = "Lindner et al. 2023 (tracr)"
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


@dataclass(frozen=True)
class ProgramSpec:
    """A registered RASP program (see :func:`register_program`)."""

    name: str
    make_program: Callable[..., Any]
    vocab: tuple[Any, ...]
    max_seq_len: int
    summary: str = ""
    domain: Callable[[list[Any]], bool] | None = None
    domain_doc: str = ""
    first_target: int = 0
    compiler_bos: str = COMPILER_BOS
    compiler_pad: str = COMPILER_PAD
    causal: bool = False

    def build_program(self, max_seq_len: int) -> Any:
        takes_length = "max_seq_len" in inspect.signature(self.make_program).parameters
        program = self.make_program(max_seq_len=max_seq_len) if takes_length else self.make_program()
        rasp = _rasp()
        if not isinstance(program, rasp.SOp):
            raise ExactLensError(f"the program maker of {self.name!r} returned {type(program).__name__}, "
                                 "not a RASP SOp")
        return program


PROGRAMS: dict[str, ProgramSpec] = {}
_programs: dict[tuple[str, int], Any] = {}
_graphs: dict[tuple[str, int], Any] = {}
_compiled: dict[tuple[str, int, float], Any] = {}


def _rasp() -> Any:
    from exactlens.interop.tracr import deps

    return deps.rasp()


def _lib() -> Any:
    from exactlens.interop.tracr import deps

    deps.compiler()  # the clear error where tracr is missing
    from tracr.compiler import lib

    return lib


# ---- registering ---------------------------------------------------------------------------


def program_spec(name: str) -> ProgramSpec:
    if name not in PROGRAMS:
        from exactlens.plugins import load_plugins

        load_plugins()
    if name not in PROGRAMS:
        raise ExactLensError(f"no RASP program {name!r} is registered; registered: {', '.join(sorted(PROGRAMS))}")
    return PROGRAMS[name]


def program_names() -> list[str]:
    from exactlens.plugins import load_plugins

    load_plugins()
    return sorted(PROGRAMS)


# ---- building, cached per process ------------------------------------------------------------


def program(name: str, max_seq_len: int) -> Any:
    """The registered program for this length: a canonical copy (exactlens.interop.tracr.program),
    built once per process, shared by the task and the compiled model (so their labels agree)."""
    from exactlens.interop.tracr.program import canonical_copy

    key = (name, check_max_seq_len(max_seq_len))
    if key not in _programs:
        _programs[key] = canonical_copy(program_spec(name).build_program(max_seq_len))
    return _programs[key]


def analysis(name: str, max_seq_len: int) -> Any:
    """The program's graph with tracr's value sets (no compilation)."""
    from exactlens.interop.tracr.compile import infer_graph

    key = (name, max_seq_len)
    if key not in _graphs:
        _graphs[key], _ = infer_graph(program(name, max_seq_len), program_spec(name).vocab, max_seq_len)
    return _graphs[key]


def compiled(name: str, max_seq_len: int, mlp_exactness: float = 100) -> Any:
    """The program compiled by tracr (a CompiledProgram), once per process and parameters."""
    from exactlens.interop.tracr.compile import compile_program

    spec = program_spec(name)
    key = (name, check_max_seq_len(max_seq_len), mlp_exactness)
    if key not in _compiled:
        _compiled[key] = compile_program(
            program(name, max_seq_len), spec.vocab, max_seq_len, compiler_bos=spec.compiler_bos,
            compiler_pad=spec.compiler_pad, causal=spec.causal, mlp_exactness=mlp_exactness, relabel=False,
            name=name)
    return _compiled[key]


# ---- tracr's library programs ------------------------------------------------------------------

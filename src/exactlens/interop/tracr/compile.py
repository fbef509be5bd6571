"""Compile a RASP program with tracr, keeping the program graph.

:func:`compile_program` runs tracr's compiler passes in the order of
``tracr.compiler.compiling.compile_rasp_to_model`` (static validation, graph extraction, basis
inference, craft blocks, layer allocation, assembly) and keeps what that function discards: the
graph, whose nodes say which craft block computes each SOp, and the craft model. The assembled model
is tracr's own (tests check it equals ``compile_rasp_to_model``'s, weight for weight).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from exactlens.errors import ExactLensError
from exactlens.interop.tracr import deps
from exactlens.interop.tracr.program import canonical_copy

COMPILER_BOS = "compiler_bos"  # tracr's default names of its special tokens
COMPILER_PAD = "compiler_pad"


@dataclass
class CompiledProgram:
    """A RASP program compiled by tracr, with its graph."""

    program: Any  # the RASP SOp that was compiled (a canonical copy unless relabel=False)
    vocab: tuple[Any, ...]  # the input values, in tracr's token order (its token embedding's rows)
    max_seq_len: int
    compiler_bos: str
    compiler_pad: str
    causal: bool
    mlp_exactness: float
    graph: Any  # networkx DiGraph of the expressions (tracr.compiler.nodes keys)
    sink: dict[str, Any]  # the program's node
    craft_model: Any  # tracr.craft.transformers.SeriesWithResiduals
    assembled: Any  # tracr.compiler.assemble.AssembledTransformerModel
    name: str | None = None  # the registered program's name (exactlens.interop.tracr.library)


def check_vocab(vocab: Iterable[Any], what: str = "vocab") -> list[Any]:
    """Input values: a non-empty collection of str, int, float or bool whose str() are distinct
    (exactlens names tokens by str())."""
    if isinstance(vocab, (str, bytes)) or not isinstance(vocab, Iterable):
        raise ExactLensError(f"{what} must be a collection of token values (e.g. {{'a', 'b'}}), got {vocab!r}")
    values = list(dict.fromkeys(vocab))
    if not values:
        raise ExactLensError(f"{what} is empty: give at least one token value")
    bad = [v for v in values if not isinstance(v, (str, int, float, bool)) or (isinstance(v, float)
                                                                              and not math.isfinite(v))]
    if bad:
        raise ExactLensError(f"{what}: token values must be str, int, bool or finite float, got {bad}")
    names = [str(v) for v in values]
    clashes = sorted({n for n in names if names.count(n) > 1})
    if clashes:
        raise ExactLensError(f"{what}: the values {clashes} name two tokens each (str() must tell tokens apart)")
    return values


def check_max_seq_len(max_seq_len: Any) -> int:
    if not isinstance(max_seq_len, int) or isinstance(max_seq_len, bool) or max_seq_len < 1:
        raise ExactLensError(f"max_seq_len must be an integer >= 1, got {max_seq_len!r}")
    return max_seq_len


def check_compile_size(max_seq_len: int, vocab_size: int) -> None:
    """Refuse, before tracr enumerates anything, a max_seq_len whose compiled model cannot fit: a
    program's MLP over two position-valued inputs (make_reverse's length - index) has one hidden unit
    per pair of values, ~s^2 for s = max_seq_len + vocab, over a residual stream of ~6 s dimensions,
    in float64 while tracr builds it: 8 * 6 s^3 bytes (measured d_model 6 s, d_mlp s^2 for reverse)."""
    from exactlens.resources import check_memory

    size = max_seq_len + vocab_size + 2
    check_memory(48 * float(size) ** 3, f"compiling a tracr program with max_seq_len={max_seq_len} (its largest "
                 f"MLP may have ~{size}^2 hidden units over a ~{6 * size}-dimensional residual stream)",
                 "choose a smaller max_seq_len")


def compile_program(
    program: Any,
    vocab: Iterable[Any],
    max_seq_len: int,
    *,
    compiler_bos: str = COMPILER_BOS,
    compiler_pad: str = COMPILER_PAD,
    causal: bool = False,
    mlp_exactness: float = 100,
    relabel: bool = True,
    name: str | None = None,
) -> CompiledProgram:
    """Compile ``program`` for inputs over ``vocab`` of up to ``max_seq_len`` tokens (the arguments of
    tracr's ``compile_rasp_to_model``). ``relabel``: compile a canonical copy of the program (labels
    that do not depend on what else the process built, :mod:`.program`)."""
    values = check_vocab(vocab)
    check_max_seq_len(max_seq_len)
    check_compile_size(max_seq_len, len(values))
    for token, role in ((compiler_bos, "compiler_bos"), (compiler_pad, "compiler_pad")):
        if not isinstance(token, str) or not token:
            raise ExactLensError(f"{role} must be a non-empty string, got {token!r}")
        if token in [str(v) for v in values]:
            raise ExactLensError(f"{role}={token!r} is also an input token; choose a name outside the vocab")
    if compiler_bos == compiler_pad:
        raise ExactLensError(f"compiler_bos and compiler_pad must differ, both are {compiler_bos!r}")
    if not (isinstance(mlp_exactness, (int, float)) and not isinstance(mlp_exactness, bool)
            and math.isfinite(mlp_exactness) and mlp_exactness > 0):
        raise ExactLensError(f"mlp_exactness must be a finite number > 0, got {mlp_exactness!r}")
    rasp = deps.rasp()
    compiler = deps.compiler()
    craft = deps.craft()
    if not isinstance(program, rasp.SOp):
        raise ExactLensError(f"a RASP program is an SOp (tracr.rasp.rasp.SOp), got {type(program).__name__}")
    if relabel:
        program = canonical_copy(program)
    what = f"RASP program {name or program.label}"
    unsupported = compiler.validating.static_validate(program)
    if unsupported:
        reasons = "; ".join(f"{e.expr.label}: {e.reason}" for e in unsupported)
        raise ExactLensError(f"{what} uses what tracr cannot compile: {reasons}")
    try:
        extracted = compiler.rasp_to_graph.extract_rasp_graph(program)
        graph, sources, sink = extracted.graph, extracted.sources, extracted.sink
        compiler.basis_inference.infer_bases(graph, sink, set(values), max_seq_len)
        bos_direction = craft.bases.BasisDirection(rasp.tokens.label, compiler_bos)
        compiler.expr_to_craft_graph.add_craft_components_to_rasp_graph(
            graph, bos_dir=bos_direction, mlp_exactness=mlp_exactness)
        craft_model = compiler.craft_graph_to_model.craft_graph_to_model(graph, sources)
        with zero_initializers():
            assembled = compiler.craft_model_to_transformer.craft_model_to_transformer(
                craft_model=craft_model, graph=graph, sink=sink, max_seq_len=max_seq_len, causal=causal,
                compiler_bos=compiler_bos, compiler_pad=compiler_pad)
    except (NotImplementedError, ValueError, TypeError, KeyError, AssertionError) as err:
        raise ExactLensError(f"tracr could not compile {what}: {type(err).__name__}: {err}") from err
    order = [v for v in assembled.input_encoder.encoding_map if v not in (compiler_bos, compiler_pad)]
    return CompiledProgram(program, tuple(order), max_seq_len, compiler_bos, compiler_pad, bool(causal),
                           mlp_exactness, graph, sink, craft_model, assembled, name)


RANDOM_INITIALIZERS = ("TruncatedNormal", "RandomNormal", "RandomUniform", "VarianceScaling")
"""haiku's random initializers, which tracr's assembly calls only for weights it then overwrites."""


@contextmanager
def zero_initializers() -> Iterator[None]:
    """While tracr assembles a model: haiku's random initializers give zeros (numpy) instead of random draws.
    tracr initializes the haiku model once to learn its parameters' shapes, sets every transformer weight to
    zero and writes the compiled ones; the embeddings are given explicitly. So the model is the same weight for
    weight (tests/interop/test_tracr.py compares it with ``compile_rasp_to_model``'s), without a jax random draw
    and an XLA compilation per weight shape, which took about two thirds of a program's compilation (tracr-sort
    2.7 -> 1.0 s of CPU, tracr-reverse 3.1 -> 1.0 s; 2026-11-28, docs/architecture.md)."""
    import haiku as hk
    import numpy as np

    classes = [getattr(hk.initializers, name) for name in RANDOM_INITIALIZERS]
    saved = [cls.__dict__["__call__"] for cls in classes]
    for cls in classes:
        cls.__call__ = lambda self, shape, dtype: np.zeros(shape, dtype)
    try:
        yield
    finally:
        for cls, call in zip(classes, saved, strict=True):
            cls.__call__ = call


def infer_graph(program: Any, vocab: Iterable[Any], max_seq_len: int) -> tuple[Any, dict[str, Any]]:
    """The program's graph with tracr's value sets and output bases (no craft blocks, no weights, no
    jax work): (graph, sink node). What a task needs to name its classes and variables."""
    values = check_vocab(vocab)
    check_max_seq_len(max_seq_len)
    from exactlens.resources import check_memory

    size = max_seq_len + len(values) + 2  # a value set of pairs of positions: ~size^2 Python objects of ~100 bytes
    check_memory(128 * float(size) ** 2, f"the value sets of a tracr program with max_seq_len={max_seq_len}",
                 "choose a smaller max_seq_len")
    compiler = deps.compiler()
    try:
        extracted = compiler.rasp_to_graph.extract_rasp_graph(program)
        compiler.basis_inference.infer_bases(extracted.graph, extracted.sink, set(values), max_seq_len)
    except (NotImplementedError, ValueError, TypeError, KeyError, AssertionError) as err:
        raise ExactLensError(f"tracr could not infer the value sets of {program.label}: {type(err).__name__}: "
                             f"{err}") from err
    return extracted.graph, extracted.sink

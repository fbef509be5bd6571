"""Registered RASP programs: tracr's library (``tracr.compiler.lib``) and the user's own.

Each program ``<name>`` becomes the construction and the task ``tracr-<name>``: the construction
compiles the program with tracr (once per process and parameters) and converts the model
(:func:`exactlens.interop.tracr.from_tracr`); the task (:class:`~exactlens.interop.tracr.TracrTask`)
evaluates the program. Registering imports neither tracr nor jax; building does.

The plug-in ``tracr`` (entry point ``exactlens.interop.tracr.library:register``) registers the
library programs (:func:`_library`) and the catalogue's (:mod:`.catalogue`); a user registers a
program with :func:`register_program`.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Sequence
from dataclasses import MISSING, fields
from typing import Any

from exactlens.errors import ExactLensError
from exactlens.interop.tracr.compile import check_max_seq_len, check_vocab
from exactlens.interop.tracr.programs import (  # noqa: F401 (re-exported: the registry lives there)
    NAME,
    PAPER,
    PROGRAMS,
    ProgramSpec,
    _lib,
    _rasp,
    analysis,
    compiled,
    program,
    program_names,
    program_spec,
)


def register_program(name: str, make_program: Callable[..., Any], vocab: Sequence[Any], max_seq_len: int,
                     **options: Any) -> ProgramSpec:
    """Register a RASP program as the construction and task ``tracr-<name>``.

    ``make_program``: a function returning the program (a RASP SOp), called with ``max_seq_len=`` if
    it takes that argument (e.g. ``make_sort``), else without arguments; called once per process and
    length. ``vocab``: the input token values (str, int, float or bool with distinct str()).
    ``max_seq_len``: the default longest input (the construction's parameter ``max_seq_len``).
    ``domain``: where the program is defined, a predicate on a word's values (e.g. distinct tokens for
    ``make_sort_unique``), described by ``domain_doc``; the task samples and enumerates only such words.
    ``first_target``: positions before it have no target (e.g. ``detect_pattern``'s None-padded
    start). ``compiler_bos``, ``compiler_pad``, ``causal``: as in tracr's ``compile_rasp_to_model``.
    ``kind``: "prediction" or "regression", declared so that listing needs no tracr. ``siit_defaults``: the
    training options ``exactlens train tracr-<name> --siit`` uses (a dict; the construction's ``siit_defaults``,
    as a paper preset's: docs/siit.md). These details are keywords: the optional fields of :class:`ProgramSpec`,
    ``kind`` and ``siit_defaults``. Nothing is compiled until the construction is built."""
    from exactlens import constructions, tasks
    from exactlens.constructions.registry import Construction

    defaults = {f.name: f.default for f in fields(ProgramSpec) if f.default is not MISSING}
    known = set(defaults) | {"kind", "siit_defaults"}
    if set(options) - known:
        raise ExactLensError(f"register_program has no option {', '.join(sorted(set(options) - known))}; its "
                             f"options: {', '.join(sorted(known))}")
    o = {**defaults, "kind": None, "siit_defaults": {}, **options}
    summary, domain, domain_doc, first_target = o["summary"], o["domain"], o["domain_doc"], o["first_target"]
    compiler_bos, compiler_pad, causal, kind = o["compiler_bos"], o["compiler_pad"], o["causal"], o["kind"]

    if not isinstance(name, str) or not NAME.match(name):
        raise ExactLensError(f"a program name is letters, digits, '_', '.' or '-' (not first), got {name!r}")
    if not callable(make_program):
        raise ExactLensError(f"make_program must be a function returning a RASP program, got {make_program!r}")
    if name in PROGRAMS:
        raise ExactLensError(f"a RASP program named {name!r} is already registered (as tracr-{name})")
    if not isinstance(o["siit_defaults"], dict) or not all(isinstance(k, str) for k in o["siit_defaults"]):
        raise ExactLensError(f"siit_defaults must be a dict of training options (name -> value), got "
                             f"{o['siit_defaults']!r:.80}")
    if domain is not None and not callable(domain):
        raise ExactLensError(f"domain must be None or a predicate on a word's values, got {domain!r}")
    if not isinstance(first_target, int) or isinstance(first_target, bool) or first_target < 0:
        raise ExactLensError(f"first_target must be an integer >= 0, got {first_target!r}")
    values = check_vocab(vocab)
    for token, role in ((compiler_bos, "compiler_bos"), (compiler_pad, "compiler_pad")):
        if not isinstance(token, str) or not token or token in [str(v) for v in values]:
            raise ExactLensError(f"{role} must be a non-empty string that is not an input token, got {token!r}")
    spec = ProgramSpec(name, make_program, tuple(values), check_max_seq_len(max_seq_len), summary, domain,
                       domain_doc, first_target, compiler_bos, compiler_pad, bool(causal))
    task_name = f"tracr-{name}"

    def task_factory(max_seq_len: int = spec.max_seq_len) -> Any:
        from exactlens.interop.tracr.task import TracrTask

        return TracrTask(name, max_seq_len)

    def build(max_seq_len: int = spec.max_seq_len, mlp_exactness: float = 100, dtype: str = "float32") -> Any:
        from exactlens.interop.tracr.convert import from_tracr

        return from_tracr(compiled(name, max_seq_len, mlp_exactness), dtype=dtype)

    # kind ("prediction" for a categorical output, "regression" for a numerical one) declared: listing the
    # task then needs neither tracr nor jax (checked against the task by plugins.check_declared_facts)
    if kind is not None and kind not in ("prediction", "regression"):
        raise ExactLensError(f"kind is 'prediction' (categorical output) or 'regression' (numerical), got {kind!r}")
    tasks.register(task_factory, name=task_name, kind=kind, min_length=1 if kind else None)
    constructions.register(Construction(
        task_name, task_name, build, PAPER, summary or f"the RASP program {name}, compiled by tracr",
        task_params=lambda p: {"max_seq_len": p["max_seq_len"]}, tags=("tracr",), max_length_param="max_seq_len",
        siit_defaults=dict(o["siit_defaults"]),
    ))
    PROGRAMS[name] = spec
    return spec


def _distinct(values: list[Any]) -> bool:
    return len(set(values)) == len(values)


LETTERS = ("a", "b", "c")


NUMERICAL = ("frac_prevs", "pair_balance")
"""The library programs with a numerical output (regression tasks); the others are categorical."""


def _library() -> list[dict[str, Any]]:
    """tracr.compiler.lib's programs with the vocabularies and lengths they are registered with."""

    def tokens() -> Any:
        return _rasp().tokens

    return [
        dict(name="length", make_program=lambda: _lib().make_length(), vocab=LETTERS, max_seq_len=5,
             summary="make_length: the length n at every position (SelectorWidth of an all-true selector)"),
        dict(name="frac_prevs", make_program=lambda: _lib().make_frac_prevs(tokens() == "x"),
             vocab=("x", "y", "z"), max_seq_len=5,
             summary="make_frac_prevs(tokens == 'x'): the fraction of 'x' among positions <= i (numerical)"),
        dict(name="pair_balance", make_program=lambda: _lib().make_pair_balance(tokens(), "(", ")"),
             vocab=("(", ")"), max_seq_len=6,
             summary="make_pair_balance: fraction of '(' minus fraction of ')' among positions <= i (numerical)"),
        dict(name="shuffle_dyck", make_program=lambda: _lib().make_shuffle_dyck(["()"]), vocab=("(", ")"),
             max_seq_len=6, summary="make_shuffle_dyck(['()']): True at every position iff the word is balanced "
             "(Dyck-1)"),
        dict(name="shuffle_dyck2", make_program=lambda: _lib().make_shuffle_dyck2(), vocab=("(", ")", "{", "}"),
             max_seq_len=4, summary="make_shuffle_dyck2: True at every position iff both bracket kinds are balanced "
             "(shuffle-Dyck-2)"),
        dict(name="hist", make_program=lambda: _lib().make_hist(), vocab=LETTERS, max_seq_len=5,
             summary="make_hist: how often the token at i occurs in the word"),
        dict(name="sort_unique", make_program=lambda: _lib().make_sort_unique(tokens(), tokens()),
             vocab=(1, 2, 3, 4, 5), max_seq_len=5, domain=_distinct, domain_doc="words of distinct tokens",
             summary="make_sort_unique(tokens, tokens): the tokens sorted ascending (distinct tokens only)"),
        dict(name="sort", make_program=lambda max_seq_len: _lib().make_sort(tokens(), tokens(), max_seq_len=max_seq_len,
                                                                            min_key=1),
             vocab=(1, 2, 3), max_seq_len=5,
             summary="make_sort(tokens, tokens, min_key=1): the tokens sorted ascending, ties by position"),
        dict(name="reverse", make_program=lambda: _lib().make_reverse(tokens()), vocab=LETTERS, max_seq_len=5,
             summary="make_reverse(tokens): the word reversed"),
        dict(name="sort_freq", make_program=lambda max_seq_len: _lib().make_sort_freq(max_seq_len),
             vocab=LETTERS, max_seq_len=5,
             summary="make_sort_freq: the tokens sorted by descending frequency, ties by position"),
        dict(name="count_less_freq", make_program=lambda: _lib().make_count_less_freq(2), vocab=LETTERS,
             max_seq_len=5, summary="make_count_less_freq(2): how many positions hold a token occurring at most "
             "twice"),
        dict(name="detect_pattern", make_program=lambda: _lib().detect_pattern(tokens(), "abc"), vocab=LETTERS,
             max_seq_len=5, first_target=2,
             summary="detect_pattern(tokens, 'abc'): True where 'abc' ends (positions 0 and 1 have no value)"),
    ]


SIIT_DEFAULTS: dict[str, dict[str, Any]] = {
    name: {"epochs": 300, "strings_per_epoch": 512, "batch_size": 128, "lr": 3e-3, "lr_schedule": "warmup_linear"}
    for name in ("hist", "count_token", "trend", "neighbour_sum", "count_greater")
}
"""The programs whose SIIT runs met the targets on the seeds measured (docs/siit.md "Per-task SIIT defaults";
trend, neighbour_sum, count_greater: "The catalogue's benchmark tasks", seeds 0 and 1): the measured settings (today
the shaped models' generic ones, at |w| 1..max_seq_len), pinned so that ``train tracr-NAME --siit`` keeps them."""


def register() -> None:
    """The plug-in ``tracr``: registers tracr's library programs and the catalogue's
    (:mod:`.catalogue`) where tracr is installed (found without importing it, or jax). Without tracr
    nothing is registered, so that listing and every other command work as before; the interop
    functions then raise the install hint."""
    from exactlens.interop.tracr.catalogue import catalogue

    if importlib.util.find_spec("tracr") is None:
        return
    for entry in _library() + catalogue():
        if entry["name"] not in PROGRAMS:
            register_program(**entry, kind="regression" if entry["name"] in NUMERICAL else "prediction",
                             siit_defaults=SIIT_DEFAULTS.get(entry["name"], {}))

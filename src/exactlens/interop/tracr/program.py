"""RASP expression graphs: a deterministic copy of a program, its SOps and their inputs.

tracr names every expression ``<name>_<id>`` with an id from one process-wide counter, so the same
program built twice (or after another one) gets other labels, and with them other residual labels.
:func:`canonical_copy` copies a program with ids 1, 2, ... in a fixed order (children before their
parents, in the order of ``children``), so that a registered program's model has the same residual
labels in every process. The copy evaluates exactly as the original (tests check it on every word).
"""

from __future__ import annotations

import copy
import itertools
from typing import Any

from exactlens.errors import ExactLensError
from exactlens.interop.tracr import deps


def child_fields(expr: Any) -> tuple[str, ...]:
    """The attributes that hold an expression's children, in the order of ``expr.children``."""
    rasp = deps.rasp()
    table = (
        (rasp.Map, ("inner",)),
        (rasp.SequenceMap, ("fst", "snd")),  # LinearSequenceMap too
        (rasp.Aggregate, ("selector", "sop")),
        (rasp.SelectorWidth, ("selector",)),
        (rasp.Select, ("keys", "queries")),
        (rasp.SelectorAnd, ("fst", "snd")),
        (rasp.SelectorOr, ("fst", "snd")),
        (rasp.SelectorNot, ("inner",)),
        (rasp.Full, ()),
        (rasp.ConstantSOp, ()),
        (rasp.ConstantSelector, ()),
        (rasp.TokensType, ()),
        (rasp.IndicesType, ()),
        (rasp.LengthType, ()),
    )
    for cls, fields in table:
        if isinstance(expr, cls):
            if [getattr(expr, f) for f in fields] != list(expr.children):
                raise ExactLensError(f"RASP expression {expr.label} ({type(expr).__name__}) has children that are "
                                     f"not its fields {fields}; this tracr version is not supported")
            return fields
    raise ExactLensError(f"RASP expression {expr!r} of type {type(expr).__name__} is not supported; supported: "
                         + ", ".join(cls.__name__ for cls, _ in table))


def is_primitive(expr: Any) -> bool:
    rasp = deps.rasp()
    return isinstance(expr, (rasp.TokensType, rasp.IndicesType, rasp.LengthType))


def postorder(program: Any) -> list[Any]:
    """Every expression of the program once, children before parents (depth first, in the order of
    ``children``), the program last. Expressions are told apart by identity."""
    order: list[Any] = []
    seen: set[int] = set()
    stack: list[tuple[Any, bool]] = [(program, False)]
    while stack:
        expr, expanded = stack.pop()
        if expanded:
            order.append(expr)
            continue
        if id(expr) in seen:
            continue
        seen.add(id(expr))
        stack.append((expr, True))
        for child in reversed([getattr(expr, f) for f in child_fields(expr)]):
            if id(child) not in seen:
                stack.append((child, False))
    return order  # a DAG: every child is finished before the parent that was expanded first


def canonical_copy(program: Any) -> Any:
    """A copy of the program whose expressions have the ids 1, 2, ... in post-order (module docstring).
    The primitives tokens, indices and length are shared (their labels have no id)."""
    rasp = deps.rasp()
    if not isinstance(program, rasp.SOp):
        raise ExactLensError(f"a RASP program is an SOp (tracr.rasp.rasp.SOp), got {type(program).__name__}")
    ids = itertools.count(1)
    copies: dict[int, Any] = {}
    for expr in postorder(program):
        if is_primitive(expr):
            copies[id(expr)] = expr
            continue
        clone = copy.copy(expr)
        for field in child_fields(expr):
            setattr(clone, field, copies[id(getattr(expr, field))])
        clone.annotations = dict(expr.annotations)  # annotations that point at the clone
        clone.__dict__["unique_id"] = next(ids)  # tracr's cached_property, set before anyone reads it
        copies[id(expr)] = clone
    return copies[id(program)]


def sops(program: Any) -> list[Any]:
    """The program's SOps (no selectors), children first, the program last."""
    rasp = deps.rasp()
    return [e for e in postorder(program) if isinstance(e, rasp.SOp)]


def selector_inputs(selector: Any) -> list[tuple[str, Any]]:
    """(role, SOp) pairs a selector reads: ("key", keys) and ("query", queries) of every Select in it."""
    rasp = deps.rasp()
    if isinstance(selector, rasp.Select):
        return [("key", selector.keys), ("query", selector.queries)]
    out: list[tuple[str, Any]] = []
    for field in child_fields(selector):
        out += selector_inputs(getattr(selector, field))
    return out


def sop_inputs(sop: Any) -> list[tuple[str, Any]]:
    """(role, SOp) pairs an SOp is computed from: a Map's "input"; a SequenceMap's "fst" and "snd";
    an Aggregate's "value" and its selector's "key" and "query"; a SelectorWidth's "key" and "query"."""
    rasp = deps.rasp()
    if isinstance(sop, rasp.Map):
        return [("input", sop.inner)]
    if isinstance(sop, rasp.SequenceMap):
        return [("fst", sop.fst), ("snd", sop.snd)]
    if isinstance(sop, rasp.Aggregate):
        return [("value", sop.sop)] + selector_inputs(sop.selector)
    if isinstance(sop, rasp.SelectorWidth):
        return selector_inputs(sop.selector)
    child_fields(sop)  # a supported leaf (or a clear error)
    return []

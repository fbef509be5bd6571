"""The diff's parts, each declared once in one module of this package: its name, what it needs, the JSON
sections and summary keys it adds, its function ``run(context, request) -> Done``, and how its result is
printed (``text``) and shown on the diff page (``page``) — see :class:`~.base.Part`.

Two kinds of steps: the *parts* a user asks for (``--parts``, ``parts=``: :data:`PARTS`), and the
*shared inputs* several parts read (``shared=True``, module :mod:`.shared`: the words both models ran, the
probe fits, the head matching), computed only when a chosen part needs them and writing no section of
their own. :func:`plan` resolves the order from the needs (dependencies first, then ``order``); the
orchestrator (:mod:`exactlens.analysis.diff.orchestrator`) runs the plan and checks each step adds only
what it declares; ``exactlens diff``'s text and the diff page (exactlens.viz.diff_page) show each part
through its own ``text`` and ``page``.

Adding a part is one module here that defines ``PART = Part(...)`` (a module may define ``STEPS``, a
tuple of parts): every module of the package is collected at import. A plug-in adds one with
:func:`register_part` in its ``register()``; it runs when asked for by name (``--parts
behaviour,NAME``), the default being :data:`PARTS`.

Light at import (no torch): the command line reads :data:`PARTS` for ``--parts``; each step imports
its module when it runs.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Sequence

from exactlens.analysis.diff.parts.base import Done, Part, mean_of
from exactlens.errors import ExactLensError
from exactlens.plugins import load_plugins

__all__ = ["Done", "PARTS", "Part", "STEPS", "mean_of", "part_names", "plan", "register_part", "steps"]


def _collect() -> tuple[Part, ...]:
    found: list[Part] = []
    for info in pkgutil.iter_modules(__path__):
        if info.name == "base":
            continue
        module = importlib.import_module(f"{__name__}.{info.name}")
        found += [module.PART] if hasattr(module, "PART") else list(module.STEPS)
    return tuple(sorted(found, key=lambda step: step.order))


STEPS: tuple[Part, ...] = _collect()
"""exactlens's own steps (shared inputs and parts), in their ``order``."""

PARTS: tuple[str, ...] = tuple(step.name for step in STEPS if not step.shared)
"""The parts a user may ask for and the default, in the order the JSON lists them (plug-ins' parts: see
:func:`part_names`)."""

_REGISTERED: dict[str, Part] = {}


def register_part(part: Part) -> None:
    """Add a plug-in's part (or shared step); its name must be new and its needs declared steps."""
    if not isinstance(part, Part):
        raise ExactLensError(f"register_part takes a Part, got {type(part).__name__}")
    taken = {step.name for step in STEPS} | set(_REGISTERED)
    if part.name in taken:
        raise ExactLensError(f"a diff step named {part.name!r} exists already; the steps: {', '.join(sorted(taken))}")
    _REGISTERED[part.name] = part


def steps() -> tuple[Part, ...]:
    """Every step: exactlens's and the installed plug-ins', in their ``order`` (ties: exactlens's first)."""
    load_plugins()
    return tuple(sorted(STEPS + tuple(_REGISTERED.values()), key=lambda step: step.order))


def part_names() -> tuple[str, ...]:
    """The parts a user may ask for, plug-ins' included (the choices of ``--parts``)."""
    return tuple(step.name for step in steps() if not step.shared)


def plan(chosen: Sequence[str], all_steps: Sequence[Part] | None = None) -> list[Part]:
    """The steps to run for the ``chosen`` parts: those and everything they need, each after its needs
    (ties in ``order``)."""
    all_steps = steps() if all_steps is None else all_steps
    by_name = {step.name: step for step in all_steps}
    wanted: set[str] = set()
    todo = list(chosen)
    while todo:
        name = todo.pop()
        if name not in by_name:
            raise ExactLensError(f"unknown diff step {name!r}; the steps: {', '.join(by_name)}")
        if name not in wanted:
            wanted.add(name)
            todo += by_name[name].needs
    order: list[Part] = []
    pending = [step for step in all_steps if step.name in wanted]
    while pending:
        ready = next((s for s in pending if all(n in {o.name for o in order} for n in s.needs)), None)
        if ready is None:
            raise ExactLensError(f"diff steps need each other in a circle: {', '.join(s.name for s in pending)}")
        order.append(ready)
        pending.remove(ready)
    return order

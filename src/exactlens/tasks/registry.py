"""Tasks by name: the general ones here, paper-specific ones registered by plug-ins."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from exactlens.errors import ExactLensError
from exactlens.plugins import Lazy, Registry, lazy

if TYPE_CHECKING:
    from exactlens.tasks.base import Task
    from exactlens.tasks.decisions import Reader

TaskFactory = Callable[..., "Task"]


def _facts(factory: TaskFactory) -> dict[str, Any]:
    """What ``exactlens list`` shows of a task: the kind and shortest |w| of its default instance."""
    task = factory()
    return {"kind": task.kind, "min_length": task.min_length}


def _accept(name: str, factory: Any) -> None:
    if not callable(factory):
        raise ExactLensError(f"task {name!r} must be a Task subclass or a factory, got {type(factory).__name__}")


# Tasks are checked against their declared facts by plugins.check_declared_facts (tests), not on
# every import: a task's default instance may be expensive (a corpus).
TASKS: dict[str, TaskFactory] = Registry("tasks", describe=_facts, accept=_accept, check_info=False)


def register(factory: TaskFactory | Lazy, name: str | None = None, *, kind: str | None = None,
             min_length: int | None = None) -> TaskFactory | Lazy:
    """Make a task available by name: a Task subclass (its ``name``) or a factory
    ``(**params) -> Task`` with an explicit name. Usable as a class decorator.

    What ``exactlens list`` shows of a task, the ``kind`` and ``min_length`` of its default instance,
    is read from the task itself unless declared: ``lazy("module:Class", kind=..., min_length=...)``
    with ``name`` defers importing the task, and ``kind=``/``min_length=`` declare them for a factory
    (listing then never calls it; plugins.check_declared_facts compares them with the task)."""
    key = name or getattr(factory, "name", None)
    if not key or not isinstance(key, str):
        raise ExactLensError("register a Task subclass with a name, or give name=...")
    facts = factory.info if isinstance(factory, Lazy) else {"kind": kind, "min_length": min_length}
    declared = {k for k, v in facts.items() if v is not None}
    if declared not in (set(), {"kind", "min_length"}) or (isinstance(factory, Lazy) and not declared):
        raise ExactLensError(f"task {key!r}: declare both kind and min_length (its default instance's), or neither "
                             "(a lazily registered task declares both)")
    if TASKS.peek(key) not in (None, factory):
        raise ExactLensError(f"a different task named {key!r} is already registered")
    TASKS[key] = factory
    if declared and not isinstance(factory, Lazy):
        TASKS.declare(key, facts)
    return factory


_BUILTIN = (
    ("parity", "binary:Parity", "membership", 0),
    ("first", "binary:First", "membership", 0),
    ("one", "binary:One", "membership", 0),
    ("palindrome", "palindrome:Palindrome", "membership", 0),
    ("dyck", "dyck:Dyck", "membership", 0),
    ("majority", "majority:Majority", "classification", 1),
    ("induction-recent", "induction:InductionRecent", "prediction", 1),
    ("induction-frequent", "induction:InductionFrequent", "prediction", 1),
)
for _name, _where, _kind, _min_length in _BUILTIN:
    register(lazy(f"exactlens.tasks.{_where}", kind=_kind, min_length=_min_length), name=_name)


def info(name: str) -> dict[str, Any]:
    """{"kind", "min_length"} of a task's default instance, without importing a lazily registered task."""
    from exactlens.plugins import load_plugins

    load_plugins()
    if name not in TASKS:
        raise ExactLensError(f"unknown task {name!r}; known: {', '.join(sorted(TASKS))}")
    return TASKS.info(name)


def names() -> list[str]:
    from exactlens.plugins import load_plugins

    load_plugins()
    return sorted(TASKS)


def get(name: str, **params: Any) -> Task:
    """A task by name; params go to its constructor (e.g. num_classes for majority)."""
    from exactlens.plugins import load_plugins

    load_plugins()
    if name not in TASKS:
        raise ExactLensError(f"unknown task {name!r}; known: {', '.join(sorted(TASKS))}")
    factory = TASKS[name]
    allowed = set(inspect.signature(factory).parameters) - {"self"}
    unknown = sorted(set(params) - allowed)
    if unknown:
        raise ExactLensError(f"task {name!r} takes the parameters {sorted(allowed)}, not {unknown}")
    return factory(**params)


def from_spec(spec: dict[str, Any]) -> Task:
    """The task a model's config records (ExactConfig.task: {"name", "params"})."""
    if not isinstance(spec, dict) or "name" not in spec:
        raise ExactLensError(f"a task spec is a dict with 'name' (and 'params'), got {spec!r}")
    task = get(spec["name"], **spec.get("params", {}))
    if "kind" in spec and spec["kind"] != task.kind:
        raise ExactLensError(f"task {spec['name']!r} is a {task.kind} task, but the spec says {spec['kind']!r}")
    return task


def of_model(model: Any) -> Task:
    """The task a model records (cfg.task), or a clear error when it records none."""
    spec = getattr(getattr(model, "cfg", None), "task", None)
    if spec is None:
        name = getattr(getattr(model, "cfg", None), "model_name", type(model).__name__)
        raise ExactLensError(
            f"model {name!r} records no task (cfg.task is None); give the task explicitly "
            "(e.g. exactlens.tasks.get('parity')) or set model.cfg.task = task.spec()"
        )
    return from_spec(spec)


def reader(model: Any, task: Task | None = None) -> Reader:
    """How to read a model's outputs: its task (cfg.task, or the one given) and its decision rule
    (cfg.decision_rule, or the kind's standard one)."""
    from exactlens.tasks.decisions import Reader, decision_rule

    task = task if task is not None else of_model(model)
    name = getattr(getattr(model, "cfg", None), "decision_rule", None)
    return Reader(task, decision_rule(name) if name else None)

"""Tasks by name: the general ones here, paper-specific ones registered by plug-ins."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from exactlens.errors import ExactLensError
from exactlens.plugins import Registry
from exactlens.tasks.base import Task
from exactlens.tasks.binary import First, One, Parity
from exactlens.tasks.decisions import DecisionRule, Reader, decision_rule
from exactlens.tasks.dyck import Dyck
from exactlens.tasks.induction import InductionFrequent, InductionRecent
from exactlens.tasks.majority import Majority
from exactlens.tasks.palindrome import Palindrome

TaskFactory = Callable[..., Task]

TASKS: dict[str, TaskFactory] = Registry()


def register(factory: TaskFactory, name: str | None = None) -> TaskFactory:
    """Make a task available by name: a Task subclass (its ``name``) or a factory
    ``(**params) -> Task`` with an explicit name. Usable as a class decorator."""
    key = name or getattr(factory, "name", None)
    if not key or not isinstance(key, str):
        raise ExactLensError("register a Task subclass with a name, or give name=...")
    if TASKS.peek(key) not in (None, factory):
        raise ExactLensError(f"a different task named {key!r} is already registered")
    TASKS[key] = factory
    return factory


for _builtin in (Parity, First, One, Palindrome, Dyck, Majority, InductionRecent, InductionFrequent):
    register(_builtin)


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
    task = task if task is not None else of_model(model)
    name = getattr(getattr(model, "cfg", None), "decision_rule", None)
    rule: DecisionRule | None = decision_rule(name) if name else None
    return Reader(task, rule)

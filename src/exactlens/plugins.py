"""Plug-ins: packages that add tasks, constructions, decision rules, training presets, report
sections or command-line verbs to exactlens.

A plug-in is declared in its package's ``pyproject.toml`` under the entry-point group
``exactlens.plugins``::

    [project.entry-points."exactlens.plugins"]
    my_paper = "my_package.exactlens_plugin:register"

The object named there is a function without arguments that registers what the package adds
through exactlens's public registries (``exactlens.tasks.register``,
``exactlens.constructions.register``, ``exactlens.tasks.register_decision_rule``,
``exactlens.train.register_preset``, ``exactlens.viz.register_section``,
``exactlens.verbs.register_verb``). exactlens's own papers are plug-ins of this kind
(``exactlens.papers.*``); the core never imports them.

Plug-ins load once, the first time any registry is read. A plug-in that fails to load is an
error naming it (a half-registered plug-in would give confusing answers later).

Registering is meant to be cheap: ``exactlens --help`` and ``exactlens list`` load every plug-in and
must not wait for torch. An entry may therefore be registered by where it lives,
``lazy("package.module:attribute", **info)``: the module is imported the first time the entry itself
is read (``REGISTRY[name]``), while ``info`` (the facts ``exactlens list`` shows: a task's kind, a
preset's paper and summary) is read without importing anything. A construction is cheap already when
its ``build`` is such a "module:function" string and it declares its ``parameters``
(exactlens.constructions.Construction). :func:`check_declared_facts` imports every lazy entry and
compares what was declared with what it is (tests call it).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from typing import Any

from exactlens.errors import ExactLensError

GROUP = "exactlens.plugins"

_state: dict = {"loaded": False, "loading": False, "failure": None}
_loaded: list[str] = []


def load_plugins() -> list[str]:
    """Load every installed plug-in (once); return their entry-point names in load order.

    A plug-in that fails makes this call and every later one raise the same error (naming it):
    the plug-ins loaded before it stay loaded and are not run twice."""
    if _state["failure"] is not None:
        raise ExactLensError(_state["failure"])
    if _state["loaded"] or _state["loading"]:
        return list(_loaded)
    _state["loading"] = True
    try:
        for entry in sorted(entry_points(group=GROUP), key=lambda e: e.name):
            if entry.name in _loaded:
                continue
            try:
                register = entry.load()
                register()
            except Exception as err:
                _state["failure"] = (
                    f"the exactlens plug-in {entry.name!r} ({entry.value}) failed to load: "
                    f"{type(err).__name__}: {err}"
                )
                raise ExactLensError(_state["failure"]) from err
            _loaded.append(entry.name)
        _state["loaded"] = True
    finally:
        _state["loading"] = False
    return list(_loaded)


def loaded_plugins() -> list[str]:
    """Names of the plug-ins loaded so far."""
    return list(_loaded)


def import_target(target: str) -> Any:
    """The object a "package.module:attribute" string names (the attribute may be dotted)."""
    module, sep, attribute = target.partition(":")
    if not sep or not module or not attribute:
        raise ExactLensError(f"an import target is 'package.module:attribute', got {target!r}")
    obj: Any = importlib.import_module(module)
    for part in attribute.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise ExactLensError(f"{target!r}: {module} has no attribute {attribute!r}") from None
    return obj


@dataclass(frozen=True)
class Lazy:
    """A registry entry named by where it lives, imported when the entry is first read; ``info``: the
    light facts listed without importing it (see the module docstring)."""

    target: str  # "package.module:attribute"
    info: Mapping[str, Any] = field(default_factory=dict)

    def __hash__(self) -> int:
        return hash(self.target)

    def load(self) -> Any:
        return import_target(self.target)


def lazy(target: str, **info: Any) -> Lazy:
    """``lazy("my_package.presets:MY_PRESET", task="parity", paper="...", summary="...")``: register
    this instead of the object itself to keep registering free of heavy imports."""
    if not isinstance(target, str):
        raise ExactLensError(f"lazy takes an import target 'package.module:attribute', got {target!r}")
    return Lazy(target, dict(info))


_REGISTRIES: list[Registry] = []


class Registry(dict):
    """A name -> entry dict that loads the plug-ins before it is read, so that a registry seen from
    outside (``exactlens.constructions.REGISTRY``, ``exactlens.train.PRESETS``, ...) always lists what
    the installed plug-ins add. Writing (registering) does not load anything.

    An entry may be :class:`Lazy`: reading it (``[name]``, ``get``, ``values``, ``items``) imports it and
    keeps the object, after ``accept`` (the registry's check of what it holds, e.g. "a Preset") and, unless
    ``check_info`` is off, a comparison of the declared ``info`` with ``describe(entry)``. ``info(name)``
    gives those facts without importing (``describe`` for an entry that is loaded already)."""

    def __init__(self, what: str = "entries", describe: Callable[[Any], Mapping[str, Any]] | None = None,
                 accept: Callable[[str, Any], None] | None = None, check_info: bool = True):
        super().__init__()
        self.what = what
        self._declared: dict[Any, dict[str, Any]] = {}  # facts declared for entries registered as objects
        self._was_lazy: set[Any] = set()  # entries registered lazily and imported since (check_facts still lists them)
        self._describe = describe
        self._accept = accept
        self._check_info = check_info
        _REGISTRIES.append(self)

    def _load(self) -> None:
        load_plugins()

    def peek(self, key):
        """The entry under key (lazy or not), or None, without loading plug-ins or imports (for registering)."""
        return dict.get(self, key)

    def _resolve(self, key, value):
        if not isinstance(value, Lazy):
            return value
        entry = value.load()
        if self._accept is not None:
            self._accept(key, entry)
        if self._check_info:
            self._compare(key, value.info, entry)
        if value.info:
            self._declared[key] = dict(value.info)  # kept: info() answers the same before and after the import
        self._was_lazy.add(key)
        dict.__setitem__(self, key, entry)
        return entry

    def _compare(self, key, declared: Mapping[str, Any] | None, entry) -> None:
        if self._describe is None or not declared:
            return
        actual = self._describe(entry)
        wrong = {k: (v, actual.get(k)) for k, v in declared.items() if actual.get(k) != v}
        if wrong:
            detail = "; ".join(f"{k}: registered {a!r}, is {b!r}" for k, (a, b) in wrong.items())
            raise ExactLensError(f"{self.what}: {key!r} was registered with facts that differ from the object's: "
                                 f"{detail}")

    def declare(self, key, info: Mapping[str, Any]) -> None:
        """Facts of an entry registered as an object (not lazily) that ``info`` gives without using it."""
        self._declared[key] = dict(info)

    def _declared_info(self, key) -> dict[str, Any] | None:
        value = dict.get(self, key)
        if isinstance(value, Lazy) and value.info:
            return dict(value.info)
        return dict(self._declared[key]) if key in self._declared else None

    def info(self, key) -> dict[str, Any]:
        """The light facts of an entry: what was declared (lazily or with ``declare``), else ``describe(entry)``."""
        self._load()
        value = super().__getitem__(key)
        declared = self._declared_info(key)
        if declared is not None:
            return declared
        if isinstance(value, Lazy):
            return {}
        return dict(self._describe(value)) if self._describe is not None else {}

    def is_loaded(self, key) -> bool:
        """Whether the entry is there and imported (not a Lazy waiting to be)."""
        self._load()
        return super().__contains__(key) and not isinstance(dict.get(self, key), Lazy)

    def check_facts(self) -> list[str]:
        """Import every lazy entry and compare every declared fact with ``describe`` of its entry
        (whatever ``check_info`` says); return the names checked."""
        self._load()
        names = [k for k, v in dict.items(self) if isinstance(v, Lazy) or k in self._declared or k in self._was_lazy]
        for key in names:
            declared = self._declared_info(key)
            self._compare(key, declared, self._resolve(key, dict.get(self, key)))
        return names

    def __getitem__(self, key):
        self._load()
        return self._resolve(key, super().__getitem__(key))

    def __contains__(self, key) -> bool:
        self._load()
        return super().__contains__(key)

    def __iter__(self):
        self._load()
        return super().__iter__()

    def __len__(self) -> int:
        self._load()
        return super().__len__()

    def get(self, key, default=None):
        self._load()
        return self._resolve(key, super().__getitem__(key)) if super().__contains__(key) else default

    def keys(self):
        self._load()
        return super().keys()

    def _resolve_all(self) -> None:
        for key, value in list(dict.items(self)):
            self._resolve(key, value)

    def values(self):
        self._load()
        self._resolve_all()
        return super().values()

    def items(self):
        self._load()
        self._resolve_all()
        return super().items()

    def copy(self) -> dict:
        self._load()
        self._resolve_all()
        return dict(super().items())

    def __repr__(self) -> str:
        self._load()
        self._resolve_all()
        return super().__repr__()

    def __eq__(self, other) -> bool:
        self._load()
        self._resolve_all()
        return super().__eq__(other)

    __hash__ = None


def check_declared_facts() -> dict[str, list[str]]:
    """Import every lazily registered entry of every registry and compare the facts registered with it
    (``lazy(..., **info)``, or e.g. ``tasks.register(factory, name, kind=..., min_length=...)``) with the
    object's own; an ExactLensError names the first that differs. Returns the names checked per registry
    (a plug-in's tests can call this)."""
    load_plugins()
    return {r.what: r.check_facts() for r in _REGISTRIES}

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
``exactlens.cli.register_verb``). exactlens's own papers are plug-ins of this kind
(``exactlens.papers.*``); the core never imports them.

Plug-ins load once, the first time any registry is read. A plug-in that fails to load is an
error naming it (a half-registered plug-in would give confusing answers later).
"""

from __future__ import annotations

from importlib.metadata import entry_points

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


class Registry(dict):
    """A name -> entry dict that loads the plug-ins before it is read, so that a registry seen from
    outside (``exactlens.constructions.REGISTRY``, ``exactlens.train.PRESETS``, ...) always lists what
    the installed plug-ins add. Writing (registering) does not load anything."""

    def _load(self) -> None:
        load_plugins()

    def peek(self, key):
        """The entry under key, or None, without loading plug-ins (for registering)."""
        return dict.get(self, key)

    def __getitem__(self, key):
        self._load()
        return super().__getitem__(key)

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
        return super().get(key, default)

    def keys(self):
        self._load()
        return super().keys()

    def values(self):
        self._load()
        return super().values()

    def items(self):
        self._load()
        return super().items()

    def copy(self) -> dict:
        self._load()
        return dict(super().items())

    def __repr__(self) -> str:
        self._load()
        return super().__repr__()

    def __eq__(self, other) -> bool:
        self._load()
        return super().__eq__(other)

    __hash__ = None

"""The training registries, importable without torch: paper presets by name and per-task training
defaults of models shaped like constructions. Plug-ins register into them (exactlens.train re-exports
``register_preset`` and ``register_task_defaults``); a preset may be registered lazily,
``register_preset(lazy("module:PRESET", task=..., paper=..., summary=...), name=...)``, so that
``exactlens list`` shows it without importing its module."""

from __future__ import annotations

from typing import Any

from exactlens.errors import ExactLensError
from exactlens.plugins import Lazy, Registry

PRESET_FACTS = ("task", "paper", "summary")


def _preset_facts(preset: Any) -> dict[str, Any]:
    return {"task": preset.task, "paper": preset.paper, "summary": preset.summary}


def _is_preset(obj: Any) -> bool:
    """A Preset (exactlens.train.presets), recognised by its fields: this module imports no preset module (presets
    re-exports this registry, so importing it here, even for annotations, would close a circle)."""
    return type(obj).__name__ == "Preset" and all(hasattr(obj, f) for f in ("name", *PRESET_FACTS, "spec"))


def _accept_preset(name: str, preset: Any) -> None:
    if not _is_preset(preset) or preset.name != name:
        raise ExactLensError(f"training preset {name!r} must be a Preset named {name!r}, got a "
                             f"{type(preset).__name__} named {getattr(preset, 'name', None)!r}")


# The declared facts only feed the listing: tests compare them with the presets
# (plugins.check_declared_facts); using a preset does not fail over a summary that drifted.
PRESETS: dict[str, Any] = Registry("training presets", describe=_preset_facts, accept=_accept_preset,
                                      check_info=False)


def register_preset(preset: Any, name: str | None = None) -> Any:
    """Add a training preset (``exactlens train NAME``): a Preset, or ``lazy("module:PRESET", task=...,
    paper=..., summary=...)`` with ``name`` (checked against the preset when it is imported)."""
    from exactlens.plugins import Lazy

    if isinstance(preset, Lazy):
        if not name or sorted(preset.info) != sorted(PRESET_FACTS):
            raise ExactLensError(f"a preset registered lazily needs name=... and declares {', '.join(PRESET_FACTS)}")
        key = name
    else:
        if not _is_preset(preset):
            raise ExactLensError(f"register_preset takes a Preset, got {type(preset).__name__}")
        key = preset.name
    if PRESETS.peek(key) not in (None, preset):
        raise ExactLensError(f"a training preset named {key!r} is already registered")
    PRESETS[key] = preset
    return preset


def preset_names() -> list[str]:
    """The registered (paper) presets; every construction name trains too (construction_names)."""
    from exactlens.plugins import load_plugins

    load_plugins()
    return sorted(PRESETS)


def _accept_defaults(task: str, options: Any) -> None:
    if not isinstance(options, dict):
        raise ExactLensError(f"training defaults of task {task!r} must be a dict of options, got "
                             f"{type(options).__name__}")


TASK_DEFAULTS: dict[str, dict[str, Any]] = Registry("task training defaults", accept=_accept_defaults)


def register_task_defaults(task: str, options: dict[str, Any] | Lazy) -> None:
    """Training settings (generic options of exactlens.train.presets.OPTION_DOCS) for models of
    ``task`` shaped like a construction; a plug-in registers them for the tasks it brings (a dict, or
    ``lazy("module:SETTINGS")``)."""
    if not isinstance(options, (dict, Lazy)):
        raise ExactLensError(f"register_task_defaults takes a dict of options, got {type(options).__name__}")
    if TASK_DEFAULTS.peek(task) not in (None, options):
        raise ExactLensError(f"training defaults for task {task!r} are already registered")
    TASK_DEFAULTS[task] = dict(options) if isinstance(options, dict) else options


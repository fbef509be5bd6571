"""Training comparable models: presets (a task, an architecture, settings) and one loop.

    from exactlens.train import train, train_many, PRESETS
    run = train("first", epochs=50, seed=0)               # run.model, run.history, run.checkpoint
    run = train("first", out="runs/first", scaled=True)   # + checkpoint and history.jsonl
    runs = train_many("first", seeds=range(10), epochs=50)  # 10 runs trained together

Presets come from plug-ins (exactlens's papers register theirs); ``register_preset`` adds one.
Generic options are declared once in exactlens.train.options.TrainOptions (their meaning:
OPTION_DOCS); a preset overrides their defaults and adds its own (its ``options``).
"""

import sys

from exactlens.callable_package import make_callable
from exactlens.lazy import lazy_names
from exactlens.train.registry import PRESETS, preset_names, register_preset, register_task_defaults

_WHERE = {  # imported when first used: the registries above need no torch (``exactlens list``)
    "HISTORY_FIELDS": "loop", "KIND_FIELDS": "loop", "TrainRun": "loop", "evaluate": "loop", "fit": "loop",
    "fit_into": "loop", "train": "loop", "train_many": "loop", "Metric": "metrics", "OPTION_DOCS": "options",
    "TrainOptions": "options", "Preset": "presets", "TrainSpec": "presets", "get_preset": "presets",
}

__all__ = [
    "HISTORY_FIELDS", "KIND_FIELDS", "Metric", "OPTION_DOCS", "PRESETS", "Preset", "TrainOptions", "TrainRun",
    "TrainSpec", "evaluate", "fit", "fit_into", "get_preset", "preset_names", "register_preset",
    "register_task_defaults", "train", "train_many",
]


__getattr__, __dir__ = lazy_names(__name__, _WHERE, submodules=True)


make_callable(sys.modules[__name__], "train")  # el.train(...) runs the verb (found in the registry)

"""Training comparable models: presets (a task, an architecture, settings) and one loop.

    from exactlens.train import train, train_many, PRESETS
    run = train("first", epochs=50, seed=0)               # run.model, run.history, run.checkpoint
    run = train("first", out="runs/first", scaled=True)   # + checkpoint and history.jsonl
    runs = train_many("first", seeds=range(10), epochs=50)  # 10 runs trained together

Presets come from plug-ins (exactlens's papers register theirs); ``register_preset`` adds one.
Generic options and their meaning: exactlens.train.presets.OPTION_DOCS; a preset's own: its
``options``.
"""

import sys

from exactlens.callable_package import make_callable
from exactlens.train.loop import HISTORY_FIELDS, KIND_FIELDS, TrainRun, evaluate, fit, fit_into, train, train_many
from exactlens.train.metrics import Metric
from exactlens.train.presets import (
    OPTION_DOCS,
    PRESETS,
    Preset,
    TrainSpec,
    get_preset,
    preset_names,
    register_preset,
)
from exactlens.train.shaped import register_task_defaults

__all__ = [
    "HISTORY_FIELDS", "KIND_FIELDS", "OPTION_DOCS", "PRESETS", "Metric", "Preset", "TrainRun", "TrainSpec", "evaluate",
    "fit", "fit_into", "get_preset", "preset_names", "register_preset", "register_task_defaults", "train",
    "train_many",
]

make_callable(sys.modules[__name__], "exactlens.api:train")  # el.train(...) runs the API verb

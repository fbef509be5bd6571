"""Training comparable models with the papers' settings (presets) and a fast batched loop.

    from exactlens.train import train, PRESETS
    run = train("first", epochs=50, seed=0)           # run.model, run.history, run.checkpoint
    run = train("first", out="runs/first", scaled=True)  # + checkpoint and history.jsonl
    runs = train_many("first", seeds=range(10), epochs=50)  # 10 runs trained together

Options and their meaning: exactlens.train.presets.OPTION_DOCS.
"""

from exactlens.train.loop import HISTORY_FIELDS, TrainRun, evaluate, train, train_many
from exactlens.train.presets import OPTION_DOCS, PRESETS, Preset

__all__ = ["HISTORY_FIELDS", "OPTION_DOCS", "PRESETS", "Preset", "TrainRun", "evaluate", "train", "train_many"]

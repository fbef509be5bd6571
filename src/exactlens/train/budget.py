"""What a training request costs, from the request alone: the one place where a training run's work, memory
and checkpoints are estimated (exactlens.resources' limits), asked by ``fit`` (``exactlens train``,
``el.train``, ``train_many``, a sweep's train jobs), by a sweep's spec check and by its ``--dry-run``.

Nothing is allocated and no word is drawn: the numbers come from the resolved options and the config
(exactlens.model.transformer.forward_operations_of / forward_bytes_of), so ``epochs=10**12``,
``strings_per_epoch=10**12``, ``train_length=10**9`` or ``checkpoints='every:1'`` over 10^12 steps are refused
in well under a second.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from exactlens.resources import RUN_OVERHEAD_BYTES, check_memory, check_work

__all__ = ["TrainingCost", "check_training", "training_cost"]

TOKEN_BYTES = 32  # per word position while words are drawn and encoded: ids, tokens, targets (int64 each) and more
EVAL_SCORE_BUDGET = 2**22  # attention scores per evaluation chunk (batch * heads * n^2); the loop's evaluate
LOWER = ("ask for less: fewer epochs, fewer strings_per_epoch or test_strings, shorter train_length or test_length, "
         "fewer seeds")


@dataclass(frozen=True)
class TrainingCost:
    steps: int  # optimizer steps per run
    words: int  # training words drawn per run (epochs x strings_per_epoch)
    checkpoints: int  # checkpoints kept per run (0: none asked)
    operations: float  # arithmetic of every run together
    memory: float  # bytes held at the peak, every run together
    disk: float  # bytes written per run (weights, history, checkpoints)


def _positions(spec: Any, key: str) -> int:
    return int(spec.options[key][1]) + int(spec.task.n_specials)


def training_cost(spec: Any, runs: int = 1, on_disk: bool = True) -> TrainingCost:
    """The cost of training ``runs`` runs of ``spec`` (exactlens.train.presets.TrainSpec) together;
    ``on_disk``: checkpoints go to a directory (else they are kept in memory)."""
    from exactlens.model.config import model_bytes, parameter_bytes
    from exactlens.model.transformer import forward_bytes_of, forward_operations_of
    from exactlens.train.checkpoints import checkpoint_count

    o, cfg = spec.options, spec.config
    per_epoch = o["strings_per_epoch"] // o["batch_size"]
    steps = o["epochs"] * per_epoch if o["optimizer"] != "lbfgs" else 25 * o["epochs"]
    kept = checkpoint_count(o["checkpoint_every"], o["checkpoints"], o["epochs"] * per_epoch)
    n_train, n_test = _positions(spec, "train_length"), _positions(spec, "test_length")
    evaluations = (o["epochs"] // o["eval_every"] if o["eval_every"] else 0) + 1 + kept
    operations = runs * (3.0 * steps * forward_operations_of(cfg, o["batch_size"], n_train)
                         + evaluations * forward_operations_of(cfg, o["test_strings"], n_test))
    chunk = max(1, EVAL_SCORE_BUDGET // (cfg.n_heads * n_test * n_test))
    peak = max(forward_bytes_of(cfg, runs * o["batch_size"], n_train, hooked=True),
               forward_bytes_of(cfg, min(o["test_strings"], chunk), n_test))
    weights = parameter_bytes(cfg)
    drawn = TOKEN_BYTES * (o["strings_per_epoch"] * n_train + (2 if kept else 1) * o["test_strings"] * n_test)
    memory = runs * (RUN_OVERHEAD_BYTES + 4 * weights + model_bytes(cfg) + drawn
                     + (0 if on_disk else kept * weights)) + peak
    disk = weights + 4096 + 400 * o["epochs"] + kept * (weights + 4096)
    return TrainingCost(steps, o["epochs"] * o["strings_per_epoch"], kept, operations, memory, disk)


def check_training(spec: Any, runs: int = 1, on_disk: bool = True) -> TrainingCost:
    """Refuse (one ExactLensError naming the limit) a training request beyond the memory or work limit,
    before anything is built; its cost otherwise."""
    cost = training_cost(spec, runs, on_disk)
    o = spec.options
    what = (f"training {spec.name} ({runs} run{'s' if runs != 1 else ''}: {o['epochs']:,} epochs x "
            f"{o['strings_per_epoch']:,} words of length up to {o['train_length'][1]:,}, {o['test_strings']:,} test "
            f"words of length up to {o['test_length'][1]:,}"
            + (f", {cost.checkpoints:,} checkpoints" if cost.checkpoints else "") + ")")
    check_memory(cost.memory, what, LOWER)
    check_work(cost.operations, what, LOWER)
    return cost

"""The one training loop behind ``exactlens train``, ``exactlens.train.train`` and every paper's runs.

Adam (default): one epoch = ``strings_per_epoch`` fresh words from the task, split into
``strings_per_epoch / batch_size`` steps. ``batch_size=1`` is the papers' loop (one step per
word); the default makes one epoch one step on one padded batch, which is what makes training
fast. ``train_many(name, seeds)`` trains one run per seed at once: the runs' parameters are
stacked along a run axis and every step is one computation for all of them
(:class:`exactlens.model.StackedRuns`, the model's own forward mapped over runs), each run
keeping its own data, initialization and optimizer state, so each equals its single ``train``
up to summation order.

LBFGS (``optimizer="lbfgs"``): full batch, as Shin & Matzinger train: one fixed training batch
of ``strings_per_epoch`` words and ``epochs`` iterations with a strong Wolfe line search; the
history has one record per loss evaluation (line-search trials included), whose ``epoch`` is the
iteration it belongs to. Runs train one after the other (a line search is per run).

The loss is the task kind's (exactlens.tasks.kinds: cross-entropy, or squared error for
regression), plus a preset's penalty; a preset's gradient masks and ``prepare`` step apply to
every run. Everything random comes from generators derived from ``seed``: initialization,
training words and test words each have their own stream, so evaluating more or less often
never changes training.
"""

from __future__ import annotations

import math
import platform
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from exactlens import tasks
from exactlens.devices import device_name, resolve_device
from exactlens.errors import ExactLensError
from exactlens.jsonio import dumps
from exactlens.model import ExactConfig, ExactTransformer, StackedRuns
from exactlens.model.config import parameter_bytes
from exactlens.model.stacked import SingleRun, flat_or_not, training_runs
from exactlens.outputs import staged
from exactlens.progress import bar, printing_around_bars
from exactlens.resources import check_run_count
from exactlens.tasks import kinds
from exactlens.tasks.base import check_seed
from exactlens.train.budget import check_training
from exactlens.train.checkpoints import CHECKPOINT_DIR, Checkpoint, Keeper, checkpoint_steps
from exactlens.train.data import PAD_ID, Batch, sample_batch, split
from exactlens.train.evaluation import LN2, evaluate
from exactlens.train.presets import TrainSpec, get_preset

HISTORY_FILE = "history.jsonl"
RUN_FILE = "run.json"

HISTORY_FIELDS = (
    "epoch",
    "step",
    "strings_seen",
    "lr",
    "train_loss_bits",
    "train_accuracy",
    "test_loss_bits",
    "test_accuracy",
    "wall_s",
)
"""Keys of every history record (history.jsonl, one JSON object per epoch). Test fields are null
in epochs without an evaluation. Per task kind the records add KIND_FIELDS, and a preset's
metrics add theirs (e.g. test_attn_first, test_query_angle_deg)."""

KIND_FIELDS = {
    "membership": (),
    "classification": (),
    "prediction": ("train_per_position_accuracy", "test_per_position_accuracy"),
    "regression": ("train_mse", "test_mse", "test_r2"),
}
"""Regression records have null *_loss_bits and *_accuracy (an approximation is never exact)
and the mean squared error and R^2 instead; prediction records add per-position accuracies
(accuracy is per word: every position right)."""


@dataclass
class TrainRun:
    model: ExactTransformer
    history: list[dict[str, Any]]
    checkpoint: Path | None
    task: str  # the preset's (or spec's) name
    seed: int
    options: dict[str, Any]
    wall_s: float
    info: dict[str, Any] = field(default_factory=dict)
    checkpoints: list[Checkpoint] = field(default_factory=list)  # the steps kept (exactlens.train.checkpoints)

    @property
    def final(self) -> dict[str, Any]:
        """The last record that has test metrics."""
        return next(r for r in reversed(self.history) if r.get("test_evaluated"))


def seed_generators(seed: int) -> dict[str, torch.Generator]:
    """Independent streams for initialization, training data, test data and the checkpoints' test words (the
    first three are the same as before the fourth existed: a SeedSequence's first words do not depend on
    how many are asked)."""
    check_seed(seed, minimum=0)
    states = np.random.SeedSequence(seed).generate_state(4, dtype=np.uint64)
    names = ("init", "train", "test", "checkpoint")
    return {n: torch.Generator().manual_seed(int(s) & (2**63 - 1)) for n, s in zip(names, states, strict=True)}


# ---- the loop ----------------------------------------------------------------------------


def _jsonable(options: dict[str, Any]) -> dict[str, Any]:
    return {k: list(v) if isinstance(v, tuple) else v for k, v in options.items()}


def stack_batches(parts: list[Batch]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One batch per run -> tokens [R, B, width] (right-padded to the widest), n_positions [R, B] and
    targets [R, B(, L)] (per-position targets padded with 0)."""
    if len(parts) == 1:  # one run (the usual training): views, nothing to pad or copy
        return parts[0].tokens[None], parts[0].n_positions[None], parts[0].targets[None]
    width = max(p.tokens.shape[1] for p in parts)
    pad = torch.nn.functional.pad
    tokens = torch.stack([pad(p.tokens, (0, width - p.tokens.shape[1]), value=PAD_ID) for p in parts])
    targets = [p.targets for p in parts]
    if targets[0].ndim == 2:
        longest = max(t.shape[1] for t in targets)
        targets = [pad(t, (0, longest - t.shape[1])) for t in targets]
    return tokens, torch.stack([p.n_positions for p in parts]), torch.stack(targets)


def run_losses(
    task: tasks.Task, outputs: torch.Tensor, targets: torch.Tensor, n_positions: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-run mean loss [R] and number of words decided right [R], for outputs [R, B, ...]."""
    runs, batch = n_positions.shape
    flat = (outputs.flatten(0, 1), targets.flatten(0, 1), n_positions.flatten())
    losses = kinds.loss(task, *flat).view(runs, batch).mean(1)
    with torch.no_grad():
        right = task.score(kinds.decide(task, flat[0], flat[2]), flat[1], flat[2]).correct
    return losses, right.view(runs, batch).sum(1)


class _Optimized:
    """The runs (StackedRuns, or SingleRun for one), their optimizer and schedule, gradient masks and
    clipping."""

    def __init__(self, spec: TrainSpec, models: list[ExactTransformer], total_steps: int):
        opts = spec.options
        self.runs = training_runs(models)
        self.flat = None
        self.masks = {}
        for name, mask in (spec.masks(models[0], opts) if spec.masks else {}).items():
            if name not in self.runs.params:
                raise ExactLensError(f"{spec.name}: a gradient mask names no parameter: {name!r}")
            if mask is False:
                self.runs.freeze(name)
            elif mask is not True:
                self.masks[name] = torch.as_tensor(mask).to(self.runs.params[name])  # its dtype and device
        self.params = self.runs.trainable
        self.trainable_names = [name for name, p in self.runs.params.items() if p.requires_grad]
        self.grad_clip = opts["grad_clip"]
        if opts["optimizer"] == "lbfgs":
            self.optimizer = torch.optim.LBFGS(
                self.params, lr=opts["lr"], max_iter=opts["epochs"], max_eval=25 * opts["epochs"],
                tolerance_grad=0.0, tolerance_change=0.0, history_size=20, line_search_fn="strong_wolfe",
            )
            self.scheduler = None
            return
        self.flat = flat_or_not(self.params)  # Adam updates one flat tensor (model.stacked.FlatLeaves)
        if self.flat is not None and isinstance(self.runs, SingleRun):
            self.runs.use_flat(self.flat)
        updated = [self.flat.flat] if self.flat is not None else self.params
        try:  # torch's fused Adam: one kernel for every parameter (1.10-1.15x a whole FIRST step at |w| = 10)
            self.optimizer = torch.optim.Adam(updated, lr=opts["lr"], fused=True)
        except (RuntimeError, ValueError):  # a device or dtype it does not support
            self.optimizer = torch.optim.Adam(updated, lr=opts["lr"], foreach=True)
        schedule = opts["lr_schedule"]
        warmup = opts["warmup_steps"]
        if schedule == "linear":
            factor = lambda s: 1 - s / total_steps  # noqa: E731
        elif schedule == "warmup_linear":
            factor = lambda s: (s + 1) / warmup if s < warmup else max(0.0, (total_steps - s) / max(1, total_steps - warmup))  # noqa: E501, E731
        else:
            factor = None
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, factor) if factor else None

    def zero_grad(self) -> None:
        if self.flat is not None:
            self.flat.zero_grad()
        else:
            self.optimizer.zero_grad(set_to_none=True)

    def close(self) -> None:
        """The runs' parameters each in their own storage again."""
        if self.flat is not None:
            self.flat.release()
        self.runs.close()

    def after_backward(self) -> None:
        """Gradient masks, then per-run norm clipping."""
        for name, mask in self.masks.items():
            grad = self.runs.grad(name)
            if grad is not None:
                grad.mul_(mask)
        if self.grad_clip is None:
            return
        grads = [g for g in (self.runs.grad(name) for name in self.trainable_names) if g is not None]  # [R, ...]
        norms = torch.stack([g.flatten(1).pow(2).sum(1) for g in grads]).sum(0).sqrt()  # [R]
        factor = (self.grad_clip / (norms + 1e-6)).clamp(max=1.0)
        for g in grads:
            g.mul_(factor.view(-1, *([1] * (g.ndim - 1))))


def train(
    task: str,
    *,
    out: str | Path | None = None,
    seed: int = 0,
    progress: Callable[[str], None] | None = None,
    overwrite: bool = False,
    device: Any = None,
    **options: Any,
) -> TrainRun:
    """Train a fresh model with a preset (exactlens.train.presets; options override its values).

    Returns a TrainRun (model in eval mode, history records, checkpoint directory). With ``out``,
    writes config.json + weights.pt (ExactTransformer.save; the config records the task),
    history.jsonl (one record per epoch) and run.json (preset, seed, options, timing, final
    metrics), as one new directory that appears only when the run is complete (an existing
    non-empty ``out`` is refused unless ``overwrite``; see exactlens.outputs). The same as
    ``train_many(task, [seed], ...)[0]`` with ``out`` the run's own directory. ``device``: where the
    model trains (exactlens.devices; None: the CPU); words and initial weights are drawn on the CPU
    whatever the device, and the trained model stays on it.
    """
    return fit_into(get_preset(task).spec(options), [seed], out, progress, overwrite=overwrite, device=device)[0]


def train_many(
    task: str,
    seeds: list[int] | tuple[int, ...] | range,
    *,
    out: str | Path | None = None,
    progress: Callable[[str], None] | None = None,
    overwrite: bool = False,
    device: Any = None,
    **options: Any,
) -> list[TrainRun]:
    """Train one run per seed with the same options, all at once (Adam; LBFGS runs one after the
    other): every run has the initialization, data and test words of ``train(task, seed=s, ...)``
    and its own optimizer state. With ``out``, run s is written to ``out/seed{s}`` (``out`` written
    as one new directory, as in ``train``). Each run's wall_s (and its history's) is the group's:
    the runs train in one computation."""
    if isinstance(seeds, (str, bytes)) or not hasattr(seeds, "__iter__"):
        raise ExactLensError(f"seeds are a list of integers, got {seeds!r}")
    if hasattr(seeds, "__len__"):
        check_run_count(len(seeds))  # before a list of 10^8 seeds is made
    seeds = list(seeds)
    if not seeds:
        raise ExactLensError("train_many needs at least one seed")
    for seed in seeds:
        check_seed(seed, minimum=0)
    if len(set(seeds)) != len(seeds):
        raise ExactLensError(f"train_many: seeds must be distinct, got {seeds}")
    return fit_into(get_preset(task).spec(options), seeds, out, progress, per_seed=True, overwrite=overwrite,
                    device=device)


def fit_into(
    spec: TrainSpec,
    seeds: list[int],
    out: str | Path | None,
    progress: Callable[[str], None] | None = None,
    *,
    per_seed: bool = False,
    overwrite: bool = False,
    device: Any = None,
) -> list[TrainRun]:
    """``fit`` writing its runs to ``out`` (one run) or ``out/seed{s}`` (``per_seed``) through a staging
    directory: ``out`` is checked before training starts and appears, complete, only at the end; an
    error or Ctrl-C leaves it as it was (exactlens.outputs.staged)."""
    if out is None:
        return fit(spec, seeds, None, progress, device=device)
    check_training(spec, len(seeds), on_disk=True)  # before the output is staged
    device = resolve_device(device, spec.options["dtype"])  # fails before the output is staged
    with staged(out, overwrite=overwrite, what="training output") as tmp:
        dirs = [tmp / f"seed{s}" for s in seeds] if per_seed else [tmp]
        runs = fit(spec, seeds, dirs, progress, device=device)
    final = Path(out)
    for run, directory in zip(runs, dirs, strict=True):
        run.checkpoint = final / directory.relative_to(tmp)
        for kept in run.checkpoints:  # written in the staging directory, now moved into place
            kept.path = run.checkpoint / CHECKPOINT_DIR / kept.path.name
    return runs


def new_model(spec: TrainSpec, generator: torch.Generator, device: Any = None) -> ExactTransformer:
    """A freshly initialized model of the spec (its own copy of the config), prepared by the preset on
    the CPU (the same initial weights on every device), then moved to ``device``."""
    model = ExactTransformer(ExactConfig.from_dict(spec.config.to_dict()))
    model.init_weights(generator=generator)
    if spec.prepare is not None:
        spec.prepare(model, spec.options)
    if device is not None:
        model.to(device)
    return model.train().set_fused(True)


def fit(
    spec: TrainSpec,
    seeds: list[int],
    outs: list[Path | None] | None = None,
    progress: Callable[[str], None] | None = None,
    device: Any = None,
) -> list[TrainRun]:
    """Train one model per seed for a spec (exactlens.train.presets.TrainSpec) on ``device``
    (exactlens.devices; None: the CPU)."""
    # the runs' work and memory (weights, gradients, Adam moments, words, checkpoints), before any is built
    check_training(spec, len(seeds), on_disk=outs is not None and outs[0] is not None)
    outs = outs if outs is not None else [None] * len(seeds)
    gens = [seed_generators(seed) for seed in seeds]
    opts = spec.options
    device = resolve_device(device, opts["dtype"])
    previous_threads = torch.get_num_threads()
    if opts["threads"] is not None:
        torch.set_num_threads(opts["threads"])
    keeper = _keeper(spec, outs, progress)
    logs = []
    for out in outs:
        if out is not None:
            out.mkdir(parents=True, exist_ok=True)
        logs.append(None if out is None else (out / HISTORY_FILE).open("w"))
    try:
        start = time.perf_counter()
        if opts["optimizer"] == "lbfgs":
            results = [_fit_lbfgs(spec, seed, g, log, progress, device)
                       for seed, g, log in zip(seeds, gens, logs, strict=True)]
        else:
            results = _fit_adam(spec, seeds, gens, logs, progress, device, keeper)
        wall = time.perf_counter() - start
    finally:
        for log in logs:
            if log is not None:
                log.close()
        torch.set_num_threads(previous_threads)
    runs = []
    for r, ((model, history, steps, stacked, run_wall), seed, out) in enumerate(zip(results, seeds, outs,
                                                                                      strict=True)):
        model.eval().set_fused(False)
        run = TrainRun(model, history, out, spec.name, seed, opts, wall if stacked else run_wall,
                       checkpoints=keeper.kept[r] if keeper is not None else [])
        run.info = {
            "task": spec.name,
            "task_spec": model.cfg.task,
            "paper": spec.paper,
            "seed": seed,
            "options": _jsonable(opts),
            "steps": steps,
            "wall_s": run.wall_s,
            "threads": opts["threads"] or previous_threads,
            "device": device_name(device),
            "torch": torch.__version__,
            "python": platform.python_version(),
            "n_parameters": sum(p.numel() for p in model.parameters() if p.requires_grad),
            "trained_with": {"seeds": seeds, "stacked": stacked, "optimizer": opts["optimizer"]},
            # a model shaped like a construction: which construction, and what training changed (hard
            # attention -> softmax, ...); null for a paper preset
            "shape": model.cfg.metadata.get("shape"),
            "final": run.final,
            "checkpoints": None if keeper is None else {
                "steps": [c.step for c in run.checkpoints], "directory": CHECKPOINT_DIR if out is not None else None,
                "bytes_each": keeper.bytes_each},
        }
        if opts["siit"]:  # the mapping, the circuit and the held-out measurements (exactlens.train.siit)
            from exactlens.train.siit import record

            run.info["siit"] = record(spec, model)
        if out is not None:
            model.check_finite()
            model.write_checkpoint(out)
            (out / RUN_FILE).write_text(dumps(run.info, indent=2) + "\n")
        runs.append(run)
    return runs


class _History:
    """The history of one fit: per run its records (every field of the task's kind and the preset's metrics,
    null where not measured; the field list made once), each written to the run's history.jsonl and, when
    evaluated, told to ``progress``: one call per record instead of one per step of that."""

    def __init__(self, spec: TrainSpec, seeds: list[int], logs: list[Any], progress: Callable[[str], None] | None):
        metric_fields = tuple(f for m in spec.metrics for f in m.fields) + spec.null_fields
        self.fields = HISTORY_FIELDS[:-1] + KIND_FIELDS[spec.task.kind] + metric_fields
        self.spec, self.seeds, self.logs, self.progress = spec, seeds, logs, progress
        self.regression = spec.task.kind == "regression"
        self.runs: list[list[dict[str, Any]]] = [[] for _ in seeds]
        self.start = time.perf_counter()

    def add(self, r: int, values: dict[str, Any], loss: float, correct: float | None, count: int,
            evaluated: bool, write: bool = True) -> dict[str, Any]:
        """Run r's record of ``values`` with its training loss (mean per word) and words decided right."""
        if self.regression:
            values["train_mse"] = loss
        else:
            values.update(train_loss_bits=loss / LN2, train_accuracy=None if correct is None else correct / count)
        record = {name: values.get(name) for name in self.fields}
        record["test_evaluated"] = evaluated
        record["wall_s"] = time.perf_counter() - self.start
        self.runs[r].append(record)
        if evaluated:
            self.tell(r, record)
        if write:
            self.write(r, record)
        return record

    def tell(self, r: int, record: dict[str, Any]) -> None:
        if self.progress is not None:
            with printing_around_bars():
                self.progress(_progress_line(self.spec, self.seeds[r], record["epoch"], record))

    def write(self, r: int, record: dict[str, Any]) -> None:
        if self.logs[r] is not None:
            self.logs[r].write(dumps(record) + "\n")


def _test(spec: TrainSpec, model: ExactTransformer, gen: torch.Generator) -> dict[str, Any]:
    opts = spec.options
    batch = sample_batch(spec.task, opts["test_strings"], opts["test_length"], gen, held_out=True)
    m = evaluate(model, batch, spec.task, spec.metrics)
    values = {"test_loss_bits": m["loss_bits"], "test_accuracy": m["accuracy"],
              "test_per_position_accuracy": m["per_position_accuracy"]}
    if spec.task.kind == "regression":
        values.update(test_mse=m["mse"], test_r2=m["r2"])
    values.update({k: v for k, v in m.items() if k.startswith("test_")})
    return values


def _keeper(spec: TrainSpec, outs: list[Path | None], progress: Callable[[str], None] | None) -> Keeper | None:
    """The fit's checkpoint keeper (None when no checkpoints are asked), after saying the disk they take."""
    opts = spec.options
    steps = checkpoint_steps(opts["checkpoint_every"], opts["checkpoints"], _total_steps(opts))
    if not steps:
        return None
    if opts["optimizer"] == "lbfgs":
        raise ExactLensError("checkpoints are kept at optimizer steps of Adam; optimizer 'lbfgs' takes one step "
                             "with many line-search evaluations: drop checkpoint_every/checkpoints or use 'adam'")
    keeper = Keeper(steps, outs, parameter_bytes(spec.config) + 4096)
    if progress is not None and outs[0] is not None:
        total = keeper.bytes_each * len(steps)
        progress(f"keeping {len(steps)} checkpoints per run (steps {steps[0]}..{steps[-1]}): about "
                 f"{_size(total)} per run, {_size(total * len(outs))} in all")
    return keeper


def _size(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def _total_steps(opts: dict[str, Any]) -> int:
    return opts["epochs"] * (opts["strings_per_epoch"] // opts["batch_size"])


def _keep_all(spec: TrainSpec, keeper: Keeper, models: list[ExactTransformer], words: list[Batch], step: int,
              epoch: int, losses: torch.Tensor | None) -> None:
    """Every run's checkpoint at ``step``: its weights, that step's training loss and its test numbers on the
    run's fixed checkpoint words."""
    for r, model in enumerate(models):
        m = evaluate(model, words[r], spec.task, spec.metrics)
        loss = None if losses is None else float(losses[r])
        if spec.task.kind == "regression":
            metrics = {"train_mse": loss, "test_mse": m["mse"], "test_r2": m["r2"]}
        else:
            metrics = {"train_loss_bits": None if loss is None else loss / LN2, "test_loss_bits": m["loss_bits"],
                       "test_accuracy": m["accuracy"]}
        keeper.keep(r, step, epoch, model, {"strings_seen": step * spec.options["batch_size"], **metrics})


def _fit_adam(spec, seeds, gens, logs, progress, device, keeper=None):
    opts = spec.options
    task = spec.task
    models = [new_model(spec, g["init"], device) for g in gens]
    steps_per_epoch = opts["strings_per_epoch"] // opts["batch_size"]
    state = _Optimized(spec, models, opts["epochs"] * steps_per_epoch)
    runs = state.runs
    # one run, no penalty and no loss of the preset's own, a loss whose gradient has a closed form: each step may
    # skip autograd entirely (SingleRun.by_hand; the same gradients bit for bit, tests/train/test_hand_step.py)
    by_hand = (isinstance(runs, SingleRun) and spec.penalty is None and spec.losses is None
               and task.kind == "membership")
    variable = opts["train_length"][0] != opts["train_length"][1]
    count = opts["strings_per_epoch"]
    history = _History(spec, seeds, logs, progress)
    step = 0
    epochs = bar(range(1, opts["epochs"] + 1), desc=_bar_title(spec, seeds), unit="epoch")
    tested: list[dict[str, Any]] = [{} for _ in seeds]  # each run's latest test values (for the bar)
    if keeper is not None:  # one fixed set of test words per run for all its checkpoints (their own stream)
        words = [sample_batch(task, opts["test_strings"], opts["test_length"], g["checkpoint"], held_out=True)
                 for g in gens]
        _keep_all(spec, keeper, models, words, 0, 0, None)
    for epoch in epochs:
        per_run_parts = []
        for g in gens:
            batch = sample_batch(task, count, opts["train_length"], g["train"])
            if variable and steps_per_epoch > 1:  # words come grouped by length: shuffle before splitting
                batch = batch.rows(torch.randperm(len(batch), generator=g["train"]))
            per_run_parts.append([batch] if steps_per_epoch == 1 else split(batch, opts["batch_size"]))
        lr = state.optimizer.param_groups[0]["lr"]
        epoch_loss = torch.zeros(len(seeds), dtype=torch.float64, device=device)
        epoch_correct = torch.zeros(len(seeds), dtype=torch.float64, device=device)
        for parts in zip(*per_run_parts, strict=True):
            tokens, n_positions, targets = (t.to(device) for t in stack_batches(list(parts)))
            hand = runs.by_hand(tokens, n_positions) if by_hand else None
            grad = None if hand is None else kinds.mean_loss_gradient(task, hand.outputs, targets[0])
            by_hand = by_hand and (hand is None or grad is not None)  # outputs with no closed form: never again
            if grad is not None:  # the readout and its backward by hand, the loss's gradient in closed form
                losses, correct = run_losses(task, hand.outputs[None], targets, n_positions)
                _check_finite_loss(spec, seeds, losses, step + 1, epoch)
                state.zero_grad()
                hand.add_gradient(grad)
            else:
                shortcut = spec.losses(spec, runs.params, tokens, n_positions, targets) if spec.losses else None
                losses, correct = shortcut or run_losses(task, runs.readout(tokens, n_positions, drawn=True),
                                                         targets, n_positions)
                total = losses + spec.penalty(runs.params, opts) if spec.penalty is not None else losses
                _check_finite_loss(spec, seeds, losses.detach(), step + 1, epoch)
                state.zero_grad()
                total.sum().backward()  # runs share nothing: each run's gradient is its own loss's
            state.after_backward()
            state.optimizer.step()
            if state.scheduler is not None:
                state.scheduler.step()
            step += 1
            if keeper is not None and keeper.due(step):
                runs.sync()
                _keep_all(spec, keeper, models, words, step, epoch, losses.detach())
            epoch_loss += losses.detach().double() * len(parts[0])
            epoch_correct += correct
        every = opts["eval_every"]
        evaluating = epoch == opts["epochs"] or (every and epoch % every == 0)
        if evaluating:  # weights checked where they are read (a non-finite weight shows in the next loss anyway)
            _check_finite_weights(spec, seeds, runs, step, epoch)
            runs.sync()
        for r in range(len(seeds)):
            values = {"epoch": epoch, "step": step, "strings_seen": epoch * count, "lr": lr}
            if evaluating:
                tested[r] = _test(spec, models[r], gens[r]["test"])
                values.update(tested[r])
            history.add(r, values, float(epoch_loss[r]) / count, float(epoch_correct[r]), count, bool(evaluating))
        if not epochs.disable:  # the bar's figures: from the records just made (no extra device work)
            epochs.set_postfix(_bar_figures(spec, [h[-1] for h in history.runs], tested), refresh=False)
    runs.sync()
    state.close()
    wall = time.perf_counter() - history.start
    return [(models[r], history.runs[r], step, True, wall) for r in range(len(seeds))]


def _bar_title(spec: TrainSpec, seeds: list[int]) -> str:
    if len(seeds) == 1:
        return f"train {spec.name}"
    return f"train {spec.name} ({len(seeds)} seeds, mean)"


def _bar_figures(spec: TrainSpec, records: list[dict[str, Any]], tested: list[dict[str, Any]]) -> dict[str, str]:
    """The training bar's figures: this epoch's training loss (and accuracy) and the latest test
    accuracy (MSE for regression), each the mean over the runs; test figures once a test was run."""
    def mean(rows: list[dict[str, Any]], key: str) -> float | None:
        values = [row.get(key) for row in rows]
        return None if not values or any(v is None for v in values) else sum(values) / len(values)

    regression = spec.task.kind == "regression"
    shown = (("train_mse", "mse", "{:.4g}"), ("test_mse", "test_mse", "{:.4g}")) if regression else (
        ("train_loss_bits", "loss_bits", "{:.4f}"), ("train_accuracy", "acc", "{:.3f}"),
        ("test_accuracy", "test_acc", "{:.3f}"))
    figures = {}
    for key, label, form in shown:
        value = mean(tested if key.startswith("test_") else records, key)
        if value is not None:
            figures[label] = form.format(value)
    return figures


def _check_finite_loss(spec: TrainSpec, seeds: list[int], losses: torch.Tensor, step: int, epoch: int) -> None:
    """Stop at the first non-finite loss, before the optimizer step it would poison."""
    finite = torch.isfinite(losses)
    if not bool(finite.all()):
        bad = [s for s, ok in zip(seeds, finite.tolist(), strict=True) if not ok]
        raise ExactLensError(
            f"{spec.name}: the training loss became non-finite at step {step} (epoch {epoch}, seeds {bad}); "
            "lower lr, set grad_clip, or check the options; nothing was saved"
        )


def _check_finite_weights(spec: TrainSpec, seeds: list[int], runs: StackedRuns | SingleRun, step: int,
                          epoch: int) -> None:
    """At each evaluation and at the end: every weight finite (a finite loss can still come from an
    overflowed weight that the loss does not reach)."""
    for name, stacked in runs.params.items():
        finite = torch.isfinite(stacked.detach().reshape(len(seeds), -1)).all(dim=1)
        if not bool(finite.all()):
            bad = [s for s, ok in zip(seeds, finite.tolist(), strict=True) if not ok]
            raise ExactLensError(
                f"{spec.name}: weight {name} became non-finite by step {step} (epoch {epoch}, seeds {bad}); "
                "lower lr or set grad_clip; nothing was saved"
            )


def _fit_lbfgs(spec, seed, gens, log, progress, device):
    opts = spec.options
    task = spec.task
    model = new_model(spec, gens["init"], device)
    state = _Optimized(spec, [model], opts["epochs"])
    runs = state.runs
    batch = sample_batch(task, opts["strings_per_epoch"], opts["train_length"], gens["train"])
    tokens, n_positions, targets = (t.to(device) for t in stack_batches([batch]))
    records = _History(spec, [seed], [log], progress)
    history = records.runs[0]
    iterations = bar(total=opts["epochs"], desc=f"train {spec.name} seed {seed}", unit="iter")

    def closure() -> torch.Tensor:
        state.optimizer.zero_grad()
        losses, correct = run_losses(task, runs.readout(tokens, n_positions), targets, n_positions)
        total = losses + spec.penalty(runs.params, opts) if spec.penalty is not None else losses
        total.sum().backward()
        state.after_backward()
        value = float(losses[0].detach())
        if not math.isfinite(value):
            raise ExactLensError(f"{spec.name}: the training loss became non-finite ({value}) at loss evaluation "
                                 f"{len(history) + 1} (LBFGS); lower lr or check the options; nothing was saved")
        iteration = state.optimizer.state[state.params[0]].get("n_iter", 0)
        values = {"epoch": iteration, "step": len(history), "strings_seen": len(batch), "lr": opts["lr"]}
        record = records.add(0, values, value, float(correct[0]), len(batch), evaluated=False, write=False)
        if not iterations.disable:  # written at the end
            iterations.set_postfix(_bar_figures(spec, [record], [{}]), refresh=False)
            iterations.update(min(iteration, opts["epochs"]) - iterations.n)
        return total.sum()

    try:
        state.optimizer.step(closure)
    finally:
        iterations.close()
    runs.sync()
    runs.close()
    history[-1].update(_test(spec, model, gens["test"]), test_evaluated=True)
    records.tell(0, history[-1])
    for record in history:
        records.write(0, record)
    return model, history, len(history), False, time.perf_counter() - records.start


def _progress_line(spec: TrainSpec, seed: int, epoch: int, values: dict[str, Any]) -> str:
    total = spec.options["epochs"]
    if spec.task.kind == "regression":
        return f"{spec.name} seed {seed} epoch {epoch}/{total}: train MSE {values.get('train_mse'):.4g}, " \
               f"test MSE {values.get('test_mse'):.4g}"
    return (
        f"{spec.name} seed {seed} epoch {epoch}/{total}: train {values['train_loss_bits']:.4f} bits, "
        f"test accuracy {values['test_accuracy']:.3f}"
    )

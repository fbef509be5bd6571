"""The training loop behind ``exactlens train`` and ``exactlens.train.train``.

One epoch = ``strings_per_epoch`` fresh random words (the papers' 100), split into
``strings_per_epoch / batch_size`` Adam steps. ``batch_size=1`` is the papers' loop
(one step per word); the default ``batch_size = strings_per_epoch`` makes one epoch one
step on one padded batch, which is what makes training fast. Everything random comes
from generators derived from ``seed``: initialization, training words and test words
each have their own stream, so evaluating more or less often never changes training.

``train_many(task, seeds)`` trains one run per seed at once: the runs' parameters are
stacked along a run axis and every step is one computation for all of them
(exactlens.train.fastpath), each run keeping its own data, initialization and Adam
state, so each equals its single ``train`` up to summation order. This amortizes the
per-step cost of small models over runs (benchmarks/bench_training.py).
"""

from __future__ import annotations

import json
import math
import platform
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from exactlens.errors import ExactLensError
from exactlens.model import ExactTransformer
from exactlens.train import fastpath
from exactlens.train.data import PAD_ID, Batch, sample_batch, split
from exactlens.train.init import pytorch_default_init
from exactlens.train.presets import get_preset, resolve_options

HISTORY_FILE = "history.jsonl"
RUN_FILE = "run.json"
LN2 = math.log(2.0)
EVAL_SCORE_BUDGET = 2**22  # attention scores per evaluation chunk (batch * heads * n^2)

HISTORY_FIELDS = (
    "epoch",
    "step",
    "strings_seen",
    "lr",
    "train_loss_bits",
    "train_accuracy",
    "test_loss_bits",
    "test_accuracy",
    "test_attn_first",
    "test_query_angle_deg",
    "wall_s",
)
"""Keys of every history record (history.jsonl, one JSON object per epoch). Test fields
are null in epochs without an evaluation; test_attn_first (languages) and
test_query_angle_deg (MAJORITY) are null where they do not apply."""


@dataclass
class TrainRun:
    model: ExactTransformer
    history: list[dict[str, Any]]
    checkpoint: Path | None
    task: str
    seed: int
    options: dict[str, Any]
    wall_s: float
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def final(self) -> dict[str, Any]:
        """The last record that has test metrics."""
        return next(r for r in reversed(self.history) if r["test_accuracy"] is not None)


def seed_generators(seed: int) -> dict[str, torch.Generator]:
    """Independent streams for initialization, training data and test data."""
    if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
        raise ExactLensError(f"seed must be an integer >= 0, got {seed!r}")
    states = np.random.SeedSequence(seed).generate_state(3, dtype=np.uint64)
    names = ("init", "train", "test")
    return {n: torch.Generator().manual_seed(int(s) & (2**63 - 1)) for n, s in zip(names, states, strict=True)}


# ---- loss and metrics ---------------------------------------------------------


def readout(model: ExactTransformer, batch: Batch) -> torch.Tensor:
    """Logits at the readout position through the hooked forward: [batch] for a sigmoid
    readout, [batch, classes] for logits (training uses exactlens.train.fastpath)."""
    n_positions = batch.n_positions if batch.padded else None
    out = model(batch.tokens, n_positions)[:, model.cfg.readout_position]
    return out[:, 0] if model.cfg.readout == "sigmoid" else out


def loss_and_correct(logits: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean cross-entropy (nats) and the number of correct decisions of one batch (logits
    [B] or [B, classes]). A sigmoid model accepts iff its logit is > 0 (probability > 1/2)."""
    loss, correct = run_losses(logits[None], targets[None])
    return loss[0], correct[0]


@torch.no_grad()
def evaluate(model: ExactTransformer, batch: Batch) -> dict[str, float]:
    """Cross-entropy (bits per string), accuracy, and two attention read-outs:
    attn_first = CLS's attention weight on position 1, summed over layers and averaged
    over heads and strings (Chiang & Cholak Fig. 4, bottom); query_angle_deg = angle
    between the first layer's CLS query, as a direction in the (normalized) residual
    space (w * W_K q, with w the pre-LN gain), and the line through the all-ones vector
    (Brody et al. Fig. 2b)."""
    cfg = model.cfg
    width = batch.tokens.shape[1]
    chunk = max(1, EVAL_SCORE_BUDGET // (cfg.n_heads * width * width))
    total_loss = total_correct = total_first = total_angle = 0.0
    captured: dict[str, torch.Tensor] = {}

    def keep(tensor: torch.Tensor, hook: Any) -> None:
        captured[hook.name] = tensor

    hooks = [(lambda name: name.endswith("attn.hook_pattern"), keep)]
    if cfg.readout == "logits":
        hooks.append(("blocks.0.attn.hook_q", keep))
    was_training = model.training
    model.eval()
    try:
        for part in split(batch, chunk):
            captured.clear()
            with model.hooks(fwd_hooks=hooks):
                logits = readout(model, part)
            loss, correct = loss_and_correct(logits, part.targets)
            total_loss += float(loss) * len(part)
            total_correct += float(correct)
            if part.tokens.shape[1] > 1:
                total_first += sum(float(p[:, :, 0, 1].mean(1).sum()) for k, p in captured.items() if "pattern" in k)
            if "blocks.0.attn.hook_q" in captured:
                q = captured["blocks.0.attn.hook_q"][:, 0]  # [b, h, d_head] at CLS
                direction = torch.einsum("bhd,hmd->bhm", q, model.blocks[0].attn.W_K)
                if model.blocks[0].norm == "pre":  # keys are LN(x) W_K with LN(x) = n(x) * w + b: the
                    direction = direction * model.blocks[0].ln1.w  # query acts on n(x) through w * (W_K q)
                cos = direction.sum(-1).abs() / (direction.norm(dim=-1) * math.sqrt(cfg.d_model)).clamp(min=1e-30)
                total_angle += float(torch.rad2deg(torch.arccos(cos.clamp(max=1.0))).mean(1).sum())
    finally:
        model.train(was_training)
    count = len(batch)
    return {
        "loss_bits": total_loss / count / LN2,
        "accuracy": total_correct / count,
        "attn_first": total_first / count if cfg.readout == "sigmoid" else None,
        "query_angle_deg": total_angle / count if cfg.readout == "logits" else None,
    }


# ---- the loop -------------------------------------------------------------------


def _jsonable(options: dict[str, Any]) -> dict[str, Any]:
    return {k: list(v) if isinstance(v, tuple) else v for k, v in options.items()}


def stack_batches(parts: list[Batch]) -> tuple[torch.Tensor, torch.Tensor]:
    """One batch per run -> tokens [R, B, width] (right-padded to the widest) and n_positions [R, B]."""
    width = max(p.tokens.shape[1] for p in parts)
    pad = torch.nn.functional.pad
    tokens = torch.stack([pad(p.tokens, (0, width - p.tokens.shape[1]), value=PAD_ID) for p in parts])
    return tokens, torch.stack([p.n_positions for p in parts])


def run_losses(logits: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-run mean cross-entropy (nats) [R] and correct decisions [R], for logits
    [R, B] (sigmoid readout) or [R, B, classes]; a sigmoid model accepts iff its logit is > 0."""
    if logits.ndim == 2:
        loss = torch.nn.functional.binary_cross_entropy_with_logits(
            logits, targets.to(logits.dtype), reduction="none"
        ).mean(-1)
        correct = ((logits > 0) == (targets > 0.5)).sum(-1)
    else:
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction="none")
        loss = loss.view(targets.shape).mean(-1)
        correct = (logits.argmax(-1) == targets).sum(-1)
    return loss, correct


class _Runs:
    """What the loop optimizes: R models of one configuration, trained either as one
    stacked computation (fastpath.stacked_cls_logits; R = 1 included) or, for
    configurations the fast path does not cover, one model at a time through its forward."""

    def __init__(self, models: list[ExactTransformer]):
        self.models = models
        self.cfg = models[0].cfg
        self.stacked = fastpath.supports(self.cfg)
        if self.stacked:
            self.params = fastpath.stack_parameters(models)
            self.trainable = [p for p in self.params.values() if p.requires_grad]
        else:
            self.trainable = [p for m in models for p in m.parameters() if p.requires_grad]

    def logits(self, parts: list[Batch]) -> torch.Tensor:
        """CLS logits [R, B(, classes)] of each run on its own batch."""
        if self.stacked:
            tokens, n_positions = stack_batches(parts)
            out = fastpath.stacked_cls_logits(self.cfg, self.params, tokens, n_positions)
            return out[..., 0] if self.cfg.readout == "sigmoid" else out
        return torch.stack([readout(m, part) for m, part in zip(self.models, parts, strict=True)])

    def sync(self) -> None:
        """Make the models hold the current weights (before evaluating or returning them)."""
        if self.stacked:
            fastpath.unstack_into(self.params, self.models)


def train(
    task: str,
    *,
    out: str | Path | None = None,
    seed: int = 0,
    progress: Callable[[str], None] | None = None,
    **options: Any,
) -> TrainRun:
    """Train a fresh model on a preset task; see exactlens.train.presets.OPTION_DOCS.

    Returns a TrainRun (model in eval mode, history records, checkpoint directory).
    With ``out``, writes config.json + weights.pt (ExactTransformer.save), history.jsonl
    (one record per epoch, keys HISTORY_FIELDS) and run.json (task, seed, options,
    timing, final metrics). The same as ``train_many(task, [seed], ...)[0]`` with
    ``out`` the run's own directory.
    """
    return _train_runs(task, [seed], [None if out is None else Path(out)], progress, options)[0]


def train_many(
    task: str,
    seeds: list[int] | tuple[int, ...] | range,
    *,
    out: str | Path | None = None,
    progress: Callable[[str], None] | None = None,
    **options: Any,
) -> list[TrainRun]:
    """Train one run per seed with the same options, all at once: every run has the
    initialization, data and test words of ``train(task, seed=s, **options)`` and its
    own optimizer state; the runs go through the stacked fast path together (one set
    of kernels per step for all of them), which is where the speed comes from.

    Each run equals its single ``train`` up to floating-point summation order. With
    ``out``, run s is written to ``out/seed{s}`` (the files of ``train``). Each run's
    wall_s (and its history's) is the group's: the runs train in one computation.
    """
    seeds = list(seeds)
    if not seeds:
        raise ExactLensError("train_many needs at least one seed")
    if len(set(seeds)) != len(seeds):
        raise ExactLensError(f"train_many: seeds must be distinct, got {seeds}")
    outs = [None if out is None else Path(out) / f"seed{s}" for s in seeds]
    return _train_runs(task, seeds, outs, progress, options)


def _train_runs(
    task: str,
    seeds: list[int],
    outs: list[Path | None],
    progress: Callable[[str], None] | None,
    options: dict[str, Any],
) -> list[TrainRun]:
    preset = get_preset(task)
    opts = resolve_options(preset, options)
    gens = [seed_generators(seed) for seed in seeds]
    language = preset.language_of(opts)
    config = preset.config(opts)
    models = [pytorch_default_init(ExactTransformer(config), g["init"]).train() for g in gens]
    runs = _Runs(models)
    optimizer = torch.optim.Adam(runs.trainable, lr=opts["lr"], foreach=True)
    steps_per_epoch = opts["strings_per_epoch"] // opts["batch_size"]
    total_steps = opts["epochs"] * steps_per_epoch
    if opts["lr_schedule"] == "linear":
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1 - s / total_steps)
    else:
        scheduler = None
    variable = opts["train_length"][0] != opts["train_length"][1]
    histories: list[list[dict[str, Any]]] = [[] for _ in seeds]
    logs = []
    for out in outs:
        if out is not None:
            out.mkdir(parents=True, exist_ok=True)
        logs.append(None if out is None else (out / HISTORY_FILE).open("w"))
    previous_threads = torch.get_num_threads()
    if opts["threads"] is not None:
        torch.set_num_threads(opts["threads"])
    start = time.perf_counter()
    step = 0
    count = opts["strings_per_epoch"]
    try:
        for epoch in range(1, opts["epochs"] + 1):
            per_run_parts = []
            for g in gens:
                batch = sample_batch(language, count, opts["train_length"], g["train"])
                if variable and steps_per_epoch > 1:  # words come grouped by length: shuffle before splitting
                    order = torch.randperm(len(batch), generator=g["train"])
                    batch = Batch(
                        batch.tokens[order], batch.n_positions[order], batch.targets[order], batch.lengths[order]
                    )
                per_run_parts.append([batch] if steps_per_epoch == 1 else split(batch, opts["batch_size"]))
            lr = optimizer.param_groups[0]["lr"]
            epoch_loss = torch.zeros(len(seeds), dtype=torch.float64)
            epoch_correct = torch.zeros(len(seeds), dtype=torch.float64)
            for parts in zip(*per_run_parts, strict=True):
                losses, correct = run_losses(runs.logits(list(parts)), torch.stack([p.targets for p in parts]))
                optimizer.zero_grad(set_to_none=True)
                losses.sum().backward()  # runs share nothing: each run's gradient is its own loss's
                optimizer.step()
                if scheduler is not None:
                    scheduler.step()
                step += 1
                epoch_loss += losses.detach() * len(parts[0])
                epoch_correct += correct
            bad = [s for s, v in zip(seeds, epoch_loss.tolist(), strict=True) if not math.isfinite(v)]
            if bad:
                raise ExactLensError(f"{task}: the training loss became non-finite in epoch {epoch} (seeds {bad})")
            every = opts["eval_every"]
            evaluating = epoch == opts["epochs"] or (every and epoch % every == 0)
            if evaluating:
                runs.sync()
            for r, seed in enumerate(seeds):
                record: dict[str, Any] = {
                    "epoch": epoch,
                    "step": step,
                    "strings_seen": epoch * count,
                    "lr": lr,
                    "train_loss_bits": float(epoch_loss[r]) / count / LN2,
                    "train_accuracy": float(epoch_correct[r]) / count,
                    "test_loss_bits": None,
                    "test_accuracy": None,
                    "test_attn_first": None,
                    "test_query_angle_deg": None,
                }
                if evaluating:
                    test = sample_batch(language, opts["test_strings"], opts["test_length"], gens[r]["test"])
                    metrics = evaluate(models[r], test)
                    record.update(
                        test_loss_bits=metrics["loss_bits"],
                        test_accuracy=metrics["accuracy"],
                        test_attn_first=metrics["attn_first"],
                        test_query_angle_deg=metrics["query_angle_deg"],
                    )
                    if progress is not None:
                        progress(
                            f"{task} seed {seed} epoch {epoch}/{opts['epochs']}: train "
                            f"{record['train_loss_bits']:.4f} bits, test accuracy {metrics['accuracy']:.3f}"
                        )
                record["wall_s"] = time.perf_counter() - start
                histories[r].append(record)
                if logs[r] is not None:
                    logs[r].write(json.dumps(record) + "\n")
    finally:
        for log in logs:
            if log is not None:
                log.close()
        torch.set_num_threads(previous_threads)
    wall = time.perf_counter() - start
    runs.sync()
    results = []
    for r, seed in enumerate(seeds):
        model = models[r].eval()
        run = TrainRun(model, histories[r], outs[r], task, seed, opts, wall)
        run.info = {
            "task": task,
            "paper": preset.paper,
            "seed": seed,
            "options": _jsonable(opts),
            "steps": step,
            "wall_s": wall,
            "threads": opts["threads"] or previous_threads,
            "torch": torch.__version__,
            "python": platform.python_version(),
            "n_parameters": sum(p.numel() for p in model.parameters() if p.requires_grad),
            "trained_with": {"seeds": seeds, "stacked": runs.stacked},
            "final": run.final,
        }
        if outs[r] is not None:
            model.save(outs[r])
            (outs[r] / RUN_FILE).write_text(json.dumps(run.info, indent=2) + "\n")
        results.append(run)
    return results

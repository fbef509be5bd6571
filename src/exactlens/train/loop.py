"""The training loop behind ``exactlens train`` and ``exactlens.train.train``.

One epoch = ``strings_per_epoch`` fresh random words (the papers' 100), split into
``strings_per_epoch / batch_size`` Adam steps. ``batch_size=1`` is the papers' loop
(one step per word); the default ``batch_size = strings_per_epoch`` makes one epoch one
step on one padded batch, which is what makes training fast. Everything random comes
from generators derived from ``seed``: initialization, training words and test words
each have their own stream, so evaluating more or less often never changes training.
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
from exactlens.train.data import Batch, sample_batch, split
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


def readout(model: ExactTransformer, batch: Batch, fast: bool = False) -> torch.Tensor:
    """Logits at [CLS]: [batch] for a sigmoid readout, [batch, classes] for logits.
    fast=True uses exactlens.train.fastpath (same function, no hooks) where it applies."""
    n_positions = batch.n_positions if batch.padded else None
    if fast and fastpath.supports(model):
        out = fastpath.cls_logits(model, batch.tokens, n_positions)
    else:
        out = model(batch.tokens, n_positions)[:, model.cfg.readout_position]
    return out[:, 0] if model.cfg.readout == "sigmoid" else out


def loss_and_correct(logits: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean cross-entropy (nats) and the number of correct decisions. A sigmoid
    model accepts iff its logit is > 0 (output probability > 1/2)."""
    if logits.ndim == 1:
        loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, targets.to(logits.dtype))
        correct = ((logits > 0) == (targets > 0.5)).sum()
    else:
        loss = torch.nn.functional.cross_entropy(logits, targets)
        correct = (logits.argmax(-1) == targets).sum()
    return loss, correct


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
    timing, final metrics).
    """
    preset = get_preset(task)
    opts = resolve_options(preset, options)
    gens = seed_generators(seed)
    language = preset.language_of(opts)
    model = pytorch_default_init(ExactTransformer(preset.config(opts)), gens["init"])
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.Adam(params, lr=opts["lr"], foreach=True)
    steps_per_epoch = opts["strings_per_epoch"] // opts["batch_size"]
    total_steps = opts["epochs"] * steps_per_epoch
    if opts["lr_schedule"] == "linear":
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1 - s / total_steps)
    else:
        scheduler = None
    variable = opts["train_length"][0] != opts["train_length"][1]
    history: list[dict[str, Any]] = []
    log = None
    if out is not None:
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        log = (out / HISTORY_FILE).open("w")
    previous_threads = torch.get_num_threads()
    if opts["threads"] is not None:
        torch.set_num_threads(opts["threads"])
    start = time.perf_counter()
    step = 0
    try:
        for epoch in range(1, opts["epochs"] + 1):
            batch = sample_batch(language, opts["strings_per_epoch"], opts["train_length"], gens["train"])
            if variable and steps_per_epoch > 1:  # words come grouped by length: shuffle before splitting
                order = torch.randperm(len(batch), generator=gens["train"])
                batch = Batch(batch.tokens[order], batch.n_positions[order], batch.targets[order], batch.lengths[order])
            parts = [batch] if steps_per_epoch == 1 else split(batch, opts["batch_size"])
            lr = optimizer.param_groups[0]["lr"]
            epoch_loss = torch.zeros((), dtype=torch.float64)
            epoch_correct = torch.zeros((), dtype=torch.float64)
            for part in parts:
                loss, correct = loss_and_correct(readout(model, part, fast=True), part.targets)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
                if scheduler is not None:
                    scheduler.step()
                step += 1
                epoch_loss += loss.detach() * len(part)
                epoch_correct += correct
            if not torch.isfinite(epoch_loss):
                raise ExactLensError(f"{task}: the training loss became {float(epoch_loss)} in epoch {epoch}")
            count = opts["strings_per_epoch"]
            record: dict[str, Any] = {
                "epoch": epoch,
                "step": step,
                "strings_seen": epoch * count,
                "lr": lr,
                "train_loss_bits": float(epoch_loss) / count / LN2,
                "train_accuracy": float(epoch_correct) / count,
                "test_loss_bits": None,
                "test_accuracy": None,
                "test_attn_first": None,
                "test_query_angle_deg": None,
            }
            every = opts["eval_every"]
            if epoch == opts["epochs"] or (every and epoch % every == 0):
                test = sample_batch(language, opts["test_strings"], opts["test_length"], gens["test"])
                metrics = evaluate(model, test)
                record.update(
                    test_loss_bits=metrics["loss_bits"],
                    test_accuracy=metrics["accuracy"],
                    test_attn_first=metrics["attn_first"],
                    test_query_angle_deg=metrics["query_angle_deg"],
                )
                if progress is not None:
                    progress(
                        f"{task} seed {seed} epoch {epoch}/{opts['epochs']}: train {record['train_loss_bits']:.4f} "
                        f"bits, test accuracy {metrics['accuracy']:.3f}"
                    )
            record["wall_s"] = time.perf_counter() - start
            history.append(record)
            if log is not None:
                log.write(json.dumps(record) + "\n")
    finally:
        if log is not None:
            log.close()
        torch.set_num_threads(previous_threads)
    wall = time.perf_counter() - start
    model.eval()
    run = TrainRun(model, history, out, task, seed, opts, wall)
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
        "n_parameters": sum(p.numel() for p in params),
        "final": run.final,
    }
    if out is not None:
        model.save(out)
        (out / RUN_FILE).write_text(json.dumps(run.info, indent=2) + "\n")
    return run

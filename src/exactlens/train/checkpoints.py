"""Checkpoints during training: the steps to keep (a schedule), keeping the weights there, reading them back.

A run trained with ``checkpoint_every=K`` (``--checkpoint-every K``) or ``checkpoints="log:N"``
(``--checkpoints log:N``; also ``every:K`` or a comma list of steps) keeps its weights after those
optimizer steps, step 0 (the initialization) and the last step always included. With an output
directory each one is ``OUT/checkpoints/step{step:08d}/`` (config.json + weights.pt, loadable with
``ExactTransformer.load``) and ``OUT/checkpoints/index.jsonl`` has one line per checkpoint: step, epoch,
words seen, the training loss of that step's batch and the test loss and accuracy on one fixed set of
test words drawn once for all the run's checkpoints (its own random stream: the run's training and its
usual test words are the same with or without checkpoints). The run's directory is staged as a whole,
so checkpoints appear only with the finished run. Without an output directory they stay in memory
(``TrainRun.checkpoints``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from exactlens.errors import ExactLensError
from exactlens.requests import Kind

__all__ = [
    "CHECKPOINT_DIR", "INDEX_FILE", "Checkpoint", "Keeper", "Schedule", "checkpoint_count", "checkpoint_steps",
    "read_checkpoints", "step_directory",
]

CHECKPOINT_DIR = "checkpoints"
INDEX_FILE = "index.jsonl"
MAX_CHECKPOINTS = 10_000


@dataclass(frozen=True)
class Schedule(Kind):
    """Which steps to keep: ``every:K`` (every K optimizer steps), ``log:N`` (N steps spaced evenly in log
    step from 1 to the last, plus step 0) or a comma list of steps; step 0 and the last step are always kept."""

    what: str = "'every:K' (K >= 1), 'log:N' (N >= 2) or a comma list of steps >= 0"

    def check(self, name: str, value: Any) -> Any:
        if isinstance(value, (list, tuple)):
            steps = [_count(self, name, value, v) for v in value]
            if not steps:
                raise self.refuse(name, value, " (at least one step)")
            return ",".join(str(s) for s in steps)
        if not isinstance(value, str):
            raise self.refuse(name, value)
        text = value.strip()
        how, _, count = text.partition(":")
        if how in ("every", "log"):
            n = _count(self, name, value, count)
            if n < (1 if how == "every" else 2):
                raise self.refuse(name, value)
            if how == "log" and n > MAX_CHECKPOINTS:
                raise self.refuse(name, value, f" (log:N keeps N checkpoints, at most {MAX_CHECKPOINTS})")
            return f"{how}:{n}"
        return self.check(name, [v for v in text.split(",")]) if text else self.check(name, [])


def _count(kind: Kind, name: str, whole: Any, value: Any) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        n = value
    elif isinstance(value, str) and value.strip().isdigit():
        n = int(value)
    else:
        raise kind.refuse(name, whole)
    if not 0 <= n <= 2**40:
        raise kind.refuse(name, whole)
    return n


def checkpoint_count(every: int | None, schedule: str | None, total_steps: int) -> int:
    """How many checkpoints a schedule keeps at most, by arithmetic alone (no step is listed): refused
    beyond MAX_CHECKPOINTS before anything is built."""
    if every is not None and schedule is not None:
        raise ExactLensError("checkpoint_every and checkpoints are two ways to say the same thing: give one")
    if every is None and schedule is None:
        return 0
    how, _, count = (f"every:{every}" if every is not None else schedule).partition(":")
    if how == "every":
        n = total_steps // int(count) + 2  # 0, K, 2K, ... and the last step
    elif how == "log":
        n = min(int(count), total_steps + 1)
    else:
        n = len(schedule.split(",")) + 2
    if n > MAX_CHECKPOINTS:
        raise ExactLensError(f"checkpoints: about {n:,} checkpoints asked over {total_steps:,} steps; at most "
                             f"{MAX_CHECKPOINTS:,} (use a larger K or log:N)")
    return n


def checkpoint_steps(every: int | None, schedule: str | None, total_steps: int) -> list[int]:
    """The sorted steps a run keeps (empty when neither option is set): always 0 and ``total_steps``."""
    if not checkpoint_count(every, schedule, total_steps):
        return []
    if every is not None:
        schedule = f"every:{every}"
    how, _, count = schedule.partition(":")
    if how == "every":
        steps = set(range(0, total_steps + 1, int(count)))
    elif how == "log":
        n = int(count)  # n - 1 points evenly spaced in log(step) over [1, total], then step 0
        steps = {round(math.exp(math.log(total_steps) * i / (n - 2))) for i in range(n - 1)} if n > 2 else set()
    else:
        steps = {int(s) for s in schedule.split(",")}
        late = sorted(s for s in steps if s > total_steps)
        if late:
            raise ExactLensError(f"checkpoints: step {late[0]} is after the run's last step {total_steps} "
                                 f"(epochs x strings_per_epoch / batch_size)")
    return sorted(steps | {0, total_steps})


def step_directory(step: int) -> str:
    return f"step{step:08d}"


@dataclass
class Checkpoint:
    """One kept step of a run: its numbers and either its directory (a run written to disk) or its
    state dict (kept in memory)."""

    step: int
    epoch: int
    metrics: dict[str, Any] = field(default_factory=dict)
    path: Path | None = None
    state: dict[str, Any] | None = field(default=None, repr=False)
    config: Any = field(default=None, repr=False)

    def model(self) -> Any:
        """The model at this step (eval mode): loaded from its directory, or rebuilt from the state kept."""
        from exactlens.model import ExactConfig, ExactTransformer

        if self.path is not None:
            return ExactTransformer.load(self.path)
        model = ExactTransformer(ExactConfig.from_dict(self.config.to_dict()))
        model.load_state_dict(self.state)
        return model.eval()

    def row(self) -> dict[str, Any]:
        """The index line of this checkpoint."""
        where = None if self.path is None else self.path.name
        return {"step": self.step, "epoch": self.epoch, **self.metrics, "directory": where}


def read_checkpoints(run: str | Path) -> list[Checkpoint]:
    """The checkpoints of a run directory (a training output, or one seed's ``seed{s}``), by step."""
    run = Path(run)
    index = run / CHECKPOINT_DIR / INDEX_FILE
    if not index.is_file():
        if (run / CHECKPOINT_DIR).is_dir() or not run.is_dir():
            raise ExactLensError(f"{run} has no checkpoint index ({CHECKPOINT_DIR}/{INDEX_FILE} is missing)")
        seeds = sorted(p.name for p in run.glob("seed*") if (p / CHECKPOINT_DIR).is_dir())
        hint = (f"; it holds several seeds' runs: give one of {', '.join(seeds)}" if seeds else
                "; train with --checkpoint-every K or --checkpoints log:N to keep them")
        raise ExactLensError(f"{run} has no checkpoints{hint}")
    try:
        text = index.read_bytes().decode("utf-8")
    except UnicodeDecodeError:
        raise ExactLensError(f"{index} is not UTF-8 text (a damaged checkpoint index)") from None
    except OSError as err:
        raise ExactLensError(f"{index} cannot be read ({err.strerror or err})") from None
    found = [_checkpoint_of(run, index, number, line) for number, line in enumerate(text.splitlines(), 1)
             if line.strip()]
    if not found:
        raise ExactLensError(f"{index} lists no checkpoints")
    return sorted(found, key=lambda c: c.step)


def _checkpoint_of(run: Path, index: Path, number: int, line: str) -> Checkpoint:
    """One line of a checkpoint index, or one ExactLensError naming the line and what is wrong with it."""
    from exactlens.jsonio import loads

    where = f"{index}: line {number}"
    try:
        row = loads(line, "it")
    except ExactLensError as err:
        raise ExactLensError(f"{where} is not a checkpoint record ({err})") from None
    try:
        step, epoch, name = row.pop("step"), row.pop("epoch"), row.pop("directory")
    except (KeyError, TypeError, AttributeError):
        raise ExactLensError(f"{where} is not a checkpoint record (an object with step, epoch and "
                             "directory)") from None
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in (step, epoch)):
        raise ExactLensError(f"{where}: step and epoch must be integers >= 0, got {step!r:.40} and {epoch!r:.40}")
    if not isinstance(name, str) or name in ("", ".", "..") or "/" in name or "\\" in name:
        raise ExactLensError(f"{where}: directory must be the name of a folder in {CHECKPOINT_DIR}/, got {name!r:.60}")
    return Checkpoint(step, epoch, row, run / CHECKPOINT_DIR / name)


class Keeper:
    """A fit's checkpoints: at each step of ``steps``, every run's weights (to ``OUT/checkpoints/`` or, for a
    run without a directory, to memory on the CPU) with the numbers ``keep`` is given."""

    def __init__(self, steps: list[int], outs: list[Path | None], bytes_each: int):
        self.steps = set(steps)
        self.bytes_each = bytes_each  # on disk per checkpoint: the weights and config.json
        self.outs = outs
        self.kept: list[list[Checkpoint]] = [[] for _ in outs]

    def due(self, step: int) -> bool:
        return step in self.steps

    def keep(self, r: int, step: int, epoch: int, model: Any, metrics: dict[str, Any]) -> None:
        from exactlens.jsonio import dumps

        out = self.outs[r]
        if out is None:
            state = {name: value.detach().to("cpu", copy=True) for name, value in model.state_dict().items()}
            self.kept[r].append(Checkpoint(step, epoch, metrics, None, state, model.cfg))
            return
        model.check_finite()
        directory = out / CHECKPOINT_DIR / step_directory(step)
        directory.mkdir(parents=True)
        model.write_checkpoint(directory)
        checkpoint = Checkpoint(step, epoch, metrics, directory)
        with (out / CHECKPOINT_DIR / INDEX_FILE).open("a", encoding="utf-8") as index:
            index.write(dumps(checkpoint.row()) + "\n")
        self.kept[r].append(checkpoint)

"""A timeline's checkpoints, from whatever holds them: a run directory (or one seed's), a train result or
TrainRun, or a list of models, checkpoint directories, state dicts (filled into a template model) or
TransformerLens / Hugging Face models (read by exactlens.interop.foreign when compared).

Each becomes a :class:`Source`: its step, its epoch where known, the numbers training recorded, and a
``load()`` that gives the model. What the run recorded of its training lengths (``run.json``'s options, a
TrainRun's options) comes back too: the timeline's default lengths.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from exactlens.errors import ExactLensError

__all__ = ["Origin", "Source", "sources_of"]


@dataclass
class Source:
    step: int
    epoch: int | None
    load: Callable[[], Any]
    label: str  # how errors name it
    metrics: dict[str, Any] = field(default_factory=dict)


@dataclass
class Origin:
    """Where the checkpoints came from, and the training and test lengths the run recorded (None: unknown)."""

    kind: str  # "run directory", "train run", "list"
    path: str | None = None
    train_length: list[int] | None = None
    test_length: list[int] | None = None


def sources_of(run: Any, steps: Sequence[int] | None = None, template: Any = None) -> tuple[list[Source], Origin]:
    """The checkpoints of ``run`` in step order (module docstring); every refusal is one line."""
    from exactlens.results import Result
    from exactlens.train.loop import TrainRun

    if isinstance(run, Result):
        if not hasattr(run, "run"):
            raise ExactLensError(f"a timeline takes one run; this {run.kind} result has "
                                 f"{'.runs (pick one: result.runs[i])' if hasattr(run, 'runs') else 'none'}")
        run = run.run
    if isinstance(run, (str, Path)):
        _no_steps(steps, "a run directory")
        return _from_directory(Path(run))
    if isinstance(run, TrainRun):
        _no_steps(steps, "a train run")
        if not run.checkpoints:
            raise ExactLensError("this train run kept no checkpoints: train with checkpoint_every=K or "
                                 "checkpoints='log:N' (--checkpoint-every K / --checkpoints log:N)")
        origin = Origin("train run", None if run.checkpoint is None else str(run.checkpoint),
                        *_lengths(run.options))
        return [Source(c.step, c.epoch, c.model, f"the checkpoint at step {c.step}", dict(c.metrics))
                for c in run.checkpoints], origin
    if isinstance(run, (list, tuple)):
        return _from_list(list(run), steps, template), Origin("list")
    raise ExactLensError(f"a timeline's run is a run directory, a train result or a list of checkpoints; got "
                         f"{type(run).__name__} {run!r:.60}")


def _no_steps(steps: Sequence[int] | None, what: str) -> None:
    if steps is not None:
        raise ExactLensError(f"steps= is for a list of checkpoints; {what} records its own steps")


def _lengths(options: dict[str, Any]) -> tuple[list[int] | None, list[int] | None]:
    def listed(value: Any) -> list[int] | None:
        if isinstance(value, int) and not isinstance(value, bool):
            return [value]
        if isinstance(value, (list, tuple)) and value and all(isinstance(v, int) for v in value):
            return [int(v) for v in value]
        return None

    return listed(options.get("train_length")), listed(options.get("test_length"))


def _from_directory(path: Path) -> tuple[list[Source], Origin]:
    from exactlens.train.checkpoints import read_checkpoints

    if not path.exists():
        raise ExactLensError(f"{path} does not exist (a run directory with checkpoints is expected)")
    found = read_checkpoints(path)
    options: dict[str, Any] = {}
    info = path / "run.json"
    if info.is_file():
        from exactlens.jsonio import read_json

        record = read_json(info)
        options = record.get("options", {}) if isinstance(record, dict) else None
        if not isinstance(options, dict):
            raise ExactLensError(f"{info} is not a run record (a JSON object whose 'options' is an object)")
    sources = [Source(c.step, c.epoch, _loader(c.path, f"the checkpoint at step {c.step}"),
                      f"the checkpoint at step {c.step}", dict(c.metrics)) for c in found]
    return sources, Origin("run directory", str(path), *_lengths(options))


def _loader(path: Path, what: str) -> Callable[[], Any]:
    def load() -> Any:
        from exactlens.model import ExactTransformer

        if not path.is_dir():
            raise ExactLensError(f"{what} ({path}) is missing")
        try:
            model = ExactTransformer.load(path)
        except ExactLensError as err:
            raise ExactLensError(f"{what} ({path}) is unreadable: {err}") from None
        except Exception as err:  # a damaged file: torch, json and zip say it their own ways
            raise ExactLensError(f"{what} ({path}) is unreadable: {type(err).__name__}: {err}") from None
        return model.eval()

    return load


def _from_list(items: list[Any], steps: Sequence[int] | None, template: Any) -> list[Source]:
    if not items:
        raise ExactLensError("a timeline needs at least one checkpoint; the list is empty")
    if steps is None:
        steps = list(range(len(items)))
    steps = list(steps)
    if len(steps) != len(items):
        raise ExactLensError(f"steps= gives {len(steps)} steps for {len(items)} checkpoints; give one per checkpoint")
    if any(b <= a for a, b in zip(steps, steps[1:], strict=False)):
        raise ExactLensError(f"steps= must increase, got {steps}")
    return [Source(step, None, _item_loader(item, i, step, template), f"checkpoint {i} (step {step})")
            for i, (item, step) in enumerate(zip(items, steps, strict=True))]


def _item_loader(item: Any, index: int, step: int, template: Any) -> Callable[[], Any]:
    import torch

    from exactlens.train.checkpoints import Checkpoint

    what = f"checkpoint {index} (step {step})"
    if isinstance(item, (str, Path)):
        return _loader(Path(item), what)
    if isinstance(item, Checkpoint):
        return item.model
    if isinstance(item, torch.nn.Module):
        if not hasattr(item, "cfg"):
            raise ExactLensError(f"{what} is a {type(item).__name__} without a cfg; a model is an ExactTransformer "
                                 "or a TransformerLens model")
        return lambda: item
    if isinstance(item, dict):
        if template is None:
            raise ExactLensError(f"{what} is a state dict: give model= (a model of its shape) to fill it into")
        if not (isinstance(template, torch.nn.Module) and hasattr(template, "cfg")):
            raise ExactLensError(f"model= is a model with a cfg (an ExactTransformer or a TransformerLens model), "
                                 f"got {type(template).__name__}")

        def fill() -> Any:
            model = copy.deepcopy(template)
            try:
                model.load_state_dict(item)
            except (RuntimeError, TypeError, KeyError) as err:
                first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
                raise ExactLensError(f"{what} does not fit model=: {first}") from None
            return model.eval()

        return fill
    raise ExactLensError(f"{what} is a {type(item).__name__}; a checkpoint is a model, a checkpoint directory, a "
                         "state dict (with model=) or a train Checkpoint")

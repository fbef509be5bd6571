"""The target of ``verify`` and ``precision`` when it is a model, not a construction name: a checkpoint
directory, a train result, an ExactTransformer, or a model exactlens did not build (a TransformerLens
``HookedTransformer`` or ``TransformerBridge``, read as its checked ExactTransformer copy,
exactlens.interop.foreign). A construction name keeps the verbs' construction path (:func:`is_construction`).
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from exactlens.errors import ExactLensError

__all__ = ["ModelTarget", "in_float64", "is_construction", "longest_of", "model_lengths", "model_target", "on_device"]


def is_construction(target: Any) -> bool:
    """A string that is not a checkpoint directory: a construction name (its own errors for unknown ones)."""

    if not isinstance(target, str):
        return False
    return not _is_checkpoint(target)


def _is_checkpoint(target: Any) -> bool:
    from exactlens.model.transformer import CONFIG_FILE

    try:
        path = Path(target)
        return path.is_dir() and (path / CONFIG_FILE).exists()
    except (ValueError, OSError):  # a NUL byte, a name too long: no directory
        return False


@dataclass
class ModelTarget:
    model: Any  # an ExactTransformer (a foreign model's copy), on the CPU until moved
    task: Any  # exactlens.tasks.Task
    label: str  # the name shown and written as the result's "name"
    info: dict[str, Any]  # what the target was: {"kind": checkpoint | model | foreign, ...}
    original: Any = None  # the foreign model itself (None for an exactlens model)


def model_target(target: Any, task: Any = None, readout: Any = None, params: dict | None = None,
                 direct: bool = True) -> ModelTarget:
    """The model a verb runs and its task; ``task``/``readout`` only where the model needs them. A foreign
    model whose weights cannot be copied is read through its own forward (``direct``; else refused)."""
    from exactlens import tasks
    from exactlens.interop.foreign import is_foreign, resolve_model
    from exactlens.model import ExactTransformer
    from exactlens.model.transformer import CONFIG_FILE
    from exactlens.results import Result

    if params:
        raise ExactLensError(f"param ({', '.join(params)}) applies to a construction (a name); a model has its weights")
    if isinstance(target, Result):
        if not hasattr(target, "model"):
            raise ExactLensError(f"this {target.kind} result holds no single model"
                                 f"{' (pick one: result.models[i])' if hasattr(target, 'models') else ''}")
        target = target.model
    if isinstance(target, (str, Path)):
        path = Path(target)
        if not _is_checkpoint(target):
            raise ExactLensError(f"{str(target)!r} is no checkpoint directory (no {CONFIG_FILE}) and no construction "
                                 "name (see `exactlens list`)")
        _own_readout(readout)
        model = ExactTransformer.load(path).eval()
        return ModelTarget(model, _exact_task(model, task), str(path), {"kind": "checkpoint", "path": str(path)})
    if is_foreign(target):
        try:
            exact, foreign = resolve_model(target, task, readout)
        except ExactLensError as err:
            if "output shape" in str(err):  # refused again, naming the readouts that fit and their accuracy
                _shape_hint(target, task, readout)
            if not direct or not str(err).startswith("cannot read"):
                raise
            return _direct(target, task, readout, str(err))
        return ModelTarget(exact, tasks.from_spec(exact.cfg.task), foreign["source"], foreign, original=target)
    if isinstance(target, ExactTransformer):
        _own_readout(readout)
        return ModelTarget(target, _exact_task(target, task), target.cfg.model_name or "model", {"kind": "model"})
    raise ExactLensError(f"the target is a construction name, a checkpoint directory, a train result or a model (an "
                         f"ExactTransformer, a TransformerLens HookedTransformer or TransformerBridge); got "
                         f"{type(target).__name__}")


def _own_readout(readout: Any) -> None:
    """An exactlens model (a checkpoint, an ExactTransformer) reads its own readout: one given is refused, as
    diff, timeline and discover refuse it, never silently ignored."""
    if readout is not None:
        raise ExactLensError("readout applies to a model exactlens did not build (a HookedTransformer or a "
                             "TransformerBridge); an exactlens model reads its own readout")


def _direct(model: Any, task: Any, readout: Any, refused: str) -> ModelTarget:
    from exactlens.interop.direct import DirectModel
    from exactlens.interop.foreign import facts, foreign_task
    from exactlens.interop.readout import default_readout, parse_readout

    task = foreign_task(model, task)
    spec = parse_readout(readout) or default_readout(task)
    f = facts(model)
    if f["n_ctx"] is None:
        raise ExactLensError(f"{refused}; and it states no n_ctx, so the words it can read are unknown")
    info = {"kind": "foreign", **f, "task": task.spec(), "readout": spec.text, "imported": None,
            "import_refused": refused, "read": "through its own forward pass (no ExactTransformer copy)"}
    return ModelTarget(DirectModel(model, task, spec, f, refused), task, f["source"], info, original=model)


def _shape_hint(model: Any, task: Any, readout: Any) -> None:
    from exactlens.interop.foreign import foreign_task, readout_warning

    task = foreign_task(model, task)
    n_ctx = int(model.cfg.n_ctx) - task.n_specials
    lengths = [n for n in range(max(1, task.min_length), 9) if n <= n_ctx][-3:]
    if lengths:
        readout_warning(model, None, task, readout, lengths)


def _exact_task(model: Any, task: Any) -> Any:
    from exactlens import tasks

    if model.cfg.task is not None:
        if task is not None:
            raise ExactLensError(f"task applies to a model that records none; this one answers "
                                 f"{model.cfg.task['name']!r}")
        return tasks.from_spec(model.cfg.task)
    if task is None:
        raise ExactLensError("the model records no task (cfg.task): name it (task='first', --task first)")
    return tasks.get(task) if isinstance(task, str) else task


def model_lengths(target: ModelTarget, lengths: list[int] | None, longest: int = 12) -> list[int]:
    """The lengths given (each checked against the task and the model's position table), or 1..longest
    within both."""
    high = longest_of(target)
    low = max(1, target.task.min_length)
    if lengths is None:
        return [n for n in range(low, longest + 1) if high is None or n <= high] or [target.task.min_length]
    for n in lengths:
        target.task.check_length(n)
        if high is not None and n > high:
            raise ExactLensError(f"length {n} is beyond what {target.label} answers (|w| <= {high}: its position "
                                 "table or its task)")
    return list(lengths)


def longest_of(target: ModelTarget) -> int | None:
    """The longest |w| the model answers: its task's limit, a limit it was built for and its position table's."""
    cfg, task = target.model.cfg, target.task
    highs = [task.max_length, cfg.metadata.get("max_length")]
    if cfg.learned_positions:
        highs.append(cfg.n_ctx - task.n_specials)
    known = [h for h in highs if h is not None]
    return min(known) if known else None


def in_float64(model: Any) -> tuple[Any | None, str]:
    """A float64 twin of an ExactTransformer (the same weights, widened), or None and why not."""
    import torch

    from exactlens.interop.called import CalledReadout
    from exactlens.model import ExactTransformer

    if model.cfg.dtype == "float64":
        return None, "the model is float64 already"
    if type(model).__name__ == "DirectModel":  # the user's own module, widened as a whole
        from exactlens.interop.direct import DirectModel

        wide = copy.deepcopy(model.model).to(torch.float64)
        return DirectModel(wide, model.task, model.spec, model.facts, model.refused), "the model in float64"
    cfg = dataclasses.replace(model.cfg, dtype="float64")
    if type(model) is CalledReadout:
        twin = CalledReadout(cfg, model.readout_fn)
    elif type(model) is ExactTransformer:
        twin = ExactTransformer(cfg)
    else:
        return None, f"{type(model).__name__} is not a plain ExactTransformer (no float64 twin is built)"
    state = {k: v.detach().cpu().double() if v.is_floating_point() else v.cpu()
             for k, v in model.state_dict().items()}
    twin.load_state_dict(state)
    return twin.eval(), "the same weights in float64"


def on_device(model: Any, device: Any) -> Any:
    """The model on ``device``: a copy when it must move (a user's model is never moved under them)."""
    import torch

    device = torch.device(device)
    param = next(iter(model.parameters()), None)
    if param is None or param.device == device:
        return model
    return copy.deepcopy(model).to(device)

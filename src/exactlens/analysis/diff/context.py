"""What every part of the diff reads: both models, their sides, the task, the lengths both accept, and the
values of the steps run so far (:class:`Context`), prepared once from the request (:func:`prepare`).

Everything a user can get wrong (the construction, the device, the trained side, its task and vocabulary,
the lengths) is refused here, before any word is run.
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from exactlens import tasks
from exactlens.analysis.diff.runs import (
    Side,
    check_diff_cost,
    check_vocab,
    describe,
    make_side,
    resolve_trained,
    trained_reader,
    usable_lengths,
)
from exactlens.constructions.registry import get
from exactlens.devices import device_of, resolve_device
from exactlens.errors import ExactLensError
from exactlens.interop.foreign import facts, is_foreign, readout_warning, to_exact
from exactlens.interop.readout import default_readout, parse_readout

__all__ = ["Context", "ExactSide", "prepare", "prepare_exact", "prepare_trained"]


@dataclass
class Context:
    """The two models of one diff and what the parts share (``values``: each step's value by name)."""

    task: tasks.Task
    model: Any  # the trained side's model
    exact_model: Any
    side: Side  # the trained side
    exact: Side
    lengths: list[int]
    skipped: list[dict[str, Any]]
    labels: list[str]  # the exact model's residual labels
    device: Any
    say: Callable[[str], None]
    foreign: Any = None  # the user's own model (TransformerLens, Hugging Face) the trained side was read from
    readout: Any = None  # its readout (exactlens.interop.readout.Readout)
    values: dict[str, Any] = field(default_factory=dict)
    # What a timeline shares between its models (empty for one diff): the exact side's runs of the words
    # ("exact_runs"), the alignment's pairs and the previous model's fitted subspaces, the exact circuit.
    carry: dict[str, Any] = field(default_factory=dict)


@dataclass
class ExactSide:
    """The exact side of a diff, prepared once: several trained models (a timeline's checkpoints) can be
    compared with it (:func:`prepare_trained`)."""

    construction: Any
    exact_model: Any
    task: tasks.Task
    device: Any  # the request's device (None: where the trained model is)


def prepare_exact(against: str, request: Any) -> ExactSide:
    """The construction built for the request (its parameters, dtype and device)."""
    construction = get(against)
    target = resolve_device(request.device, request.exact_dtype) if request.device is not None else None
    exact_model = construction.make(dtype=request.exact_dtype, **request.param)
    return ExactSide(construction, exact_model, tasks.of_model(exact_model), target)


def prepare(trained: Any, against: str, request: Any, say: Callable[[str], None]) -> Context:
    """Both models on one device, read by their own readers, and the lengths both accept (module docstring)."""
    return prepare_trained(trained, prepare_exact(against, request), request, say)


def prepare_trained(trained: Any, shared: ExactSide, request: Any, say: Callable[[str], None]) -> Context:
    """One trained model against the prepared exact side (:func:`prepare`)."""
    construction, exact_model, task, target = shared.construction, shared.exact_model, shared.task, shared.device
    model, info = resolve_trained(trained)
    foreign, readout, model, info = _read_foreign(model, info, task, request.readout, say)
    target = target if target is not None else device_of(model)
    if device_of(model) != target:  # the caller's own model is copied, one loaded here is moved
        model = (copy.deepcopy(model) if info["kind"] == "model" or model is foreign else model).to(target)
    exact_model.to(target)
    if hasattr(model, "eval"):
        model.eval()
    what = info.get("name") or info.get("path") or "the trained model"
    reader = trained_reader(model, task, what, construction.name)  # different tasks: refused before anything else
    info.update(describe(model))
    info.update(check_vocab(model, task, what, construction.name))
    exact_info = {"name": construction.name, "paper": construction.paper, "params": dict(request.param),
                  **describe(exact_model)}
    exact = make_side(exact_model, exact_info, tasks.reader(exact_model), exact_model.cfg.readout_position, True)
    side = make_side(model, info, reader, exact.readout_position, False, readout_spec=readout)
    used, skipped = usable_lengths(request.lengths, construction, task, side, exact)
    check_diff_cost(task, used, request.strings, side, exact)  # before any word is drawn
    labels = [exact_model.residual_label(i) for i in range(exact.d_model)]
    warning = readout_warning(foreign if foreign is not None else model, exact_model, task, readout, used, request.seed)
    if warning:
        warnings.warn(warning, stacklevel=3)
        say(f"diff: warning: {warning}")
        info["readout_warning"] = warning
    return Context(task, model, exact_model, side, exact, used, skipped, labels, target, say, foreign, readout)


def _read_foreign(model: Any, info: dict[str, Any], task: tasks.Task, readout: Any,
                  say: Callable[[str], None]) -> tuple[Any, Any, Any, dict[str, Any]]:
    """A user's own model (TransformerLens, Hugging Face) read as an ExactTransformer copy where its weights
    allow (then every part applies), else through its hooks with the readout; an exactlens model as it is."""
    if not is_foreign(model):
        if readout is not None:
            raise ExactLensError("readout applies to a model exactlens did not build (a HookedTransformer, a "
                                 "TransformerBridge); an exactlens model is read by its own readout")
        return None, None, model, info
    spec = parse_readout(readout) or default_readout(task)
    info = {**info, "kind": "foreign", **facts(model), "answer_readout": spec.text,
            "readout_source": "given" if readout is not None else "the task's default"}
    try:
        copy_ = to_exact(model, task, spec)
    except ExactLensError as err:
        info["imported"] = None
        info["import_refused"] = str(err)
        say(f"diff: {err}; the model is read through its hooks (no weights or circuit parts)")
        return model, spec, model, info
    info["imported"] = "weights copied into an ExactTransformer; outputs checked equal on random tokens"
    return model, spec, copy_, info

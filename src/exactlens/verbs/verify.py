"""``exactlens verify NAME | CHECKPOINT_DIR``: accuracy, cross-entropy and margin per length of a construction
or a model (a checkpoint, an ExactTransformer, a train result, a TransformerLens model with ``task``/``readout``;
exactlens.interop.model_target) against its task's answers."""

from __future__ import annotations

from typing import Any

from exactlens.analysis.verify_request import VerifyRequest
from exactlens.errors import ExactLensError
from exactlens.results import Result, View
from exactlens.verbs import VerbSpec, register_verb, tell
from exactlens.verbs.common import num, per_length_plot


def run(request: VerifyRequest) -> Result:
    from exactlens.analysis.verify import verify
    from exactlens.constructions import get
    from exactlens.interop.model_target import is_construction

    if not is_construction(request.name):
        return _run_model(request)
    if request.task is not None or request.readout is not None:
        raise ExactLensError("task and readout apply to a model (a checkpoint, an ExactTransformer, a TransformerLens "
                             f"model); construction {request.name!r} answers its own task")

    # bad names, parameters or devices fail before any progress
    construction = get(request.name)
    model = construction.make(dtype=request.dtype, device=request.device, **request.params)
    lengths = construction.default_lengths(model) if request.lengths is None else request.lengths
    tell(f"verifying {request.name} ({request.dtype}, {model.device}) on {len(lengths)} lengths")
    data = verify(request.name, lengths, strings=request.strings, dtype=request.dtype, seed=request.seed,
                  params=request.params, model=model)
    result = Result("verify", data)
    broken = [r for r in data["results"] if r.get("non_finite_words")]
    if broken:  # the result is printed (strict JSON, nulls); the command still fails
        lengths = [r["length"] for r in broken]
        result.failure = (
            f"{request.name} ({request.dtype}) gives NaN or infinite outputs at lengths {lengths} "
            f"({sum(r['non_finite_words'] for r in broken)} words): no decision is read from them; check the "
            "parameters (a value may overflow the dtype)")
    return result


def _run_model(request: VerifyRequest) -> Result:
    """verify on a model: its behaviour against its task's answers (membership function, classes...)."""
    from exactlens import tasks
    from exactlens.analysis.verify import verify_model
    from exactlens.devices import device_name, resolve_device
    from exactlens.interop.foreign import readout_warning
    from exactlens.interop.model_target import model_lengths, model_target, on_device

    target = model_target(request.name, request.task, request.readout, request.params)
    lengths = model_lengths(target, request.lengths)
    model = on_device(target.model, resolve_device(request.device, target.model.cfg.dtype))
    tell(f"verifying {target.label} ({model.cfg.dtype}, {model.device}) on {len(lengths)} lengths of task "
         f"{target.task.name!r}")
    data: dict[str, Any] = {"name": target.label, "dtype": model.cfg.dtype, "seed": request.seed, "params": {},
                            "device": device_name(model.device), "task": target.task.spec(),
                            "decision_rule": tasks.reader(model, target.task).name, "target": target.info}
    if target.original is not None:  # a readout that reads the model near chance is said before the work
        warning = readout_warning(target.original, None, target.task, request.readout, lengths, request.seed)
        if warning:
            tell(f"verify: warning: {warning}")
            data["readout_warning"] = warning
    if request.dtype != model.cfg.dtype:
        data["dtype_note"] = (f"dtype {request.dtype} applies to a construction; the model runs in its own dtype "
                              f"{model.cfg.dtype}")
    data["results"] = verify_model(model, lengths, strings=request.strings, seed=request.seed, task=target.task)
    return _checked(Result("verify", data), request)


def _checked(result: Result, request: VerifyRequest) -> Result:
    broken = [r for r in result["results"] if r.get("non_finite_words")]
    if broken:
        result.failure = (f"{result['name']} gives NaN or infinite outputs at lengths {[r['length'] for r in broken]} "
                          f"({sum(r['non_finite_words'] for r in broken)} words): no decision is read from them")
    return result


def after(request: VerifyRequest, result: Result, from_cli: bool) -> None:
    if from_cli and any(r["accuracy"] is not None and r["accuracy"] < 1 for r in result["results"]):
        tell("note: accuracy below 1 at some lengths")


def text(data: dict[str, Any]) -> str:
    regression = (data["task"] or {}).get("kind") == "regression"
    last = "max_abs_error" if regression else "min_abs_logit"
    lines = [f"{data['name']} {data['dtype']}: length strings accuracy cross_entropy_bits {last}"]
    lines += [
        f"  {r['length']:6d} {r['strings']:7d} {num(r['accuracy'], '.6f', 'n/a')} "
        f"{num(r['cross_entropy_bits'], '.6f', 'n/a')} {num(r.get(last), '.3e', 'n/a')}"
        + (f"  NON-FINITE on {r['non_finite_words']} words" if r.get("non_finite_words") else "")
        for r in data["results"]
    ]
    return "\n".join(lines)


def _accuracies(data: dict[str, Any]) -> list[float]:
    return [r["accuracy"] for r in data["results"] if r["accuracy"] is not None]


def headline(data: dict[str, Any]) -> list[tuple[str, Any]]:
    accuracies = _accuracies(data)
    return [("model" if "target" in data else "construction", data["name"]), ("dtype", data["dtype"]),
            ("lengths", len(data["results"])),
            ("min accuracy", min(accuracies, default=None)),
            ("all exact", all(a == 1.0 for a in accuracies) and len(accuracies) == len(data["results"]))]


def plot(result: Result) -> Any:
    fig = per_length_plot(result["results"], "accuracy", "accuracy", f"{result['name']} ({result['dtype']})")
    fig.axes[0].set_ylim(-0.02, 1.02)
    return fig


register_verb(VerbSpec("verify", "accuracy and cross-entropy per length", VerifyRequest, run,
                       views={"verify": View(headline, text, plot)}, after=after, order=10))

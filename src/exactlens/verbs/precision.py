"""``exactlens precision NAME | CHECKPOINT_DIR``: the largest length at which a construction is still exact in a
dtype; for a model, where it stops answering right and whether floating point is the cause (its float64 twin)."""

from __future__ import annotations

from typing import Any

from exactlens.analysis.verify_request import PrecisionRequest
from exactlens.errors import ExactLensError
from exactlens.results import Result, View
from exactlens.verbs import VerbSpec, register_verb, tell
from exactlens.verbs.common import per_length_plot


def run(request: PrecisionRequest) -> Result:
    from exactlens.analysis.verify import precision
    from exactlens.constructions import get
    from exactlens.devices import resolve_device
    from exactlens.interop.model_target import is_construction

    if not is_construction(request.name):
        return Result("precision", model_precision(request))
    if request.task is not None or request.readout is not None:
        raise ExactLensError("task and readout apply to a model (a checkpoint, an ExactTransformer, a TransformerLens "
                             f"model); construction {request.name!r} answers its own task")

    construction = get(request.name)
    model = construction.make(dtype=request.dtype, **request.params)  # bad names/parameters fail before any work
    max_length = request.max_length or construction.default_max_length(model)
    device = resolve_device(request.device, request.dtype)
    tell(f"scanning {request.name} ({request.dtype}, {device}) up to length {max_length}")
    return Result("precision", precision(request.name, dtype=request.dtype, max_length=max_length,
                                         strings=request.strings, seed=request.seed, params=request.params,
                                         device=device))


def model_precision(request: PrecisionRequest) -> dict[str, Any]:
    """precision on a model: where it stops answering every checked word right (in its own dtype), and the
    precision question proper: whether its float64 twin (the same weights) is right further, i.e. whether
    the failures are floating point's or the function the model computes."""
    from exactlens import tasks
    from exactlens.analysis.verify import precision_grid, scan_exactness
    from exactlens.devices import device_name, resolve_device
    from exactlens.interop.model_target import longest_of, model_target, on_device

    target = model_target(request.name, request.task, request.readout, request.params)
    longest = longest_of(target)
    max_length = request.max_length or (1000 if longest is None else min(1000, longest))
    if longest is not None and max_length > longest:
        raise ExactLensError(f"max_length {max_length} is beyond what {target.label} answers (|w| <= {longest}: its "
                             "position table or its task)")
    low = max(1, target.task.min_length)
    if max_length < low:
        raise ExactLensError(f"max_length {max_length} is below task {target.task.name!r}'s shortest length {low}")
    device = resolve_device(request.device, target.model.cfg.dtype)
    model = on_device(target.model, device)
    grid = precision_grid(low, max_length)
    tell(f"scanning {target.label} ({model.cfg.dtype}, {device}) up to length {max_length}")
    reader = tasks.reader(model, target.task)
    rows, max_exact, first_failure = scan_exactness(model, reader, grid, low, request.strings, request.seed)
    data: dict[str, Any] = {"name": target.label, "dtype": model.cfg.dtype, "params": {},
                            "device": device_name(model.device), "task": target.task.spec(),
                            "max_exact_length": max_exact, "first_failure_length": first_failure, "checked": rows,
                            "target": target.info}
    data["float64"] = _float64_check(model, reader, rows, request, first_failure)
    return data


def _float64_check(model: Any, reader: Any, rows: list, request: PrecisionRequest,
                   first_failure: int | None) -> dict[str, Any]:
    """The model's float64 twin on the lengths checked: the same errors mean the model's function is wrong
    there (training, not rounding); fewer mean floating point costs the model's dtype those words."""
    from exactlens.analysis.verify import _check_length
    from exactlens.devices import resolve_device
    from exactlens.interop.model_target import in_float64, on_device

    if first_failure is None:
        return {"applies": False, "reason": "no checked length fails: nothing for floating point to explain"}
    twin, how = in_float64(model)
    if twin is None:
        return {"applies": False, "reason": how}
    twin = on_device(twin, resolve_device(request.device, "float64"))
    errors = {r["length"]: _check_length(None, reader, twin, r["length"], request.strings, request.seed)["errors"]
              for r in rows}
    failing = [n for n, e in errors.items() if e]
    same = all(errors[r["length"]] == r["errors"] for r in rows)
    fewer = sum(errors.values()) < sum(r["errors"] for r in rows)
    cause = ("the model's function: its float64 twin makes as many errors at each length" if same else
             "floating point: its float64 twin makes fewer errors" if fewer else
             "both: float64 changes which words fail")
    return {"applies": True, "twin": how, "errors_by_length": {str(k): v for k, v in errors.items()},
            "first_failure_length": min(failing) if failing else None, "cause": cause}


def text(data: dict[str, Any]) -> str:
    line = (f"{data['name']} {data['dtype']}: exact up to {data['max_exact_length']}, first failure at "
            f"{data['first_failure_length']} ({len(data['checked'])} lengths checked)")
    f64 = data.get("float64")
    if f64 is not None:
        line += (f"\n  float64 twin: first failure at {f64['first_failure_length']}; cause: {f64['cause']}"
                 if f64["applies"] else f"\n  float64 twin: not checked ({f64['reason']})")
    return line


def plot(result: Result) -> Any:
    return per_length_plot(result["checked"], "errors", "wrong words",
                           f"{result['name']} ({result['dtype']}): exact up to {result['max_exact_length']}", log=True)


VIEW = View(lambda d: [("model" if "target" in d else "construction", d["name"]), ("dtype", d["dtype"]),
                       ("max exact length", d["max_exact_length"]), ("first failure", d["first_failure_length"]),
                       ("lengths checked", len(d["checked"]))],
            text, plot)

register_verb(VerbSpec("precision", "the largest length at which a construction is still exact", PrecisionRequest, run,
                       views={"precision": VIEW}, order=20))

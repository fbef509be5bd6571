"""``exactlens precision NAME``: the largest length at which a construction is still exact in a dtype."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from exactlens.requests import Int, option
from exactlens.results import Result, View
from exactlens.verbs import VerbSpec, register_verb, tell
from exactlens.verbs.common import ConstructionRequest, per_length_plot


@dataclass(frozen=True)
class PrecisionRequest(ConstructionRequest):
    max_length: int | None = option(None, kind=Int(1), help="longest length scanned (default 1000, or the "
                                    "construction's longest stated length)")
    strings: int = option(64, kind=Int(1), help="random strings per length, plus the hard ones")


def run(request: PrecisionRequest) -> Result:
    from exactlens.analysis.verify import precision
    from exactlens.constructions import get
    from exactlens.devices import resolve_device

    construction = get(request.name)
    model = construction.make(dtype=request.dtype, **request.params)  # bad names/parameters fail before any work
    max_length = request.max_length or construction.default_max_length(model)
    device = resolve_device(request.device, request.dtype)
    tell(f"scanning {request.name} ({request.dtype}, {device}) up to length {max_length}")
    return Result("precision", precision(request.name, dtype=request.dtype, max_length=max_length,
                                         strings=request.strings, seed=request.seed, params=request.params,
                                         device=device))


def text(data: dict[str, Any]) -> str:
    return (f"{data['name']} {data['dtype']}: exact up to {data['max_exact_length']}, first failure at "
            f"{data['first_failure_length']} ({len(data['checked'])} lengths checked)")


def plot(result: Result) -> Any:
    return per_length_plot(result["checked"], "errors", "wrong words",
                           f"{result['name']} ({result['dtype']}): exact up to {result['max_exact_length']}", log=True)


VIEW = View(lambda d: [("construction", d["name"]), ("dtype", d["dtype"]), ("max exact length", d["max_exact_length"]),
                       ("first failure", d["first_failure_length"]), ("lengths checked", len(d["checked"]))],
            text, plot)

register_verb(VerbSpec("precision", "the largest length at which a construction is still exact", PrecisionRequest, run,
                       views={"precision": VIEW}, order=20))

"""``exactlens verify NAME``: accuracy, cross-entropy and margin of a construction per length."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from exactlens.requests import Int, Lengths, option
from exactlens.results import Result, View
from exactlens.verbs import VerbSpec, register_verb, tell
from exactlens.verbs.common import ConstructionRequest, num, per_length_plot


@dataclass(frozen=True)
class VerifyRequest(ConstructionRequest):
    lengths: list | None = option(None, kind=Lengths(0), help="A:B[:STEP] (inclusive) or a,b,c; default 1:12 (up to "
                                  "the construction's longest)")
    strings: int = option(1000, kind=Int(1), help="random strings per length (short lengths: all)")


def run(request: VerifyRequest) -> Result:
    from exactlens.analysis.verify import verify
    from exactlens.constructions import get

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
    return [("construction", data["name"]), ("dtype", data["dtype"]), ("lengths", len(data["results"])),
            ("min accuracy", min(accuracies, default=None)),
            ("all exact", all(a == 1.0 for a in accuracies) and len(accuracies) == len(data["results"]))]


def plot(result: Result) -> Any:
    fig = per_length_plot(result["results"], "accuracy", "accuracy", f"{result['name']} ({result['dtype']})")
    fig.axes[0].set_ylim(-0.02, 1.02)
    return fig


register_verb(VerbSpec("verify", "accuracy and cross-entropy per length", VerifyRequest, run,
                       views={"verify": View(headline, text, plot)}, after=after, order=10))

"""``exactlens circuit NAME|CHECKPOINT_DIR``: the ground-truth circuit.

The circuit is read off the weights (exactlens.analysis.circuit.truth): the edges whose sender
writes a residual feature its receiver reads, with the features each carries. On the task's words
(every word of each length up to --words) it marks the edges that the ablation cannot move
(`constant`: under resample or mean those the same for every word of a length, under cross-length
those equal to their aligned source) and checks the circuit by resample (mean, cross-length) ablation:
ablating every edge outside it should change no decision, ablating one edge inside it should change
some (the edges where none changes are listed as `unnecessary`: redundant paths).
"""

from __future__ import annotations

from typing import Any

from exactlens.analysis.circuit.request import CircuitRequest, EdgeOptions
from exactlens.errors import ExactLensError
from exactlens.results import Result, View
from exactlens.verbs import VerbSpec, register_verb, tell

__all__ = ["CircuitRequest", "EdgeOptions", "format_circuit_text", "run"]


def foreign_target(request: Any) -> tuple[Any, dict[str, Any] | None]:
    """The request's target, or the ExactTransformer copy of a model exactlens did not build (with what was
    imported); ``task``/``readout`` for an exactlens model or a checkpoint are refused."""
    from exactlens.interop.foreign import is_foreign, resolve_model

    if not is_foreign(request.target) and request.task is not None:
        raise ExactLensError("task applies to a model exactlens did not build (a HookedTransformer, a "
                             "TransformerBridge), which records no task; an exactlens model answers its own")
    try:
        return resolve_model(request.target, request.task, request.readout)
    except ExactLensError as err:
        if not str(err).startswith("cannot read"):
            raise
        raise ExactLensError(f"{err}; this verb reads the weights or hooks of that copy (verify, precision and diff "
                             "read such a model through its own forward pass)") from None


def run(request: CircuitRequest) -> Result:
    from exactlens.analysis.circuit.evaluate import circuit_report
    from exactlens.markup.circuit import circuit_svg

    target, foreign = foreign_target(request)
    if foreign is not None:
        raise ExactLensError(
            f"circuit reads the circuit off a construction's weights (its named residual features); "
            f"{foreign['source']} has none: run `discover` with against=NAME (el.discover(model, 'eap', "
            f"against=..., task={foreign['task']['name']!r})) to find its circuit and compare it with a construction's")
    tell(f"circuit: deriving the circuit of {request.target}")
    data = circuit_report(target, granularity=request.granularity, lengths=request.lengths,
                          words=request.words, seed=request.seed, ablation=request.ablation, check=request.check,
                          out=request.out, overwrite=request.overwrite)
    return Result("circuit", data, svg=circuit_svg(data))


def format_circuit_text(result: dict[str, Any]) -> str:
    lines = [f"{result['model']}: {result['n_circuit_edges']} of {result['n_edges']} edges in the circuit "
             f"({result['granularity']} granularity; words of lengths {result['lengths']})",
             "  edge                          constant  features"]
    for e in result["edges"]:
        const = {True: "yes", False: "no", None: "-"}[e["constant"]]
        feats = ", ".join(e["features"][:6]) + (" ..." if len(e["features"]) > 6 else "")
        lines.append(f"  {e['edge']:<30}{const:<10}{feats}" + ("  (through layer norm)" if e["through_norm"] else ""))
    check = result.get("check")
    if check:
        lines.append(f"{result['ablation']} ablation on {check['n_words']} words: every edge outside the circuit "
                     f"ablated changes {check['outside_changed']} decisions; edges inside whose ablation alone "
                     f"changes none: {', '.join(check['unnecessary']) or 'none'}")
    if result.get("circuit_file"):
        lines.append(f"written in MIB's circuit format to {result['circuit_file']}")
    return "\n".join(lines)


def headline(d: dict[str, Any]) -> list[tuple[str, Any]]:
    rows = [("circuit edges", f"{d['n_circuit_edges']} of {d['n_edges']}"),
            ("constant edges", sum(1 for e in d["edges"] if e["constant"]))]
    if "check" in d:
        rows += [("decisions changed, outside ablated", d["check"]["outside_changed"]),
                 ("unnecessary circuit edges", ", ".join(d["check"]["unnecessary"]) or "none")]
    return rows


register_verb(VerbSpec("circuit", "the ground-truth circuit of a construction, checked by edge ablation",
                       CircuitRequest, run, views={"circuit": View(headline, format_circuit_text)},
                       description=__doc__.split("\n\n")[1], order=70))

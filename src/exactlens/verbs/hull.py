"""``exactlens hull [CHECKPOINT_DIR | NAME]``: unselectable keys.

With a target (a checkpoint directory, a construction name or, in Python, a model): the fraction of
unselectable keys per layer, before and after layer norm, and per head with the queries the head can
form (:func:`exactlens.analysis.hull.model.hull_report`). Without a target: the grid of standard-normal
random keys without and with layer norm (:func:`exactlens.analysis.hull.random.random_keys`, the
experiment of Brody et al.'s Fig. 1c/1d).
"""

from __future__ import annotations

from os import PathLike
from typing import Any

from exactlens.analysis.hull.request import HullRequest
from exactlens.results import Result, View
from exactlens.verbs import VerbSpec, register_verb, tell
from exactlens.viz.backend import pyplot

__all__ = ["format_hull_text", "run"]


def run(request: HullRequest) -> Result:
    from exactlens.analysis.hull.model import hull_report
    from exactlens.analysis.hull.random import random_keys
    from exactlens.analysis.hull.target import model_report
    from exactlens.devices import resolve_device

    if request.target is None:
        resolve_device(request.device)  # a device that is not there is refused here too
        tell("hull: no target given; unselectable random keys without and with layer norm (on the CPU)")
        return Result("hull", {**random_keys(seed=request.seed, tol=request.tol), "device": "cpu"})
    from exactlens.verbs.circuit import foreign_target

    target, foreign = foreign_target(request)
    tell(f"hull: analysing {request.target if foreign is None else foreign['source']}")
    if isinstance(target, (str, PathLike)):
        data = hull_report(target, tol=request.tol, seed=request.seed, lengths=request.lengths,
                           device=request.device)
    else:
        data = model_report(target, request, foreign)
    if foreign is not None:
        data["foreign"] = foreign
    return Result("hull", data)


def _pct(x: float | None) -> str:
    return "     -" if x is None else f"{100 * x:5.1f}%"


def format_hull_text(result: dict[str, Any]) -> str:
    """Human-readable table of a hull_report / random_keys result."""
    if "layers" not in result:  # random_keys
        lines = [f"random keys (Brody Fig. 1c/1d): mean fraction of unselectable N(0, I) keys, "
                 f"{result['trials']} trials "
                 f"(rows n, columns d)", "without LN:"]
        header = "   n \\ d " + " ".join(f"{d:6d}" for d in result["ds"])
        for name in ("without_ln", "with_ln"):
            if name == "with_ln":
                lines.append("with LN:")
            lines.append(header)
            rows = zip(result["ns"], result[name], strict=True)
            lines += [f"  {n:6d} " + " ".join(f"{v:6.3f}" for v in row) for n, row in rows]
        return "\n".join(lines)
    t = result["target"]
    label = t.get("name", t.get("path"))
    lines = [f"{label}: {result['n_sequences']} sequences, tol {result['tolerance']:g}",
             f"  {result['attention_input_note']}",
             "layer  before_ln  after_ln  per head (queries restricted to span(W_Q^T, b_Q); rank)"]
    for layer in result["layers"]:
        after = layer["after_ln"]["fraction_unselectable"] if layer["after_ln"] else None
        heads = "  ".join(f"h{h['head']}:{_pct(h['fraction_unselectable'])} (r{h['query_rank']})"
                          for h in layer["per_head"])
        lines.append(f"{layer['layer']:5d}     {_pct(layer['before_ln']['fraction_unselectable'])}"
                     f"    {_pct(after)}  {heads}")
    return "\n".join(lines)


def plot(result: Result) -> Any:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(5, 3))
    if "layers" in result:
        layers = result["layers"]
        ax.bar([f"layer {layer['layer']}" for layer in layers],
               [layer["before_ln"]["fraction_unselectable"] for layer in layers])
        ax.set_ylabel("unselectable fraction")
    else:
        for name in ("without_ln", "with_ln"):
            ax.plot(result["ds"], result[name][-1], marker=".", label=f"{name}, n = {result['ns'][-1]}")
        ax.set_xlabel("d")
        ax.legend(fontsize=7)
    return fig


VIEW = View(lambda d: ([(f"layer {layer['layer']} unselectable", layer["before_ln"]["fraction_unselectable"])
                        for layer in d["layers"]] if "layers" in d else [("random keys, trials", d["trials"])]),
            format_hull_text, plot)

register_verb(VerbSpec("hull", "fraction of unselectable keys per layer and head (convex-hull check)", HullRequest,
                       run, views={"hull": VIEW}, description=__doc__.split("\n\n")[1], order=60))

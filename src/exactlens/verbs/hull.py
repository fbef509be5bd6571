"""``exactlens hull [CHECKPOINT_DIR | NAME]``: unselectable keys.

With a target (a checkpoint directory, a construction name or, in Python, a model): the fraction of
unselectable keys per layer, before and after layer norm, and per head with the queries the head can
form (:func:`exactlens.analysis.hull.model.hull_report`). Without a target: the grid of standard-normal
random keys without and with layer norm (:func:`exactlens.analysis.hull.random.random_keys`, the
experiment of Brody et al.'s Fig. 1c/1d).
"""

from __future__ import annotations

from dataclasses import dataclass
from os import PathLike
from typing import Any

from exactlens.interop.readout import ReadoutKind
from exactlens.requests import Float, Int, Lengths, Text, option
from exactlens.results import Result, View
from exactlens.verbs import VerbSpec, register_verb, tell
from exactlens.verbs.common import device_option
from exactlens.viz.backend import pyplot

__all__ = ["HullRequest", "format_hull_text", "run"]


@dataclass(frozen=True)
class HullRequest:
    target: Any = option(None, positional=True, metavar="CHECKPOINT_DIR | NAME",
                         help="a checkpoint directory or a construction name (see `exactlens list`); omitted: "
                              "random keys without and with layer norm (Brody Fig. 1c/1d)")
    tol: float = option(1e-9, kind=Float(0.0, 1.0, open_lo=True, open_hi=True),
                        help="relative tolerance of the hull check (default 1e-9)")
    seed: int = option(0, kind=Int(0), help="seed of the sampled words / tokens / keys")
    lengths: list | None = option(None, kind=Lengths(0), help="word lengths whose keys are checked, A:B[:STEP] or "
                                  "a,b,c (default: a few up to the construction's longest); for a checkpoint "
                                  "directory, numbers of token positions (default 4, 8, 16)")
    device: Any = device_option("the model runs there; keys come back to the CPU for the linear programs")
    task: str | None = option(None, kind=Text(), metavar="NAME",
                              help="the task of a model that records none (a TransformerLens or Hugging Face model): "
                                   "its words are sampled")
    readout: Any = option(None, kind=ReadoutKind(), metavar="POSITION[/OUTPUTS]",
                          help="where such a model answers (default: the task's; see `exactlens task NAME`)")


def run(request: HullRequest) -> Result:
    from exactlens.analysis.hull.model import hull_report
    from exactlens.analysis.hull.random import random_keys
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


def model_report(model: Any, request: HullRequest, foreign: dict[str, Any] | None) -> dict[str, Any]:
    """hull_report's checkpoint analysis on a model object (an ExactTransformer, or a foreign model's copy).
    With a known task (the model's cfg.task, or the one named for a foreign model): four of the task's words
    per length, encoded as the model reads them (its token ids, [CLS] at its position), at ``lengths``
    (word lengths; default 3, 7, 15 less the task's special tokens, capped at the longest the model answers);
    without one: uniformly random token ids of its vocabulary at the default numbers of positions."""
    import torch

    from exactlens.analysis.hull.model import unselectable_by_layer
    from exactlens.devices import device_name, resolve_device
    from exactlens.errors import ExactLensError
    from exactlens.model import ExactTransformer

    if not isinstance(model, ExactTransformer):
        raise ExactLensError(f"hull takes a checkpoint directory, a construction name or a model (an "
                             f"ExactTransformer, HookedTransformer or TransformerBridge), got {type(model).__name__}")
    cfg = model.cfg
    where = resolve_device(request.device, cfg.dtype)
    gen = torch.Generator().manual_seed(int(request.seed))
    info = {"kind": "foreign" if foreign else "model", "name": cfg.model_name, "dtype": cfg.dtype,
            "sequences_per_length": 4, "seed": int(request.seed)}
    if cfg.task is not None:
        tokens, n_positions, lengths = _task_words(model, request.lengths, gen)
        info.update(lengths=lengths, positions=sorted({n + _task(model).n_specials for n in lengths}),
                    tokens=f"words of task {cfg.task['name']!r} (its token ids and special tokens)")
    else:
        tokens, n_positions, wanted = _random_ids(model, request.lengths, gen)
        info.update(positions=wanted, tokens="uniform random ids (the model records no task)")
    from exactlens.verbs.model_target import on_device

    result = unselectable_by_layer(on_device(model, where), tokens, n_positions=n_positions, tol=request.tol)
    return {"target": info, **result, "device": device_name(where)}


def _task(model: Any) -> Any:
    from exactlens import tasks

    return tasks.from_spec(model.cfg.task)


def _task_words(model: Any, lengths: list | None, gen: Any) -> tuple[Any, Any, list[int]]:
    from exactlens.analysis.hull.model import DEFAULT_CHECKPOINT_POSITIONS, _pad, encoded_words
    from exactlens.errors import ExactLensError
    from exactlens.verbs.model_target import ModelTarget, longest_of

    task = _task(model)
    longest = longest_of(ModelTarget(model, task, "", {}))
    low = max(1, task.min_length)
    if lengths is None:
        wanted = [max(low, n - task.n_specials) for n in DEFAULT_CHECKPOINT_POSITIONS]
        wanted = sorted({n if longest is None else min(n, longest) for n in wanted})
    else:
        wanted = sorted(set(lengths))
        for n in wanted:
            task.check_length(n)
            if longest is not None and n > longest:
                raise ExactLensError(f"length {n} is beyond what the model answers (|w| <= {longest}: its position "
                                     "table or its task)")
    tokens, n_positions = _pad(encoded_words(task, wanted, 4, gen))
    return tokens, n_positions, wanted


def _random_ids(model: Any, lengths: list | None, gen: Any) -> tuple[Any, Any, list[int]]:
    import torch

    from exactlens.analysis.hull.model import DEFAULT_CHECKPOINT_POSITIONS, _pad

    cfg = model.cfg
    wanted = sorted({min(n, cfg.n_ctx) if cfg.learned_positions else n
                     for n in (lengths or DEFAULT_CHECKPOINT_POSITIONS)})
    tokens, n_positions = _pad([torch.randint(0, cfg.d_vocab, (4, n), generator=gen) for n in wanted])
    return tokens, n_positions, wanted


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

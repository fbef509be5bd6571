"""The diff's parts, each declared once: its name, what it needs, the JSON sections and summary keys it
adds, and its function ``run(context, request) -> Done``.

Two kinds of steps: the *parts* a user asks for (``--parts``, ``parts=``: :data:`PARTS`), and the
*shared inputs* several parts read (``shared=True``: the words both models ran, the probe fits, the
head matching), computed only when a chosen part needs them and writing no section of their own.
:func:`plan` resolves the order from the needs (dependencies first, declaration order otherwise);
the orchestrator (:mod:`.orchestrator`) runs the plan and checks each step adds only what it declares.

Light at import (no torch): the command line reads :data:`PARTS` for ``--parts``; each step imports
its module when it runs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from exactlens.errors import ExactLensError

__all__ = ["Done", "PARTS", "Part", "STEPS", "plan"]


@dataclass
class Done:
    """What one step gives: JSON sections, summary numbers, and a ``value`` the steps that need it read
    (``context.values[name]``)."""

    sections: dict[str, Any] = field(default_factory=dict)
    summary: dict[str, Any] = field(default_factory=dict)
    value: Any = None


@dataclass(frozen=True)
class Part:
    """One step of the diff (module docstring). ``needs``: the steps whose values it reads."""

    name: str
    run: Callable[[Any, Any], Done]
    needs: tuple[str, ...] = ()
    sections: tuple[str, ...] = ()
    summary: tuple[str, ...] = ()
    shared: bool = False
    help: str = ""


def _mean(values: list[float | None]) -> float | None:
    import numpy as np

    kept = [v for v in values if v is not None]
    return float(np.mean(kept)) if kept else None


# ---- shared inputs ------------------------------------------------------------------------------------------


def _words(ctx: Any, request: Any) -> Done:
    from exactlens.analysis.diff.runs import run_exact, with_trained

    exact_runs = ctx.carry.get("exact_runs")  # a timeline's: the exact side run once for all its models
    if exact_runs is None:
        exact_runs = ctx.carry["exact_runs"] = run_exact(ctx.task, ctx.lengths, request.strings, request.seed,
                                                         ctx.exact)
    runs = with_trained(exact_runs, ctx.side)
    ctx.say(f"diff: ran both models on {sum(len(r.ids) for r in runs)} words")
    return Done(value=runs)


def _probe_fits(ctx: Any, request: Any) -> Done:
    from exactlens.analysis.diff.probes import feature_scopes, probe_table

    scopes = feature_scopes(ctx.exact_model, ctx.labels)
    table, maps = probe_table(ctx.values["words"], ctx.side, ctx.exact, ctx.labels, scopes, request.test_fraction,
                              request.seed)
    features = table["features"]
    ctx.say("diff: probes done")
    return Done(summary={"mean_best_r2": _mean([f["best_r2"] for f in features]),
                         "mean_best_r2_computed": _mean([f["best_r2"] for f in features
                                                         if f["exact_site"] != ctx.exact.sites[0]])},
                value=(table, maps))


def _head_matching(ctx: Any, request: Any) -> Done:
    import numpy as np

    from exactlens.analysis.diff.attention import attention_diff

    def patterns(acts: dict[str, Any], n_layers: int) -> dict[int, Any]:
        return {layer: acts[f"blocks.{layer}.attn.hook_pattern"] for layer in range(n_layers)}

    runs, task = ctx.values["words"], ctx.task
    table = attention_diff([patterns(r.trained_acts, ctx.side.n_layers) for r in runs],
                           [patterns(r.exact_acts, ctx.exact.n_layers) for r in runs], ctx.lengths,
                           ctx.exact.readout_position, task.symbol_offset if task.use_cls else None)
    distance = float(np.mean([m["distance"] for m in table["matching"]]))  # no head: NaN, as before
    return Done(summary={"mean_matched_attention_distance": distance}, value=table)


# ---- parts --------------------------------------------------------------------------------------------------

BEHAVIOUR_SUMMARY = ("agreement", "trained_accuracy", "exact_accuracy", "per_position_agreement", "trained_mse",
                     "exact_mse", "trained_r2")


def _behaviour(ctx: Any, request: Any) -> Done:
    from exactlens.analysis.diff.behaviour import behaviour_table

    table = behaviour_table(ctx.values["words"], ctx.side, ctx.exact)
    return Done({"behaviour": table}, {key: table[key] for key in BEHAVIOUR_SUMMARY if key in table})


def _probes(ctx: Any, request: Any) -> Done:
    return Done({"probes": ctx.values["probe_fits"][0]})


def _attention(ctx: Any, request: Any) -> Done:
    return Done({"attention": ctx.values["head_matching"]})


def _weights(ctx: Any, request: Any) -> Done:
    from exactlens.analysis.diff.weights import weights_table

    table = weights_table(ctx.values["words"], ctx.side, ctx.exact, ctx.values["head_matching"]["matching"])
    ctx.say("diff: weights done")
    return Done({"weights": table}, {
        "mean_qk_cosine": _mean([p["qk_cosine"] for p in table["pairs"] if p["qk_cosine"] is not None]),
        "mean_ov_cosine": _mean([p["ov_cosine"] for p in table["pairs"] if p["ov_cosine"] is not None])})


def _interventions(ctx: Any, request: Any) -> Done:
    from exactlens.analysis.diff.interventions import intervention_table

    table, maps = ctx.values["probe_fits"]
    out = intervention_table(ctx.values["words"], ctx.side, ctx.exact, table, maps, request.intervention_pairs,
                             request.seed)
    ctx.say("diff: interventions done")
    return Done({"interventions": out}, {"mean_iia": out["iia"], "mean_iia_changed": out["iia_changed"]})


ALIGNMENT_SUMMARY = ("mean_das_iia_changed", "mean_random_iia_changed", "mean_untrained_iia_changed",
                     "mean_das_iia_changed_task", "verdicts")  # one line per variable (alignment.verdicts)


def _alignment(ctx: Any, request: Any) -> Done:
    from exactlens import tasks
    from exactlens.analysis.diff.alignment import Settings, alignment_table, untrained_copy
    from exactlens.analysis.diff.runs import make_side
    from exactlens.analysis.diff.siit_sites import with_mapped_sites

    settings = Settings(max_dim=request.das_max_dim, steps=request.das_steps, pairs=request.alignment_pairs,
                        seed=request.seed, untrained=request.untrained_baseline,
                        warm_steps=getattr(request, "das_warm_steps", None), design=request.pairs)
    baseline = untrained_copy(ctx.model, request.seed + 1) if request.untrained_baseline else None
    if request.untrained_baseline and ctx.foreign is not None:  # the user's model: its own initializer
        from exactlens.interop.foreign import untrained_foreign

        baseline, how = untrained_foreign(ctx.foreign, ctx.task, ctx.readout, request.seed + 1)
        ctx.side.info["untrained_baseline"] = how
    untrained = None if baseline is None else make_side(baseline, {"kind": "untrained"},
                                                        tasks.reader(baseline, ctx.task),
                                                        ctx.exact.readout_position, False)
    table = alignment_table(ctx.values["words"], ctx.side, ctx.exact, ctx.values["probe_fits"][0]["features"],
                            settings, untrained, carry=ctx.carry)
    rows = table.pop("rows")
    ctx.say("diff: alignment done")
    summary = {key: table.get(key, {} if key == "verdicts" else None) for key in ALIGNMENT_SUMMARY}
    with_mapped_sites(summary["verdicts"], ctx.model)  # a SIIT checkpoint: its variables' known sites
    return Done({"alignment": rows, "alignment_details": table}, summary)


def _circuit(ctx: Any, request: Any) -> Done:
    from exactlens.analysis.diff.circuit import circuit_part

    out = circuit_part(ctx.model, ctx.exact_model, ctx.lengths, request.strings, request.seed,
                       ctx.values["head_matching"]["matching"], request.circuit_method, request.circuit_granularity,
                       request.circuit_ablation, carry=ctx.carry)
    summary = {} if not out["available"] else {"circuit_edge_auroc": out["edges"]["auroc"],
                                               "circuit_edge_jaccard": out["edges"]["jaccard"],
                                               # a post-LN model's every edge passes a norm that a norm-free
                                               # construction lacks: compare with norm chains joined too
                                               "circuit_edge_jaccard_between_components":
                                                   out["edges"]["between_components"]["jaccard"],
                                               "circuit_node_jaccard": out["nodes"]["jaccard"]}
    ctx.say("diff: circuit done")
    return Done({"circuit": out}, summary)


STEPS: tuple[Part, ...] = (
    Part("words", _words, shared=True, help="both models on the same words of every length, activations kept"),
    Part("behaviour", _behaviour, ("words",), ("behaviour",), BEHAVIOUR_SUMMARY,
         help="accuracy of each model and the agreement of their decisions, per length"),
    Part("probe_fits", _probe_fits, ("words",), (), ("mean_best_r2", "mean_best_r2_computed"), shared=True,
         help="ridge probes of every exact residual label at every trained site"),
    Part("probes", _probes, ("probe_fits",), ("probes",), help="the probe table"),
    Part("head_matching", _head_matching, ("words",), (), ("mean_matched_attention_distance",), shared=True,
         help="attention pattern distances and the optimal head matching"),
    Part("attention", _attention, ("head_matching",), ("attention",), help="the attention table"),
    Part("weights", _weights, ("words", "head_matching"), ("weights",), ("mean_qk_cosine", "mean_ov_cosine"),
         help="QK and OV circuits of matched heads in the exact basis"),
    Part("interventions", _interventions, ("words", "probe_fits"), ("interventions",),
         ("mean_iia", "mean_iia_changed"), help="interchange interventions along the probe directions"),
    Part("alignment", _alignment, ("words", "probe_fits"), ("alignment", "alignment_details"), ALIGNMENT_SUMMARY,
         help="distributed alignment search beside random and untrained baselines"),
    Part("circuit", _circuit, ("head_matching",), ("circuit",),
         ("circuit_edge_auroc", "circuit_edge_jaccard", "circuit_edge_jaccard_between_components",
          "circuit_node_jaccard"),
         help="the trained model's discovered circuit against the exact circuit"),
)

PARTS: tuple[str, ...] = tuple(step.name for step in STEPS if not step.shared)
"""The parts a user may ask for, in the order the JSON lists them."""


def plan(chosen: Sequence[str], steps: Sequence[Part] = STEPS) -> list[Part]:
    """The steps to run for the ``chosen`` parts: those and everything they need, each after its needs
    (ties in declaration order)."""
    by_name = {step.name: step for step in steps}
    wanted: set[str] = set()
    todo = list(chosen)
    while todo:
        name = todo.pop()
        if name not in by_name:
            raise ExactLensError(f"unknown diff step {name!r}; the steps: {', '.join(by_name)}")
        if name not in wanted:
            wanted.add(name)
            todo += by_name[name].needs
    order: list[Part] = []
    pending = [step for step in steps if step.name in wanted]
    while pending:
        ready = next((s for s in pending if all(n in {o.name for o in order} for n in s.needs)), None)
        if ready is None:
            raise ExactLensError(f"diff steps need each other in a circle: {', '.join(s.name for s in pending)}")
        order.append(ready)
        pending.remove(ready)
    return order

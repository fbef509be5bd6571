"""The shared inputs several parts read (``shared=True``): the words both models ran, the probe fits, the head
matching. Each runs only when a chosen part needs it and writes no section; the probe fits and the head
matching add summary numbers."""

from __future__ import annotations

from typing import Any

from exactlens.analysis.diff.parts.base import Done, Part, mean_of


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
    return Done(summary={"mean_best_r2": mean_of([f["best_r2"] for f in features]),
                         "mean_best_r2_computed": mean_of([f["best_r2"] for f in features
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


STEPS = (
    Part("words", _words, shared=True, order=0,
         help="both models on the same words of every length, activations kept"),
    Part("probe_fits", _probe_fits, ("words",), (), ("mean_best_r2", "mean_best_r2_computed"), shared=True,
         order=20, help="ridge probes of every exact residual label at every trained site"),
    Part("head_matching", _head_matching, ("words",), (), ("mean_matched_attention_distance",), shared=True,
         order=40, help="attention pattern distances and the optimal head matching"),
)

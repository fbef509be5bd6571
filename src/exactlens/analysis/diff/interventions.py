"""Causal part of the circuit diff: interchange interventions on the subspace of a named feature.

For a feature (residual label) whose probe found it at trained residual-stream site S (the earliest
``hook_resid_*`` site with the best held-out R^2: the residual stream is where layers pass features
on, while a wide FFN hidden layer may hold them redundantly in many directions), the
probe's weight vector w defines the direction u = w / |w| along which the trained model carries the
feature. An interchange intervention runs the trained model on a base word and, at S, replaces the
component of the activation along u by the counterfactual word's component:

    x' = x + ((x_cf - x) . u) u          (at every position, or only at the readout position for
                                          features that only the readout reads)

The exact model gets the same intervention on its own representation of the feature: at the site
where the label is settled (``exact_site``), dimension i of the label is set to the counterfactual's
value. The interchange-intervention accuracy (IIA, Geiger et al. 2021) is the fraction of
(base, counterfactual) pairs on which the two intervened models make the same decision;
``iia_changed`` restricts it to the pairs where the intervention changes the exact model's decision
(the informative ones: elsewhere a model that ignores the feature also scores 1). Each model's
outputs are decided by its own reader (the construction's decision rule; the trained model's
standard one), and a word counts as "the same decision" when every target position agrees.
Regression tasks have no decision to compare; their interventions are left to the alignment
part and reported as skipped.

Only features the exact model *computes* are intervened on. Input features (settled in the
embedding, e.g. ``I[w_i=0]``) are skipped: they are tied to each other on every word (one token per
position: I[w_i=0] + I[w_i=1] + I[w_i=CLS] = 1), so setting one alone leaves the words' manifold and
the direction "that carries it" in the trained model is not determined by the data.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from exactlens.analysis.diff.probes import feature_direction
from exactlens.analysis.diff.runs import Side, same_decisions
from exactlens.resources import memory_limit

READOUT_ONLY = True
"""Whether the exact variables' stacked swaps (the designed-pair search's and the random pairs' counterfactuals,
:func:`.alignment.variables.swapped_answers`) compute the exact model's last layer at the readout position only
where that gives the outputs of a full pass (:func:`readout_only_for`); tests/analysis/test_readout_only_swaps.py
and benchmarks/bench_pairs.py turn it off to compare."""

ROW_ACTIVATIONS = frozenset(("hook_embed", "hook_pos_embed", "hook_resid_pre", "hook_attn_out", "hook_resid_mid",
                             "hook_mlp_out", "hook_resid_post", "hook_scale", "hook_normalized"))
"""Hooks whose activations are [batch, pos, ...], one row per position, that a position-wise function of the
stream computes (under a readout-only pass, those of the last layer after its attention are [batch, 1, ...]:
the readout row alone)."""


def readout_only_for(side: Any, sites: list[str]) -> bool:
    """Whether a patched pass of ``side`` with hooks at ``sites`` may run its last layer at the readout position
    only (``ExactTransformer.run(..., readout_only=True)``) and give the outputs of a full pass: READOUT_ONLY is on,
    ``side`` is an ExactTransformer whose readout reads one position per word, and every site in or after the
    last layer is one of ROW_ACTIVATIONS. There a patch of a readout-only pass sees the readout row alone, which
    is all the readout reads after the attention (everything after it is position-wise): the patch is applied to
    that row (:func:`stacked_patched_outputs`, and a patch at another position of the last layer reaches no
    readout). A site of another kind in the last layer (the attention's queries, keys, pattern) runs in full."""
    if not READOUT_ONLY or not side.exact or side.model.cfg.readout == "per_position":
        return False
    last = side.n_layers - 1

    def before_last(site: str) -> bool:
        parts = site.split(".")
        return len(parts) > 2 and parts[0] == "blocks" and parts[1].isdigit() and int(parts[1]) < last

    return all(before_last(site) or site.rsplit(".", 1)[-1] in ROW_ACTIVATIONS for site in sites)


def _patched_outputs(
    side: Any,
    tokens: torch.Tensor,
    site: str,
    direction: np.ndarray,
    cf_acts: np.ndarray,
    positions: np.ndarray | None,
    n_positions: torch.Tensor,
) -> torch.Tensor:
    """The task outputs of the words with ``direction`` [d, r] (or [d]) at ``site`` set to ``cf_acts``' (at
    ``positions``; None: every one): :func:`stacked_patched_outputs` of one patch."""
    return stacked_patched_outputs(side, tokens, [(site, direction, cf_acts, positions)], n_positions)


def stacked_patched_outputs(side: Any, tokens: torch.Tensor, patches: list[tuple[str, np.ndarray, np.ndarray,
                                                                               np.ndarray | None]],
                            n_positions: torch.Tensor, readout_only: bool = False) -> torch.Tensor:
    """:func:`_patched_outputs` of several patches in one forward pass: copy k of the words [B, pos] (one length) is
    patched as patches[k] = (site, direction [d, r] or [d], source activations [B, pos, d], positions or None:
    every one) prescribes, and the task outputs of all copies come back stacked, copy k's at rows k*B .. (k+1)*B - 1.
    ``readout_only``: run an exact model's last layer at the readout position only where :func:`readout_only_for`
    allows it (a patch there gets the readout row of its source and positions). An ExactTransformer's hooks go on
    its hook points directly (TransformerLens's hooks() context resets every hook point on exit); another model's
    (HookedTransformer, TransformerBridge) through that context."""
    dtype = next(side.model.parameters()).dtype
    device = next(side.model.parameters()).device
    batch, n_pos, copies = int(tokens.shape[0]), int(tokens.shape[1]), len(patches)
    by_site: dict[str, list[int]] = {}
    for k, (site, _, _, _) in enumerate(patches):
        by_site.setdefault(site, []).append(k)
    only = readout_only and readout_only_for(side, list(by_site))
    rows = side.model.readout_rows(torch.full((batch,), n_pos, dtype=torch.long)) if only else None

    def hook_for(where: list[int]) -> Any:
        units = [torch.as_tensor(patches[k][1], dtype=dtype, device=device) for k in where]
        units = [u[:, None] if u.ndim == 1 else u for u in units]
        sources = [torch.as_tensor(patches[k][2], dtype=dtype, device=device) for k in where]
        keeps = []
        for k in where:
            positions = patches[k][3]
            keep = torch.ones(n_pos, dtype=dtype, device=device)
            if positions is not None:
                keep = torch.zeros(n_pos, dtype=dtype, device=device)
                keep[torch.as_tensor(positions)] = 1
            keeps.append(keep[None, :, None])
        at_rows = None
        if rows is not None:  # the same at the readout row of each word: [B, 1, d] and [B, 1, 1]
            pick = rows.to(device)
            at_rows = [(src[torch.arange(batch, device=device), pick][:, None], keep[0, pick, 0][:, None, None])
                       for src, keep in zip(sources, keeps, strict=True)]

        def hook(act: torch.Tensor) -> torch.Tensor:
            shaped = act.reshape(copies, batch, *act.shape[1:]).clone()
            here = zip(sources, keeps, strict=True) if act.shape[1] == n_pos or at_rows is None else at_rows
            for k, u, (src, keep) in zip(where, units, here, strict=True):
                delta = ((src - shaped[k]) @ u) @ u.T
                shaped[k] = shaped[k] + delta * keep
            return shaped.reshape(act.shape)
        return hook

    hooks = [(site, hook_for(where)) for site, where in by_site.items()]
    words = tokens.repeat(copies, *([1] * (tokens.ndim - 1)))
    if not side.exact:
        with torch.no_grad(), side.model.hooks(fwd_hooks=[(site, lambda act, hook=None, fn=fn: fn(act))
                                                          for site, fn in hooks]):
            logits = side.model(words)
        return side.outputs(logits.detach().cpu(), n_positions.repeat(copies))
    handles = [side.model.hook_dict[site].register_forward_hook(lambda module, args, out, fn=fn: fn(out))
               for site, fn in hooks]
    try:
        with torch.no_grad():  # outputs only: no graph of every copy's activations
            logits = side.model(words, readout_only=True) if only else side.model(words)
    finally:
        for handle in handles:
            handle.remove()
    return side.outputs(logits.detach().cpu(), n_positions.repeat(copies))


PASS_BYTES = 1 << 29  # activation memory one stacked patched forward pass may take (at most a quarter of the limit)


def copies_per_pass(side: Side, batch: int, n_pos: int, hooked: bool = False) -> int:
    """How many patched copies of ``batch`` words of ``n_pos`` positions one forward pass runs: as many as
    fit in PASS_BYTES (and a quarter of the memory limit) by the model's own estimate
    (``forward_bytes``; ``hooked``: as the model counts a pass with a hook attached, every layer's activations,
    which its own memory check applies to a pass without ``n_positions``) or, for another model, 16
    residual-width activations per layer and position."""
    budget = min(PASS_BYTES, memory_limit() // 4)
    model = side.model
    if hasattr(model, "forward_bytes"):
        per_copy = model.forward_bytes(batch, n_pos, hooked=hooked)
    else:
        item = torch.finfo(next(model.parameters()).dtype).bits // 8
        per_copy = 16 * max(side.n_layers, 1) * batch * n_pos * side.d_model * item
    return max(1, int(budget // max(per_copy, 1)))


def intervention_table(
    runs: list,
    trained: Any,
    exact: Any,
    probes: dict[str, Any],
    maps: dict,
    pairs_per_length: int,
    seed: int,
) -> dict[str, Any]:
    """The ``interventions`` part of the diff JSON: one entry per non-constant feature."""
    task = exact.reader.task
    if task.kind == "regression":
        return {"features": [], "skipped": [{"label": None, "reason": "regression task: no decision to compare"}],
                "iia": None, "iia_changed": None}
    rng = np.random.default_rng(seed + 1)
    pairings = []
    for run in runs:
        s = run.tokens.shape[0]
        k = min(pairs_per_length, s)
        pairings.append((rng.permutation(s)[:k], rng.permutation(s)[:k]))
    features, skipped = [], []
    for feat in probes["features"]:
        if feat["constant"] or feat["best_residual_site"] is None:
            skipped.append({"label": feat["label"], "reason": "constant on these words"})
            continue
        if feat["exact_site"] == exact.sites[0]:
            skipped.append({"label": feat["label"], "reason": "input feature (set by the embedding)"})
            continue
        label, t_site, e_site, i = feat["label"], feat["best_residual_site"], feat["exact_site"], feat["index"]
        u_t = feature_direction(maps[(label, t_site)])
        u_e = np.zeros(exact.d_model)
        u_e[i] = 1.0
        agree = changed = agree_changed = total = 0
        for run, (base, cf) in zip(runs, pairings, strict=True):
            rows = exact.model.readout_rows(run.n_positions)
            positions = np.array([int(rows[0])]) if feat["positions"] == "readout" and rows is not None else None
            index = torch.as_tensor(base)
            tokens, n_pos = run.tokens[index], run.n_positions[index]
            t_read = _patched_outputs(trained, tokens, t_site, u_t, run.trained_acts[t_site][cf], positions, n_pos)
            e_read = _patched_outputs(exact, tokens, e_site, u_e, run.exact_acts[e_site][cf], positions, n_pos)
            t_dec, e_dec = trained.reader.decide(t_read, n_pos), exact.reader.decide(e_read, n_pos)
            e_base = exact.reader.decide(run.exact_outputs[index], n_pos)
            same = same_decisions(task, t_dec, e_dec, n_pos, 0.0, run.truth[index])
            moved = ~same_decisions(task, e_dec, e_base, n_pos, 0.0, run.truth[index])
            agree += int(same.sum())
            changed += int(moved.sum())
            agree_changed += int((same & moved).sum())
            total += len(base)
        features.append(
            {
                "label": label,
                "trained_site": t_site,
                "exact_site": e_site,
                "r2": feat["best_residual_r2"],
                "positions": feat["positions"],
                "pairs": total,
                "iia": agree / total,
                "exact_changed": changed / total,
                "iia_changed": agree_changed / changed if changed else None,
            }
        )
    iias = [f["iia"] for f in features]
    changed_iias = [f["iia_changed"] for f in features if f["iia_changed"] is not None]
    return {
        "features": features,
        "skipped": skipped,
        "iia": float(np.mean(iias)) if iias else None,
        "iia_changed": float(np.mean(changed_iias)) if changed_iias else None,
    }

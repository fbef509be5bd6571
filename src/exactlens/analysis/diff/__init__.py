"""Circuit diff: a trained model against an exact construction, on the same words, through hooks.

``diff(trained, against)`` runs both models on words of the construction's task at a range of
lengths and compares them five ways (each a part of the returned JSON-ready dict), whatever the
task's kind, depth, width, head count, normalization or attention weighting of either model:

* ``behaviour``: accuracy of each model and how often their decisions agree, per length
  (per position for prediction tasks; MSE and R^2 for regression) (:mod:`.behaviour`).
* ``probes``: for every residual label of the exact model (a named feature such as ``k/n``) and
  every hook site of the trained model, the held-out R^2 of a ridge probe that reads the feature's
  exact value from the trained activations (:mod:`.probes`).
* ``attention``: per-head pattern distances, an optimal matching of trained heads to exact heads,
  and the attention from the readout position to the first symbol (:mod:`.attention`).
* ``weights``: QK and OV circuits of matched heads compared after mapping the trained residual
  basis onto the exact one; singular-value spectra (:mod:`.weights`).
* ``interventions``: interchange interventions along the probe direction of each feature, scored
  against what the exact circuit does under the same intervention (:mod:`.interventions`).
* ``alignment``: distributed alignment search: for every causal variable of the task and every
  computed residual label of the exact circuit, at every site and position set of the trained
  model, a learned subspace whose interchange gives the counterfactual answer; interchange-
  intervention accuracy on held-out pairs beside a random subspace and an untrained model
  (:mod:`.alignment`).
* ``circuit``: the trained model's circuit found by a discovery method (EAP by default) against the
  exact circuit read off the construction's weights: node and edge overlap after the head matching,
  AUROC of the trained scores, and the same method on the exact model as a check (:mod:`.circuit`).

The trained side is an :class:`~exactlens.model.ExactTransformer`, a checkpoint directory, a
construction name (two constructions of one task, e.g. palindrome vs palindrome-hash), or any
model with TransformerLens hook names and a ``cfg`` (e.g. a TransformerLens 4 ``TransformerBridge``).
Both models must answer the same task with the same vocabulary (same token ids are fed to both);
otherwise the diff stops with one line naming both. The orchestrator here depends on the parts;
no part imports it.
"""

from __future__ import annotations

import copy
import sys
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from exactlens import tasks
from exactlens.analysis.circuit.ablation import ABLATIONS
from exactlens.analysis.circuit.discovery import METHODS
from exactlens.analysis.circuit.graph import GRANULARITIES
from exactlens.analysis.diff.alignment import Settings, alignment_table, untrained_copy
from exactlens.analysis.diff.attention import attention_diff
from exactlens.analysis.diff.behaviour import behaviour_table
from exactlens.analysis.diff.circuit import DEFAULT_METHOD, circuit_part
from exactlens.analysis.diff.interventions import intervention_table
from exactlens.analysis.diff.probes import feature_scopes, probe_table
from exactlens.analysis.diff.runs import (
    DEFAULT_LENGTHS,
    check_vocab,
    describe,
    make_side,
    resolve_trained,
    run_both,
    trained_reader,
    usable_lengths,
)
from exactlens.analysis.diff.weights import weights_table
from exactlens.constructions.registry import get
from exactlens.devices import device_name, device_of, resolve_device
from exactlens.errors import ExactLensError
from exactlens.jsonio import jsonable

PARTS = ("behaviour", "probes", "attention", "weights", "interventions", "alignment", "circuit")

__all__ = ["DEFAULT_LENGTHS", "PARTS", "diff", "resolve_trained"]


def _progress(message: str, quiet: bool) -> None:
    if not quiet:
        print(message, file=sys.stderr, flush=True)


def _patterns(acts: dict[str, np.ndarray], n_layers: int) -> dict[int, np.ndarray]:
    return {layer: acts[f"blocks.{layer}.attn.hook_pattern"] for layer in range(n_layers)}


@torch.no_grad()
def diff(
    trained: Any,
    against: str,
    *,
    params: dict[str, Any] | None = None,
    lengths: Sequence[int] | None = None,
    strings: int = 64,
    seed: int = 0,
    exact_dtype: str = "float64",
    test_fraction: float = 0.3,
    intervention_pairs: int = 64,
    parts: Sequence[str] = PARTS,
    quiet: bool = True,
    das_max_dim: int = 3,
    das_steps: int = 80,
    alignment_pairs: int = 64,
    untrained_baseline: bool = True,
    circuit_method: str = DEFAULT_METHOD,
    circuit_granularity: str = "head",
    circuit_ablation: str = "resample",
    device: Any = None,
) -> dict[str, Any]:
    """Compare ``trained`` with the construction ``against`` (built with ``params``) on the same words.

    ``lengths``: word lengths |w| (default :data:`DEFAULT_LENGTHS`, keeping those both models accept;
    given explicitly, an unusable length is an error). ``strings`` random words per length plus the
    task's hard words (every word when there are at most ``strings``). ``parts`` selects the
    comparisons. ``das_max_dim``, ``das_steps``, ``alignment_pairs`` (per length) and
    ``untrained_baseline`` set the alignment search; ``circuit_method`` (patching, eap, acdc),
    ``circuit_granularity`` (head, qkv) and ``circuit_ablation`` (resample, mean, cross-length) the
    circuit comparison. ``device`` (exactlens.devices): where both models
    run (None: where the trained model is; a model passed in is copied there, not moved); words are
    drawn and every comparison is computed on the CPU. Returns a JSON-ready dict with the fields
    documented in docs/diff.md ("Circuit
    diff"); ``summary`` holds one number per part.
    """
    start = time.perf_counter()
    bad = [p for p in parts if p not in PARTS]
    if bad:
        raise ExactLensError(f"unknown diff parts {bad}; choose from {list(PARTS)}")
    if isinstance(strings, bool) or not isinstance(strings, int) or strings < 2:
        raise ExactLensError(f"strings must be an integer >= 2, got {strings!r}")
    for name, value, low in (("das_max_dim", das_max_dim, 1), ("das_steps", das_steps, 1),
                             ("alignment_pairs", alignment_pairs, 5), ("intervention_pairs", intervention_pairs, 1)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ExactLensError(f"{name} must be an integer >= {low}, got {value!r}")
    for name, value, allowed in (("circuit_method", circuit_method, METHODS),
                                 ("circuit_granularity", circuit_granularity, GRANULARITIES),
                                 ("circuit_ablation", circuit_ablation, ABLATIONS)):
        if value not in allowed:
            raise ExactLensError(f"{name} {value!r} is unknown; choose one of {', '.join(allowed)}")
    if not 0 < test_fraction < 1:
        raise ExactLensError(f"test_fraction must lie in (0, 1), got {test_fraction!r}")
    construction = get(against)
    params = dict(params or {})
    target = resolve_device(device, exact_dtype) if device is not None else None  # a bad device fails first
    exact_model = construction.make(dtype=exact_dtype, **params)
    task = tasks.of_model(exact_model)
    model, info = resolve_trained(trained)
    target = target if target is not None else device_of(model)
    if device_of(model) != target:  # the caller's own model is copied, one loaded here is moved
        model = (copy.deepcopy(model) if info["kind"] == "model" else model).to(target)
    exact_model.to(target)
    if hasattr(model, "eval"):
        model.eval()
    what = info.get("name") or info.get("path") or "the trained model"
    against_name = construction.name
    reader = trained_reader(model, task, what, against_name)  # different tasks: refused before anything else
    info.update(describe(model))
    info.update(check_vocab(model, task, what, against_name))
    exact = make_side(
        exact_model,
        {"name": construction.name, "paper": construction.paper, "params": params, **describe(exact_model)},
        tasks.reader(exact_model),
        exact_model.cfg.readout_position,
        True,
    )
    side = make_side(model, info, reader, exact.readout_position, False)
    used, skipped = usable_lengths(lengths, construction, task, side, exact)
    labels = [exact_model.residual_label(i) for i in range(exact.d_model)]
    runs = run_both(task, used, strings, seed, side, exact)
    _progress(f"diff: ran both models on {sum(len(r.ids) for r in runs)} words", quiet)

    result: dict[str, Any] = {
        "trained": info,
        "exact": exact.info,
        "task": task.spec(),
        "settings": {
            "lengths": used,
            "skipped_lengths": skipped,
            "strings": strings,
            "seed": seed,
            "exact_dtype": exact_dtype,
            "test_fraction": test_fraction,
            "intervention_pairs": intervention_pairs,
            "das_max_dim": das_max_dim,
            "das_steps": das_steps,
            "alignment_pairs": alignment_pairs,
            "untrained_baseline": untrained_baseline,
            "circuit_method": circuit_method,
            "circuit_granularity": circuit_granularity,
            "circuit_ablation": circuit_ablation,
            "parts": list(parts),
            "device": device_name(target),
        },
        "residual_labels": labels,
    }
    summary: dict[str, Any] = {}
    if "behaviour" in parts:
        result["behaviour"] = behaviour_table(runs, side, exact)
        for key in ("agreement", "trained_accuracy", "exact_accuracy", "per_position_agreement", "trained_mse",
                    "exact_mse", "trained_r2"):
            if key in result["behaviour"]:
                summary[key] = result["behaviour"][key]
    maps: dict[tuple[str, str], Any] = {}
    probes = None
    if {"probes", "interventions", "alignment"} & set(parts):
        probes, maps = probe_table(runs, side, exact, labels, feature_scopes(exact_model, labels), test_fraction, seed)
        best = [f["best_r2"] for f in probes["features"] if f["best_r2"] is not None]
        summary["mean_best_r2"] = float(np.mean(best)) if best else None
        computed = [
            f["best_r2"] for f in probes["features"] if f["best_r2"] is not None and f["exact_site"] != exact.sites[0]
        ]
        summary["mean_best_r2_computed"] = float(np.mean(computed)) if computed else None
        if "probes" in parts:
            result["probes"] = probes
        _progress("diff: probes done", quiet)
    matching = None
    if {"attention", "weights", "circuit"} & set(parts):
        attention = attention_diff(
            [_patterns(r.trained_acts, side.n_layers) for r in runs],
            [_patterns(r.exact_acts, exact.n_layers) for r in runs],
            used,
            exact.readout_position,
            task.symbol_offset if task.use_cls else None,
        )
        matching = attention["matching"]
        summary["mean_matched_attention_distance"] = float(np.mean([m["distance"] for m in matching]))
        if "attention" in parts:
            result["attention"] = attention
    if "weights" in parts:
        result["weights"] = weights_table(runs, side, exact, matching)
        pairs = [p for p in result["weights"]["pairs"] if p["qk_cosine"] is not None]
        summary["mean_qk_cosine"] = float(np.mean([p["qk_cosine"] for p in pairs])) if pairs else None
        ovs = [p["ov_cosine"] for p in result["weights"]["pairs"] if p["ov_cosine"] is not None]
        summary["mean_ov_cosine"] = float(np.mean(ovs)) if ovs else None
        _progress("diff: weights done", quiet)
    if "interventions" in parts:
        result["interventions"] = intervention_table(runs, side, exact, probes, maps, intervention_pairs, seed)
        summary["mean_iia"] = result["interventions"]["iia"]
        summary["mean_iia_changed"] = result["interventions"]["iia_changed"]
        _progress("diff: interventions done", quiet)
    if "alignment" in parts:
        settings = Settings(max_dim=das_max_dim, steps=das_steps, pairs=alignment_pairs, seed=seed,
                            untrained=untrained_baseline)
        baseline = untrained_copy(model, seed + 1) if untrained_baseline else None
        untrained_side = None
        if baseline is not None:
            untrained_side = make_side(baseline, {"kind": "untrained"}, tasks.reader(baseline, task),
                                       exact.readout_position, False)
        table = alignment_table(runs, side, exact, probes["features"], settings, untrained_side)
        result["alignment"] = table.pop("rows")
        result["alignment_details"] = table
        for key in ("mean_das_iia_changed", "mean_random_iia_changed", "mean_untrained_iia_changed",
                    "mean_das_iia_changed_task"):
            summary[key] = table[key]
        summary["verdicts"] = table.get("verdicts", {})  # issue 29: one line per variable (analysis/diff/verdicts.py)
        _progress("diff: alignment done", quiet)
    if "circuit" in parts:
        result["circuit"] = circuit_part(model, exact_model, used, strings, seed, matching, circuit_method,
                                         circuit_granularity, circuit_ablation)
        if result["circuit"]["available"]:
            summary["circuit_edge_auroc"] = result["circuit"]["edges"]["auroc"]
            summary["circuit_edge_jaccard"] = result["circuit"]["edges"]["jaccard"]
            summary["circuit_node_jaccard"] = result["circuit"]["nodes"]["jaccard"]
        _progress("diff: circuit done", quiet)
    result["summary"] = summary
    result["seconds"] = time.perf_counter() - start
    return jsonable(result)

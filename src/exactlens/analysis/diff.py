"""Circuit diff: a trained model against an exact construction, on the same words, through hooks.

``diff(trained, against)`` runs both models on words of the construction's language at a range of
lengths and compares them five ways (each a part of the returned JSON-ready dict):

* ``behaviour``: accuracy of each model and how often their decisions agree, per length.
* ``probes``: for every residual label of the exact model (a named feature such as ``k/n`` or
  ``I[w_i=1 & i=1]``) and every hook site of the trained model, the held-out R^2 of a ridge probe
  that reads the feature's exact value from the trained activations
  (:mod:`exactlens.analysis.diff_probe`).
* ``attention``: per-head pattern distances, an optimal matching of trained heads to exact heads,
  and the attention from CLS to the first symbol (:mod:`exactlens.analysis.diff_attention`).
* ``weights``: QK and OV circuits of matched heads compared after mapping the trained residual
  basis onto the exact one; singular-value spectra (:mod:`exactlens.analysis.diff_weights`).
* ``interventions``: interchange interventions on the subspace that carries each feature, scored
  against what the exact circuit does under the same intervention
  (:mod:`exactlens.analysis.diff_causal`).

The trained side is an :class:`~exactlens.model.ExactTransformer`, a checkpoint directory
(``ExactTransformer.load``), a construction name, or any model with TransformerLens hook names and
a ``cfg`` (e.g. a TransformerLens 4 ``TransformerBridge``). Every word is fed to both models as the
same token ids, so the trained model must use the construction language's vocabulary.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from exactlens.analysis.diff_attention import attention_diff
from exactlens.analysis.diff_probe import is_constant, probe, split_sequences
from exactlens.constructions.registry import Construction, get
from exactlens.errors import ExactLensError

DEFAULT_LENGTHS = (1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 24, 32)
SETTLE_TOLERANCE = 1e-6  # a label is settled at a site when it equals its final value to this (relative)


# ----------------------------------------------------------------------------- the two models


@dataclass
class Side:
    """One model of the diff with what the diff needs to know about it."""

    model: Any
    info: dict[str, Any]
    n_layers: int
    n_heads: int
    d_model: int
    normalization: str  # "none" | "post" | "pre"
    readout_position: int
    max_positions: int | None
    sites: list[str] = field(default_factory=list)  # residual-like hook sites, in depth order
    patch_sites: list[str] = field(default_factory=list)  # residual-stream sites used for interventions

    def run(self, tokens: torch.Tensor, names: set[str]) -> tuple[torch.Tensor, dict[str, np.ndarray]]:
        logits, cache = self.model.run_with_cache(tokens, names_filter=lambda n: n in names)
        return logits.detach(), {k: cache[k].detach().cpu().double().numpy() for k in names if k in cache}


def _is_exact(model: Any) -> bool:
    from exactlens.model import ExactTransformer

    return isinstance(model, ExactTransformer)


def _site_names(model: Any, n_layers: int, exact_side: bool) -> list[str]:
    hooks = set(getattr(model, "hook_dict", {}))
    names = ["blocks.0.hook_resid_pre"]
    for layer in range(n_layers):
        names.append(f"blocks.{layer}.hook_resid_mid")
        if not exact_side:
            names.append(f"blocks.{layer}.mlp.hook_post")
        names.append(f"blocks.{layer}.hook_resid_post")
    if not exact_side:
        names.append("ln_final.hook_normalized")
    return [n for n in names if n in hooks]


def _side(model: Any, info: dict[str, Any], readout_position: int, exact_side: bool) -> Side:
    cfg = getattr(model, "cfg", None)
    if cfg is None or not hasattr(model, "run_with_cache"):
        raise ExactLensError(
            f"the trained model must have TransformerLens hooks and a cfg (an ExactTransformer, a checkpoint "
            f"directory, a construction name or a TransformerBridge), got {type(model).__name__}"
        )
    if _is_exact(model):
        norm = cfg.uniform("normalization")
        if norm is None:
            raise ExactLensError(
                f"diff compares models with one normalization for all layers; this one has {cfg.normalization!r}"
            )
        readout = cfg.readout_position
        max_pos = cfg.n_ctx if cfg.learned_positions else None
    else:
        norm = "none" if getattr(cfg, "normalization_type", None) is None else "pre"
        readout = readout_position
        max_pos = getattr(cfg, "n_ctx", None)
    side = Side(model, info, int(cfg.n_layers), int(cfg.n_heads), int(cfg.d_model), norm, readout, max_pos)
    side.sites = _site_names(model, side.n_layers, exact_side)
    # Residual-stream sites for interventions. In a TransformerBridge an edit at hook_resid_mid did not
    # reach the output (measured on an exported `first`), so other models are patched at resid_pre/post.
    mid_ok = _is_exact(model)
    side.patch_sites = [n for n in side.sites if "hook_resid_" in n and (mid_ok or "resid_mid" not in n)]
    if not side.sites:
        raise ExactLensError(f"{type(model).__name__} has no hook blocks.0.hook_resid_pre / resid_mid / resid_post")
    return side


def _check_vocab(model: Any, vocab: tuple[str, ...], what: str) -> dict[str, Any]:
    cfg = model.cfg
    own = getattr(cfg, "vocab", None)
    if own is not None:
        if tuple(own) != tuple(vocab):
            raise ExactLensError(
                f"{what} has the vocabulary {list(own)} but the construction's language uses {list(vocab)} "
                "(same token ids are fed to both models: the vocabularies must be equal, in the same order)"
            )
        return {"vocab": list(vocab), "vocab_check": "names"}
    d_vocab = int(getattr(cfg, "d_vocab", -1))
    if d_vocab != len(vocab):
        raise ExactLensError(
            f"{what} has d_vocab={d_vocab} but the construction's language has {len(vocab)} tokens {list(vocab)}"
        )
    return {"vocab": list(vocab), "vocab_check": "size only (the model names no tokens)"}


def resolve_trained(trained: Any) -> tuple[Any, dict[str, Any]]:
    """A model and its description from a model, a checkpoint directory or a construction name."""
    if isinstance(trained, (str, Path)):
        path = Path(trained)
        if path.is_dir():
            from exactlens.model import ExactTransformer

            model = ExactTransformer.load(path)
            model.eval()
            return model, {"kind": "checkpoint", "path": str(path)}
        try:
            construction = get(str(trained))
        except ExactLensError as err:
            raise ExactLensError(
                f"{trained!r} is neither a checkpoint directory nor a construction name: {err}"
            ) from err
        return construction.make(dtype="float64"), {"kind": "construction", "name": construction.name}
    return trained, {"kind": "model"}


def _describe(model: Any) -> dict[str, Any]:
    cfg = model.cfg
    out = {
        "class": type(model).__name__,
        "n_layers": int(cfg.n_layers),
        "n_heads": int(cfg.n_heads),
        "d_model": int(cfg.d_model),
        "d_head": int(cfg.d_head),
    }
    if _is_exact(model):
        out.update(
            dtype=cfg.dtype,
            normalization=cfg.normalization,
            d_mlp=cfg.d_mlp,
            attn_length_scale=list(cfg.per_layer("attn_length_scale"))
            if hasattr(cfg, "per_layer")
            else cfg.attn_length_scale,
            model_name=cfg.model_name,
        )
    return out


# ----------------------------------------------------------------------------- words and runs


@dataclass
class LengthRun:
    """Everything recorded for the words of one length."""

    length: int
    ids: torch.Tensor  # symbol ids [S, length]
    tokens: torch.Tensor  # [S, n]
    exhaustive: bool
    truth: torch.Tensor
    trained_readout: torch.Tensor
    exact_readout: torch.Tensor
    trained_acts: dict[str, np.ndarray]
    exact_acts: dict[str, np.ndarray]


def _readout(side: Side, logits: torch.Tensor, exact_out: int) -> torch.Tensor:
    """The readout value at the readout position: [S] for one output, [S, k] otherwise. A trained
    model with two outputs against a one-logit (sigmoid) construction is read as logit(1) - logit(0)."""
    at = logits[:, side.readout_position].double()
    if at.shape[-1] == exact_out:
        return at[:, 0] if exact_out == 1 else at
    if exact_out == 1 and at.shape[-1] == 2:
        return at[:, 1] - at[:, 0]
    raise ExactLensError(
        f"the trained model has {at.shape[-1]} outputs per position but the construction reads {exact_out}; "
        "a sigmoid construction accepts a model with 1 output (the logit) or 2 (classes 0 = reject, 1 = accept)"
    )


def _words(construction: Construction, length: int, strings: int, gen: torch.Generator) -> tuple[torch.Tensor, bool]:
    lang = construction.lang()
    if len(lang.alphabet) ** length <= strings:
        return lang.all_words(length), True
    hard = lang.hard_words(length)  # e.g. FIRST's 1 0^(L-1), where the §5.2 model fails first
    return torch.cat([lang.sample(length, strings, gen), hard.long()]), False


def _patterns(acts: dict[str, np.ndarray], n_layers: int) -> dict[int, np.ndarray]:
    return {layer: acts[f"blocks.{layer}.attn.hook_pattern"] for layer in range(n_layers)}


def _check_lengths(
    lengths: Sequence[int] | None, construction: Construction, trained: Side, exact: Side
) -> tuple[list[int], list[dict[str, Any]]]:
    explicit = lengths is not None
    wanted = list(DEFAULT_LENGTHS if lengths is None else lengths)
    if not wanted:
        raise ExactLensError("lengths must not be empty")
    specials = construction.lang().n_specials
    kept, skipped = [], []
    for length in sorted(set(wanted)):
        if not isinstance(length, int) or isinstance(length, bool) or length < 0:
            raise ExactLensError(f"lengths must be integers >= 0, got {length!r}")
        reasons = []
        try:
            construction.check_length(length)
        except ExactLensError as err:
            reasons.append(str(err))
        for side, what in ((trained, "trained model"), (exact, "construction")):
            if side.max_positions is not None and length + specials > side.max_positions:
                reasons.append(f"{length + specials} positions exceed the {what}'s n_ctx={side.max_positions}")
        if reasons and explicit:
            raise ExactLensError(f"length {length}: " + "; ".join(reasons))
        if reasons:
            skipped.append({"length": length, "reason": "; ".join(reasons)})
        else:
            kept.append(length)
    if not kept:
        raise ExactLensError("no length is usable: " + "; ".join(s["reason"] for s in skipped))
    return kept, skipped


# ----------------------------------------------------------------------------- features and probes


@dataclass
class Rows:
    """Pooled rows (one per real position) of every length, for probes and alignment maps."""

    sequence: np.ndarray  # [N] sequence index (global over lengths)
    position: np.ndarray  # [N]
    is_readout: np.ndarray  # [N] bool


def _pool(runs: list[LengthRun], readout_position: int) -> Rows:
    seq, pos, ro = [], [], []
    offset = 0
    for run in runs:
        s, n = run.tokens.shape
        seq.append(np.repeat(np.arange(s) + offset, n))
        p = np.tile(np.arange(n), s)
        pos.append(p)
        ro.append(p == (readout_position % n))
        offset += s
    return Rows(np.concatenate(seq), np.concatenate(pos), np.concatenate(ro))


def pooled(runs: list[LengthRun], name: str, which: str) -> np.ndarray:
    """Activations at hook ``name`` of every position of every word, [N, d] (``which``: trained/exact)."""
    parts = []
    for run in runs:
        a = (run.trained_acts if which == "trained" else run.exact_acts)[name]
        parts.append(a.reshape(a.shape[0] * a.shape[1], -1))
    return np.concatenate(parts)


def _feature_scopes(exact_model: Any, labels: list[str]) -> list[str]:
    """'readout' for labels only the unembedding reads (e.g. the logit s), else 'all'."""
    w_u = exact_model.W_U.detach().double().abs().sum(-1).numpy()
    readers = np.zeros(len(labels))
    for block in exact_model.blocks:
        a = block.attn
        readers += a.W_Q.detach().double().abs().sum((0, 2)).numpy() + a.W_K.detach().double().abs().sum((0, 2)).numpy()
        readers += a.W_V.detach().double().abs().sum((0, 2)).numpy()
        if block.mlp is not None:
            readers += block.mlp.W_in.detach().double().abs().sum(1).numpy()
    return ["readout" if w_u[i] > 0 and readers[i] == 0 else "all" for i in range(len(labels))]


BEST_TOLERANCE = 0.005
"""best_site: the earliest site whose held-out R^2 is within this of the highest (where the trained
model has computed the feature, not where rounding happens to favour)."""


def _earliest_best(r2: dict[str, float | None], order: list[str]) -> tuple[str | None, float | None]:
    scored = {k: v for k, v in r2.items() if v is not None}
    if not scored:
        return None, None
    top = max(scored.values())
    site = next(k for k in order if k in scored and scored[k] >= top - BEST_TOLERANCE)
    return site, scored[site]


def probe_table(
    runs: list[LengthRun],
    trained: Side,
    exact: Side,
    labels: list[str],
    scopes: list[str],
    test_fraction: float,
    seed: int,
) -> tuple[dict[str, Any], dict[tuple[str, str], Any]]:
    """The ``probes`` part of the JSON and the fitted probe maps {(label, site): LinearMap}."""
    rows = _pool(runs, exact.readout_position)
    n_seq = int(rows.sequence.max()) + 1
    test_seq = split_sequences(n_seq, test_fraction, np.random.default_rng(seed))
    test_rows = test_seq[rows.sequence]
    final = pooled(runs, exact.sites[-1], "exact")
    exact_pooled = {site: pooled(runs, site, "exact") for site in exact.sites}
    trained_pooled = {site: pooled(runs, site, "trained") for site in trained.sites}
    features, maps = [], {}
    for i, label in enumerate(labels):
        mask = rows.is_readout if scopes[i] == "readout" else np.ones(len(rows.sequence), dtype=bool)
        y = final[mask, i]
        settled = next(
            site
            for site in exact.sites
            if np.all(np.abs(exact_pooled[site][mask, i] - y) <= SETTLE_TOLERANCE * (1 + np.abs(y).max()))
        )
        entry: dict[str, Any] = {
            "label": label,
            "index": i,
            "positions": scopes[i],
            "exact_site": settled,
            "constant": bool(is_constant(y)),
            "r2": {},
        }
        for site in trained.sites:
            result = probe(trained_pooled[site][mask], y, test_rows[mask])
            entry["r2"][site] = result.r2
            maps[(label, site)] = result.map
        entry["best_site"], entry["best_r2"] = _earliest_best(entry["r2"], trained.sites)
        residual = {k: v for k, v in entry["r2"].items() if k in trained.patch_sites}
        entry["best_residual_site"], entry["best_residual_r2"] = _earliest_best(residual, trained.sites)
        features.append(entry)
    out = {
        "sites": list(trained.sites),
        "exact_sites": list(exact.sites),
        "test_fraction": test_fraction,
        "rows": int(len(rows.sequence)),
        "sequences": n_seq,
        "held_out_sequences": int(test_seq.sum()),
        "features": features,
    }
    return out, maps


# ----------------------------------------------------------------------------- behaviour


def behaviour_table(runs: list[LengthRun], construction: Construction) -> dict[str, Any]:
    rows = []
    totals = np.zeros(4)
    for run in runs:
        e = construction.decide(run.exact_readout)
        t = construction.decide(run.trained_readout)
        n = len(run.truth)
        row = {
            "length": run.length,
            "strings": n,
            "exhaustive": run.exhaustive,
            "exact_accuracy": float((e == run.truth).double().mean()),
            "trained_accuracy": float((t == run.truth).double().mean()),
            "agreement": float((e == t).double().mean()),
        }
        totals += [n, row["exact_accuracy"] * n, row["trained_accuracy"] * n, row["agreement"] * n]
        rows.append(row)
    return {
        "rows": rows,
        "exact_accuracy": totals[1] / totals[0],
        "trained_accuracy": totals[2] / totals[0],
        "agreement": totals[3] / totals[0],
    }


# ----------------------------------------------------------------------------- the diff


def _progress(message: str, quiet: bool) -> None:
    if not quiet:
        print(message, file=sys.stderr, flush=True)


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
    parts: Sequence[str] = ("behaviour", "probes", "attention", "weights", "interventions"),
    quiet: bool = True,
) -> dict[str, Any]:
    """Compare ``trained`` with the construction ``against`` (built with ``params``) on the same words.

    ``lengths``: word lengths |w| (default :data:`DEFAULT_LENGTHS`, keeping those both models accept;
    given explicitly, an unusable length is an error). ``strings`` random words per length plus the
    language's hard words (every word when there are at most ``strings``). ``parts`` selects the
    comparisons. Returns a JSON-ready dict with the fields documented in the README ("Circuit
    diff"); ``summary`` holds one number per part.
    """
    from exactlens.analysis.diff_causal import intervention_table
    from exactlens.analysis.diff_weights import weights_table

    start = time.perf_counter()
    allowed_parts = ("behaviour", "probes", "attention", "weights", "interventions")
    bad = [p for p in parts if p not in allowed_parts]
    if bad:
        raise ExactLensError(f"unknown diff parts {bad}; choose from {list(allowed_parts)}")
    if isinstance(strings, bool) or not isinstance(strings, int) or strings < 2:
        raise ExactLensError(f"strings must be an integer >= 2, got {strings!r}")
    if not 0 < test_fraction < 1:
        raise ExactLensError(f"test_fraction must lie in (0, 1), got {test_fraction!r}")
    construction = get(against)
    params = dict(params or {})
    exact_model = construction.make(dtype=exact_dtype, **params)
    lang = construction.lang()
    model, info = resolve_trained(trained)
    if hasattr(model, "eval"):
        model.eval()
    info.update(_describe(model))
    info.update(_check_vocab(model, lang.vocab, "the trained model"))
    exact = _side(
        exact_model,
        {"name": construction.name, "paper": construction.paper, "params": params, **_describe(exact_model)},
        exact_model.cfg.readout_position,
        True,
    )
    side = _side(model, info, exact.readout_position, False)
    used, skipped = _check_lengths(lengths, construction, side, exact)
    labels = [exact_model.residual_label(i) for i in range(exact.d_model)]

    gen = torch.Generator().manual_seed(int(seed))
    exact_out = exact_model.cfg.d_vocab_out
    t_names = set(side.sites) | {f"blocks.{layer}.attn.hook_pattern" for layer in range(side.n_layers)}
    t_names |= {f"blocks.{layer}.hook_resid_pre" for layer in range(side.n_layers)}
    t_names |= {f"blocks.{layer}.ln1.hook_normalized" for layer in range(side.n_layers)}
    e_names = set(exact.sites) | {f"blocks.{layer}.attn.hook_pattern" for layer in range(exact.n_layers)}
    e_names |= {f"blocks.{layer}.hook_resid_pre" for layer in range(exact.n_layers)}
    runs = []
    for length in used:
        ids, exhaustive = _words(construction, length, strings, gen)
        tokens = lang.encode(ids).tokens
        t_logits, t_acts = side.run(tokens, t_names)
        e_logits, e_acts = exact.run(tokens, e_names)
        runs.append(
            LengthRun(
                length,
                ids,
                tokens,
                exhaustive,
                lang.membership(ids),
                _readout(side, t_logits, exact_out),
                _readout(exact, e_logits, exact_out),
                t_acts,
                e_acts,
            )
        )
    _progress(f"diff: ran both models on {sum(len(r.ids) for r in runs)} words", quiet)

    result: dict[str, Any] = {
        "trained": info,
        "exact": exact.info,
        "settings": {
            "lengths": used,
            "skipped_lengths": skipped,
            "strings": strings,
            "seed": seed,
            "exact_dtype": exact_dtype,
            "test_fraction": test_fraction,
            "intervention_pairs": intervention_pairs,
            "parts": list(parts),
        },
        "residual_labels": labels,
    }
    summary: dict[str, Any] = {}
    if "behaviour" in parts:
        result["behaviour"] = behaviour_table(runs, construction)
        summary["agreement"] = result["behaviour"]["agreement"]
        summary["trained_accuracy"] = result["behaviour"]["trained_accuracy"]
        summary["exact_accuracy"] = result["behaviour"]["exact_accuracy"]
    maps: dict[tuple[str, str], Any] = {}
    if {"probes", "interventions"} & set(parts):
        scopes = _feature_scopes(exact_model, labels)
        table, maps = probe_table(runs, side, exact, labels, scopes, test_fraction, seed)
        result["probes"] = table
        best = [f["best_r2"] for f in table["features"] if f["best_r2"] is not None]
        summary["mean_best_r2"] = float(np.mean(best)) if best else None
        computed = [
            f["best_r2"] for f in table["features"] if f["best_r2"] is not None and f["exact_site"] != exact.sites[0]
        ]
        summary["mean_best_r2_computed"] = float(np.mean(computed)) if computed else None
        _progress("diff: probes done", quiet)
    if {"attention", "weights"} & set(parts):
        first_key = 1 if lang.use_cls else 0
        query = exact.readout_position
        result["attention"] = attention_diff(
            [_patterns(r.trained_acts, side.n_layers) for r in runs],
            [_patterns(r.exact_acts, exact.n_layers) for r in runs],
            used,
            query,
            first_key,
        )
        matched = result["attention"]["matching"]
        summary["mean_matched_attention_distance"] = float(np.mean([m["distance"] for m in matched]))
    if "weights" in parts:
        result["weights"] = weights_table(runs, side, exact, result["attention"]["matching"])
        pairs = [p for p in result["weights"]["pairs"] if p["qk_cosine"] is not None]
        summary["mean_qk_cosine"] = float(np.mean([p["qk_cosine"] for p in pairs])) if pairs else None
        ovs = [p["ov_cosine"] for p in result["weights"]["pairs"] if p["ov_cosine"] is not None]
        summary["mean_ov_cosine"] = float(np.mean(ovs)) if ovs else None
        _progress("diff: weights done", quiet)
    if "interventions" in parts:
        result["interventions"] = intervention_table(
            runs, side, exact, construction, result["probes"], maps, intervention_pairs, seed
        )
        summary["mean_iia"] = result["interventions"]["iia"]
        summary["mean_iia_changed"] = result["interventions"]["iia_changed"]
        _progress("diff: interventions done", quiet)
    if "probes" not in parts:
        result.pop("probes", None)
    if "attention" not in parts:
        result.pop("attention", None)
    result["summary"] = summary
    result["seconds"] = time.perf_counter() - start
    return _finite(result)


def _finite(obj: Any) -> Any:
    """NaN/inf -> None everywhere (strict JSON), numpy scalars -> Python numbers."""
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    if isinstance(obj, (float, np.floating)):
        return float(obj) if np.isfinite(obj) else None
    if isinstance(obj, np.integer):
        return int(obj)
    if isinstance(obj, np.bool_):
        return bool(obj)
    return obj

"""Chiang & Cholak (2022) Fig. 2 and Fig. 3, recomputed on the registered constructions.

Fig. 2 (§3.4, §4.3): cross-entropy in bits per string of the exact PARITY and FIRST
solutions over random strings of length n. Fig. 3 (§5.1): cross-entropy and accuracy
of the PARITY solution with layer norm (eps = 0) as the one parameter W̄^{V,1,1}_{6,2}
-- the weight that writes k/n, 1 in the construction -- moves away from 1.

Which models. Fig. 2's caption says that with layer norm and eps = 0 "cross-entropy is
independent of n", and §4.3 ties this to Proposition 2. The §4.1 models alone
(parity-ln, first-ln) do not behave so: layer norm rescales the whole residual vector,
whose norm is dominated by coordinates of size 1, so the logit still shrinks with n
and the cross-entropy still tends to 1 bit, with eps = 0 as with eps = 1e-5 (we measure
both). Flat curves need the Prop. 2 layer (parity-ln-eta, first-ln-eta), which maps
the logit s to ±sqrt(d/2) when eps = 0, and to about s / sqrt(eps) once s^2 << eps when
eps > 0. So fig2_data draws five curves per language (FIG2_CURVES): no layer norm;
§4.1 with eps = 1e-5 and with eps = 0; §4.1 + Prop. 2 with eps = 1e-5 and with eps = 0
(the Prop. 2 model with every layer norm's eps set to 1e-5). Likewise Fig. 3 reports
parity-ln (eps = 0) and parity-ln-eta: the paper's "cross-entropy of 0 at 1" is the
latter's.

How they are evaluated. Scoring every one of 1000 strings of length 1000 costs one to
two minutes per model on two CPU cores, so by default (fast=True) two exact shortcuts
are taken:

1. One sampled string per *class* of strings that the construction cannot tell apart,
   weighted by the size of its class. PARITY: same length, same number k of 1s
   (Appendix A gives s as a function of (n, k); with layer norm this stays true,
   since the symbols 0 and 1 are one-hot vectors of equal norm, so every layer-norm
   scale depends on (i, n, k) only, and the Fig. 3 perturbation only rescales k/n).
   FIRST: same length, same first symbol (eq. 1: every other position has a zero key
   and a zero value).
2. A §4.1 + Prop. 2 model is its §4.1 model followed by one layer whose attention
   writes 0 (W^V = 0) and whose FFN and layer norms act on each position alone. So
   its logit is that layer applied to the §4.1 model's CLS vector after its last
   layer: one run of the §4.1 model, with a hook on that vector, gives both logits.

The strings are those :func:`exactlens.analysis.verify.verify` draws (same sampler,
same seeds), so the numbers equal verify()'s in exact arithmetic; in floating point
they may differ in the last bits. fast=False calls verify() with every full model on
every string (the tests compare the two).
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from exactlens.analysis.verify import log_grid, outputs_of, verify, words_for_length
from exactlens.constructions.registry import get
from exactlens.errors import ExactLensError
from exactlens.model import ExactTransformer
from exactlens.outputs import save_figure
from exactlens.progress import say
from exactlens.tasks import Parity, kinds
from exactlens.viz.backend import pyplot

LANGUAGES = ("PARITY", "FIRST")
NAMES = {  # language -> (no layer norm, §4.1, §4.1 + Prop. 2)
    "PARITY": ("parity", "parity-ln", "parity-ln-eta"),
    "FIRST": ("first", "first-ln", "first-ln-eta"),
}
DEFAULT_ETA = 0.01  # bits per string: the Prop. 2 models' target cross-entropy


@dataclass(frozen=True)
class Fig2Curve:
    setting: str  # the legend entry
    eps: float | None  # layer-norm eps; None = no layer norm
    prop2: bool = False  # with the Prop. 2 layer


FIG2_CURVES = (
    Fig2Curve("no layer norm", None),
    Fig2Curve("layer norm eps=1e-5", 1e-5),
    Fig2Curve("layer norm eps=0", 0.0),
    Fig2Curve("layer norm + Prop. 2, eps=1e-5", 1e-5, prop2=True),
    Fig2Curve("layer norm + Prop. 2, eps=0", 0.0, prop2=True),
)

# Fig. 3's parameter: layer 1, head 1, W̄^V row 6 (k/n), column 2 (I[w_i=1]) in the
# paper's 1-based (output, input) indexing. TransformerLens's W_V is [head, d_model
# (input), d_head (output)], and the §4.1 value map has W_O = I, so it is
# blocks[0].attn.W_V[0, 1, 5]; its mirror W_V[0, 1, 14] = -1 is left alone, as in the paper.
FIG3_PARAMETER = "blocks.0.attn.W_V[0, 1, 5]"
FIG3_INDEX = (0, 1, 5)


# ---- models --------------------------------------------------------------------------


def prop2_model(language: str, eps: float, eta: float = DEFAULT_ETA, dtype: str = "float32") -> ExactTransformer:
    """The §4.1 + Prop. 2 model with every layer norm's eps set to ``eps``."""
    model = get(NAMES[language][2]).make(dtype=dtype, eta=eta)
    if eps == model.cfg.ln_eps:
        return model
    cfg = model.cfg.replace(ln_eps=eps, metadata=dict(model.cfg.metadata, ln_eps=eps))
    changed = ExactTransformer(cfg)
    changed.load_state_dict(model.state_dict())
    changed.eval()
    return changed


def curve_model(language: str, curve: Fig2Curve, eta: float = DEFAULT_ETA, dtype: str = "float32"
                ) -> tuple[str, dict[str, Any], ExactTransformer]:
    """(registered name, parameters, the full model) of one Fig. 2 curve."""
    plain, ln, eta_name = NAMES[language]
    if curve.eps is None:
        return plain, {}, get(plain).make(dtype=dtype)
    if not curve.prop2:
        return ln, {"eps": curve.eps}, get(ln).make(dtype=dtype, eps=curve.eps)
    return eta_name, {"eta": eta, "ln_eps": curve.eps}, prop2_model(language, curve.eps, eta, dtype)


class Prop2Tail:
    """The last (Prop. 2) layer and readout of a §4.1 + Prop. 2 model, applied to CLS
    vectors [batch, d_model] taken after the §4.1 model's last layer: the model's own forward
    from its last layer (``start_at_layer``) on one position per word, which is exact because
    that layer's attention writes 0 (W_V = b_V = b_O = 0) whatever it attends to."""

    def __init__(self, model: ExactTransformer):
        if model.cfg.readout != "sigmoid" or model.cfg.readout_position != 0:
            raise ExactLensError("Prop2Tail needs a sigmoid readout at CLS (position 0)")
        attn = model.blocks[-1].attn
        if any(bool(t.detach().any()) for t in (attn.W_V, attn.b_V, attn.b_O)):
            raise ExactLensError("Prop2Tail needs a last layer whose attention writes 0 (W_V = b_V = b_O = 0)")
        self.model = model

    @torch.no_grad()
    def __call__(self, cls_vectors: torch.Tensor) -> torch.Tensor:
        x = cls_vectors[:, None, :].to(self.model.cfg.torch_dtype)
        return self.model(x, start_at_layer=self.model.cfg.n_layers - 1)[:, 0, 0]


@torch.no_grad()
def logits_and_cls(model: ExactTransformer, tokens: torch.Tensor, n_positions: torch.Tensor | None = None
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """Readout logits [batch] and the CLS vector after the last layer [batch, d_model].

    Without n_positions, verify's chunked readout; with it (right-padded rows), one run of the model."""
    captured: list[torch.Tensor] = []

    def keep(act: torch.Tensor, hook: Any) -> None:
        captured.append(act[:, 0, :].clone())

    with model.hooks(fwd_hooks=[(f"blocks.{model.cfg.n_layers - 1}.hook_resid_post", keep)]):
        logits = outputs_of(model, tokens, n_positions)
    return logits, torch.cat(captured)


# ---- classes of strings the constructions cannot tell apart ---------------------------


def class_keys(language: str, ids: torch.Tensor) -> torch.Tensor:
    """The class of each word [batch, length] -> [batch]: number of 1s for PARITY,
    the first symbol for FIRST (see the module docstring for why these suffice)."""
    if language == "parity":
        return ids.sum(dim=1)
    if language == "first":
        return ids[:, 0] if ids.shape[1] else torch.zeros(ids.shape[0], dtype=torch.long)
    raise ExactLensError(f"no string classes are known for language {language!r} (known: parity, first)")


def representatives(language: str, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(one word per class -- the first one drawn --, the number of words in its class)."""
    keys = class_keys(language, ids)
    _, inverse, counts = torch.unique(keys, return_inverse=True, return_counts=True)
    first = torch.full((counts.shape[0],), ids.shape[0], dtype=torch.long)
    first = first.scatter_reduce(0, inverse, torch.arange(ids.shape[0]), reduce="amin")
    return ids[first], counts


def cross_entropy_bits(logits: torch.Tensor, truth: torch.Tensor) -> torch.Tensor:
    """Bits per string of sigmoid logits [batch] against membership bits (float64)."""
    return kinds.cross_entropy_bits(Parity(), logits, truth, torch.zeros_like(truth, dtype=torch.long))


def weighted_scores(logits: torch.Tensor, truth: torch.Tensor, counts: torch.Tensor) -> dict[str, float]:
    """Accuracy and mean cross-entropy (bits) of class representatives weighted by class size (every
    construction here accepts iff its logit is > 0, the membership kind's standard rule)."""
    weights = counts.double() / counts.sum()
    correct = ((logits > 0) == truth).double()
    return {
        "accuracy": float((correct * weights).sum()),
        "cross_entropy_bits": float((cross_entropy_bits(logits, truth) * weights).sum()),
        "min_abs_logit": float(logits.abs().min()),
    }


# ---- Fig. 2 ------------------------------------------------------------------------


def _curve_entry(name: str, params: dict[str, Any], rows: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "construction": name,
        "params": params,
        "cross_entropy_bits": [r["cross_entropy_bits"] for r in rows],
        "accuracy": [r["accuracy"] for r in rows],
        "min_abs_logit": [r["min_abs_logit"] for r in rows],
        "strings": [r["strings"] for r in rows],
    }


def _fast_curves(language: str, eps: float | None, lengths: Sequence[int], strings: int, seed: int, dtype: str,
                 eta: float) -> dict[str, list[dict[str, Any]]]:
    """Rows per length of the curves sharing one base model (eps None: no layer norm;
    otherwise §4.1 and §4.1 + Prop. 2)."""
    base_curve = next(c for c in FIG2_CURVES if c.eps == eps and not c.prop2)
    name, _, base = curve_model(language, base_curve, eta, dtype)
    construction = get(name)
    lang = construction.task_of()
    tail = Prop2Tail(prop2_model(language, eps, eta, dtype)) if eps is not None else None
    out: dict[str, list[dict[str, Any]]] = {"base": [], "prop2": []}
    for length in lengths:
        construction.check_length(length)
        ids, _ = words_for_length(lang, length, strings, seed, exhaustive_limit=4096)
        reps, counts = representatives(construction.task, ids)
        truth = lang.membership(reps)
        logits, cls = logits_and_cls(base, lang.encode(reps).tokens)
        common = {"length": length, "strings": int(ids.shape[0]), "classes": int(reps.shape[0])}
        out["base"].append({**common, **weighted_scores(logits, truth, counts)})
        if tail is not None:
            out["prop2"].append({**common, **weighted_scores(tail(cls), truth, counts)})
    return out


def fig2_data(max_length: int = 1000, strings: int = 1000, points_per_decade: int = 8, seed: int = 0,
              dtype: str = "float32", eta: float = DEFAULT_ETA, fast: bool = True) -> dict[str, Any]:
    """Fig. 2: cross-entropy (bits/string) of the exact solutions against |w|
    (the paper plots the same against its n = |w| + 1).

    Lengths lie on a logarithmic grid from 1 to max_length; at each, ``strings``
    random strings (all strings where there are at most 4096). Returns
    ``{"lengths": [...], "settings": [...], "curves": {"PARITY"|"FIRST": {setting:
    {"construction", "params", "cross_entropy_bits", "accuracy", "min_abs_logit",
    "strings"}}}, ...}``, one list entry per length; settings as in FIG2_CURVES.
    """
    if max_length < 1 or strings < 1 or points_per_decade < 1:
        raise ExactLensError("fig2_data needs max_length >= 1, strings >= 1 and points_per_decade >= 1")
    lengths = log_grid(max_length, points_per_decade)
    curves: dict[str, dict[str, Any]] = {lang: {} for lang in LANGUAGES}
    timings: dict[str, float] = {}
    start = time.perf_counter()
    for language in LANGUAGES:
        for eps in dict.fromkeys(c.eps for c in FIG2_CURVES):
            t0 = time.perf_counter()
            group = [c for c in FIG2_CURVES if c.eps == eps]
            say(f"fig2: {language}, {', '.join(c.setting for c in group)}: "
                      f"{len(lengths)} lengths up to {max_length}, {strings} strings each")
            if fast:
                rows = _fast_curves(language, eps, lengths, strings, seed, dtype, eta)
            for curve in group:
                name, params, model = curve_model(language, curve, eta, dtype)
                if fast:
                    result_rows = rows["prop2" if curve.prop2 else "base"]
                else:
                    result_rows = verify(name, lengths, strings=strings, dtype=dtype, seed=seed, model=model)["results"]
                curves[language][curve.setting] = _curve_entry(name, params, result_rows)
            timings[f"{language} eps={eps}"] = time.perf_counter() - t0
    return {
        "figure": "Chiang & Cholak 2022, Fig. 2",
        "quantity": "mean cross-entropy, bits per string",
        "lengths": lengths,
        "strings": strings,
        "seed": seed,
        "dtype": dtype,
        "eta": eta,
        "method": "fast (string classes, shared §4.1 prefix)" if fast else "verify() on every string",
        "settings": [c.setting for c in FIG2_CURVES],
        "curves": curves,
        "timings": timings,
        "seconds": time.perf_counter() - start,
    }


def fig2_rows(data: dict[str, Any], lengths: Sequence[int] | None = None) -> list[dict[str, Any]]:
    """Flat table rows {"length": n, "<LANGUAGE> / <setting>": bits, ...} (default: every length)."""
    wanted = set(data["lengths"] if lengths is None else lengths)
    rows = []
    for j, n in enumerate(data["lengths"]):
        if n in wanted:
            row: dict[str, Any] = {"length": n}
            for language in LANGUAGES:
                for setting in data["settings"]:
                    row[f"{language} / {setting}"] = data["curves"][language][setting]["cross_entropy_bits"][j]
            rows.append(row)
    return rows


# ---- Fig. 3 ------------------------------------------------------------------------


def default_fig3_values() -> list[float]:
    """0.9 .. 1.1 in steps of 0.005, and 0.99 .. 1.01 in steps of 0.0005 (1 included)."""
    coarse = {round(0.9 + 0.005 * j, 6) for j in range(41)}
    fine = {round(0.99 + 0.0005 * j, 6) for j in range(41)}
    return sorted(coarse | fine | {1.0})


def _class_batch(construction: Any, lang: Any, drawn: torch.Tensor, gen: torch.Generator
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """One right-padded batch of class representatives over all lengths (padding keys are masked and positions
    use each row's own n), so each value is one model run: tokens, n_positions, each class's truth and size."""
    rows, truths, sizes, n_positions = [], [], [], []
    for length in sorted(set(drawn.tolist())):
        ids = lang.sample(length, int((drawn == length).sum()), gen)
        reps, counts = representatives(construction.task, ids)
        tokens = lang.encode(reps).tokens
        rows += list(tokens)
        truths.append(lang.membership(reps))
        sizes.append(counts.double())
        n_positions += [tokens.shape[1]] * tokens.shape[0]
    tokens = torch.zeros(len(rows), max(n_positions), dtype=torch.long)
    for j, row in enumerate(rows):
        tokens[j, : row.shape[0]] = row
    return tokens, torch.tensor(n_positions, dtype=torch.long), torch.cat(truths), torch.cat(sizes)


def fig3_data(values: Sequence[float] | None = None, lengths: tuple[int, int] = (1, 50), strings: int = 1000,
              seed: int = 0, dtype: str = "float32", eta: float = DEFAULT_ETA) -> dict[str, Any]:
    """Fig. 3: accuracy and cross-entropy of parity-ln (eps = 0) and of parity-ln-eta
    (eps = 0, the Prop. 2 layer added) as W̄^{V,1,1}_{6,2} sweeps ``values`` (1 is correct).

    The paper does not state the strings behind Fig. 3; we follow its §3.4 experiments
    (random strings of random length) over a shorter range: ``strings`` strings, each
    of a length |w| drawn uniformly from ``lengths`` (inclusive; default 1..50), then
    uniform random bits. The same strings serve every value. Each value sets
    parity-ln's blocks[0].attn.W_V[0, 1, 5]; one string per (length, number of 1s)
    class is run, and the Prop. 2 logit is read off the same run (module docstring).
    Returns ``{"values": [...], "curves": {"parity-ln"|"parity-ln-eta": {"accuracy",
    "cross_entropy_bits", ...}}, ...}``.
    """
    low, high = lengths
    if not (1 <= low <= high) or strings < 1:
        raise ExactLensError(f"fig3_data needs 1 <= lengths[0] <= lengths[1] and strings >= 1, "
                             f"got lengths={lengths}, strings={strings}")
    values = [float(v) for v in (default_fig3_values() if values is None else values)]
    if not values or not all(math.isfinite(v) for v in values):
        raise ExactLensError("fig3_data needs at least one finite parameter value")
    construction = get("parity-ln")
    model = construction.make(dtype=dtype, eps=0.0)
    tail = Prop2Tail(prop2_model("PARITY", 0.0, eta, dtype))
    lang = construction.task_of()
    gen = torch.Generator().manual_seed(seed)
    drawn = torch.randint(low, high + 1, (strings,), generator=gen)
    tokens, n_pos, truth, counts = _class_batch(construction, lang, drawn, gen)
    parameter = model.blocks[0].attn.W_V
    original = float(parameter.detach()[FIG3_INDEX])
    results: dict[str, dict[str, list[float]]] = {k: {"accuracy": [], "cross_entropy_bits": [], "nonfinite": []}
                                                  for k in ("parity-ln", "parity-ln-eta")}
    say(f"fig3: {len(values)} values of {FIG3_PARAMETER}, {strings} strings of length {low}..{high} "
              f"({tokens.shape[0]} classes)")
    start = time.perf_counter()
    try:
        for value in values:
            with torch.no_grad():
                parameter[FIG3_INDEX] = value
            logits, cls = logits_and_cls(model, tokens, n_pos)
            for key, s in (("parity-ln", logits), ("parity-ln-eta", tail(cls))):
                finite = torch.isfinite(s)
                correct = ((s > 0) == truth) & finite
                bits = torch.where(finite, cross_entropy_bits(s, truth), torch.zeros((), dtype=torch.float64))
                nonfinite = int(counts[~finite].sum())
                results[key]["accuracy"].append(float((correct.double() * counts).sum()) / strings)
                results[key]["cross_entropy_bits"].append(float((bits * counts).sum()) / max(strings - nonfinite, 1))
                results[key]["nonfinite"].append(nonfinite)
    finally:
        with torch.no_grad():
            parameter[FIG3_INDEX] = original
    return {
        "figure": "Chiang & Cholak 2022, Fig. 3",
        "parameter": FIG3_PARAMETER,
        "paper_parameter": "W̄^{V,1,1}_{6,2}",
        "correct_value": original,
        "values": values,
        "curves": {
            "parity-ln": {"construction": "parity-ln", "params": {"eps": 0.0}, **results["parity-ln"]},
            "parity-ln-eta": {"construction": "parity-ln-eta", "params": {"eta": eta, "ln_eps": 0.0},
                              **results["parity-ln-eta"]},
        },
        "lengths": [low, high],
        "strings": strings,
        "seed": seed,
        "dtype": dtype,
        "note": "accuracy counts a non-finite logit as wrong; cross_entropy_bits averages the finite ones; "
                "nonfinite counts the strings whose logit was NaN or inf",
        "seconds": time.perf_counter() - start,
    }

# ---- plots -------------------------------------------------------------------------


FIG2_STYLE = {  # setting -> (colour, line style, marker): red / blue / green as in the paper's Fig. 2
    "no layer norm": ("tab:red", "-", "."),
    "layer norm eps=1e-5": ("tab:blue", "--", "x"),
    "layer norm eps=0": ("tab:green", ":", "."),
    "layer norm + Prop. 2, eps=1e-5": ("tab:blue", "-", "."),
    "layer norm + Prop. 2, eps=0": ("tab:green", "-", "."),
}


def plot_fig2(data: dict[str, Any], path: str | Path) -> Path:
    """Two panels (PARITY, FIRST): cross-entropy in bits against n (log scale), one curve per setting."""
    plt = pyplot()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5), sharey=True)
    for ax, language in zip(axes, LANGUAGES, strict=True):
        for setting in data["settings"]:
            colour, style, marker = FIG2_STYLE.get(setting, (None, "-", "."))
            curve = data["curves"][language][setting]
            ax.plot(data["lengths"], curve["cross_entropy_bits"], marker=marker, ls=style, color=colour, label=setting)
        ax.set_xscale("log")
        ax.set_title(language)
        ax.set_xlabel("string length |w| (n = |w| + 1 positions)")
        ax.set_ylim(-0.02, 1.05)
        ax.grid(True, which="both", alpha=0.3)
    axes[0].set_ylabel("cross-entropy (bits per string)")
    axes[1].legend(loc="center right", fontsize="small")
    fig.suptitle(f"Exact solutions: {data['strings']} random strings per length, {data['dtype']}, "
                 f"Prop. 2 eta = {data['eta']} bits")
    fig.tight_layout()
    save_figure(fig, path, dpi=110)
    plt.close(fig)
    return path


def plot_fig3(data: dict[str, Any], path: str | Path) -> Path:
    """Cross-entropy (top) and accuracy (bottom) against the Fig. 3 parameter."""
    plt = pyplot()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 6.5), sharex=True)
    styles = {"parity-ln": ("tab:purple", "-"), "parity-ln-eta": ("tab:green", "--")}  # accuracies coincide
    for key, curve in data["curves"].items():
        colour, style = styles.get(key, (None, "-"))
        label = f"{curve['construction']} {curve['params']}"
        top.plot(data["values"], curve["cross_entropy_bits"], color=colour, ls=style, lw=1, label=label)
        bottom.plot(data["values"], curve["accuracy"], color=colour, ls=style, lw=1, label=label)
    top.set_ylabel("cross-entropy (bits per string)")
    top.legend(fontsize="small")
    bottom.set_ylabel("accuracy")
    bottom.set_xlabel(r"$\bar{W}^{V,1,1}_{6,2}$"
                      + f"  (= {data['parameter']}; correct value {data['correct_value']:g})")
    for ax in (top, bottom):
        ax.axvline(data["correct_value"], color="gray", ls=":", lw=1)
        ax.grid(True, alpha=0.3)
    low, high = data["lengths"]
    top.set_title(f"PARITY with layer norm (eps = 0): {data['strings']} random strings, |w| uniform in [{low}, {high}]")
    fig.tight_layout()
    save_figure(fig, path, dpi=110)
    plt.close(fig)
    return path

"""Brody, Alon & Yahav (2023) Tables 1-2 in spirit: unselectable keys in a small trained language model.

The paper (§4.2, App. D, App. E.2) trains a GPT-2-style 4-layer language model with hidden size
d = 8 on Wikipedia for 50K steps and counts, on SQuAD sequences, the fraction of "unselectable"
key vectors (vectors inside the convex hull of the other vectors of the same sequence, which no
query can give the strictly highest score; Theorem 1):

* Table 1: the model trained with LN *without its scaling* (projection x - mean x only), measured
  right before attention (after that LN): 51.0 / 32.2 / 34.7 / 36.8 % in layers 1-4; with scaling 0.
* Table 2: the model with full LN, before LN 44.8 / 28.5 / 22.3 / 26.1 %, after LN 0 in every layer.

Here, with nothing downloaded: a character-level model of the same shape (4 layers, d_model = 8,
pre-LN, causal mask, learned positions, GELU MLP of width 4 d, logits readout; see
:func:`lm_config`) trained briefly with Adam (:func:`train_char_lm`) on the docstrings of Python's
standard library (:mod:`exactlens.data.stdlib_docs`), once with full LN and once with LN minus its
scaling (``ExactConfig(ln_scale=False)``), optionally also without LN. The keys are counted on
validation windows by :func:`exactlens.analysis.hull_model.unselectable_by_layer` (exact LP-based
hull check, with certificates): per layer the residual vectors before LN (``hook_resid_pre``) and
after LN's normalisation (``ln1.hook_normalized``, before its gain and bias), and per head the keys
W_K^T x + b_K restricted to the queries that head can form.

What differs from the paper, by construction: characters instead of GPT-2 BPE tokens; minutes of
training instead of 50K steps; context n_ctx (default 64) instead of 1024, and the key set of a
sequence is its n_ctx positions; the measured sequences are held-out docstring windows, not SQuAD.
The hull check treats a key within ``tol`` (relative to the keys' largest entry) of the hull of the
others as unselectable (:mod:`exactlens.analysis.hull`), so "0 after LN" is a statement up to that
tolerance: distinct points on a sphere are all extreme points in exact arithmetic, but a dense set
of them can have points within rounding of their neighbours' hull.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import torch
import torch.nn.functional as F

from exactlens.analysis.hull import METHODS
from exactlens.analysis.hull_model import unselectable_by_layer
from exactlens.data.stdlib_docs import CharCorpus, char_corpus
from exactlens.errors import ExactLensError
from exactlens.model import ExactConfig, ExactTransformer

__all__ = [
    "LN_VARIANTS",
    "PAPER_TABLE1",
    "PAPER_TABLE2",
    "LMRun",
    "LMSettings",
    "brody_tables",
    "lm_config",
    "lm_unselectable",
    "summarize_layers",
    "as_float64",
    "quick_settings",
    "train_char_lm",
    "validation_windows",
]

LN_VARIANTS: dict[str, dict[str, Any]] = {
    "full": {"normalization": "pre"},
    "no_scale": {"normalization": "pre", "ln_scale": False},  # Brody Table 1: projection x - mean x only
    "none": {"normalization": "none"},
}
"""Layer-norm variants: full pre-LN, pre-LN without its scaling, no LN at all."""

# Percentages from the paper, layers L1-L4.
PAPER_TABLE1 = {"no_scale_attention_input": [51.0, 32.2, 34.7, 36.8], "full_attention_input": [0.0, 0.0, 0.0, 0.0]}
PAPER_TABLE2 = {"before_ln": [44.8, 28.5, 22.3, 26.1], "after_ln": [0.0, 0.0, 0.0, 0.0]}


@dataclass(frozen=True)
class LMSettings:
    """Shape and training of the character LM (defaults: about 45 s per model on one busy core)."""

    d_model: int = 8
    n_layers: int = 4
    n_heads: int = 2
    d_mlp: int = 32
    n_ctx: int = 128
    steps: int = 800
    batch_size: int = 16
    lr: float = 1e-2
    warmup_steps: int = 50
    grad_clip: float = 1.0
    dtype: str = "float32"
    eval_every: int = 100
    eval_windows: int = 32

    def __post_init__(self) -> None:
        for name in ("d_model", "n_layers", "n_heads", "n_ctx", "steps", "batch_size", "eval_every", "eval_windows"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ExactLensError(f"{name} must be a positive integer, got {value!r}")
        for name in ("d_mlp", "warmup_steps"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ExactLensError(f"{name} must be an integer >= 0, got {value!r}")
        for name in ("lr", "grad_clip"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not (0 < value < math.inf):
                raise ExactLensError(f"{name} must be a finite positive number, got {value!r}")
        if self.dtype not in ("float32", "float64"):
            raise ExactLensError(f"dtype must be 'float32' or 'float64', got {self.dtype!r}")


@dataclass
class LMRun:
    """A trained model with its loss curve (cross-entropy in bits per character)."""

    model: ExactTransformer
    variant: str
    seed: int
    settings: LMSettings
    history: list[dict[str, float]] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def final(self) -> dict[str, float]:
        return self.history[-1] if self.history else {}


def lm_config(vocab_size: int, variant: str = "full", settings: LMSettings | None = None) -> ExactConfig:
    """ExactConfig of the GPT-2-like character LM: pre-LN (or a variant), causal, learned positions."""
    if variant not in LN_VARIANTS:
        raise ExactLensError(f"variant must be one of {sorted(LN_VARIANTS)}, got {variant!r}")
    s = settings or LMSettings()
    return ExactConfig(
        d_model=s.d_model,
        n_layers=s.n_layers,
        d_vocab=vocab_size,
        n_heads=s.n_heads,
        d_mlp=s.d_mlp,
        d_vocab_out=vocab_size,
        attention_mask="causal",
        act_fn="gelu",
        positional_features=("learned",),
        n_ctx=s.n_ctx,
        readout="logits",
        dtype=s.dtype,
        model_name=f"brody-char-lm-{variant}",
        **LN_VARIANTS[variant],
    )


def _windows(ids: torch.Tensor, starts: torch.Tensor, width: int) -> torch.Tensor:
    return ids[starts.unsqueeze(1) + torch.arange(width).unsqueeze(0)]


def validation_windows(corpus: CharCorpus, count: int, n_positions: int) -> torch.Tensor:
    """The first ``count`` non-overlapping windows of ``n_positions`` + 1 characters of the validation text."""
    ids = corpus.validation_ids
    if count * (n_positions + 1) > ids.numel():
        raise ExactLensError(
            f"{count} validation windows of {n_positions + 1} characters need {count * (n_positions + 1)} "
            f"characters; the validation text has {ids.numel()}"
        )
    starts = torch.arange(count) * (n_positions + 1)
    return _windows(ids, starts, n_positions + 1)


def _bits(model: ExactTransformer, windows: torch.Tensor) -> float:
    logits = model(windows[:, :-1])
    nats = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), windows[:, 1:].reshape(-1))
    return float(nats) / math.log(2)


def train_char_lm(
    corpus: CharCorpus,
    variant: str = "full",
    *,
    seed: int = 0,
    settings: LMSettings | None = None,
    progress: Any = None,
) -> LMRun:
    """Train the character LM with Adam (linear warm-up, then linear decay to 0) on random training windows.

    Seeded: the initialisation (``init_weights(seed)``) and the window sampler (a torch Generator)
    depend only on ``seed``. ``history`` holds, every ``eval_every`` steps and at the end, the mean
    training loss since the last record and the validation loss on fixed held-out windows, both in
    bits per character. ``progress`` (optional) is called with each record.
    """
    s = settings or LMSettings()
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ExactLensError(f"seed must be an integer, got {seed!r}")
    model = ExactTransformer(lm_config(len(corpus.vocab), variant, s)).init_weights(seed=seed)
    model.train()
    gen = torch.Generator().manual_seed(seed)
    train_ids = corpus.train_ids
    if train_ids.numel() <= s.n_ctx + 1:
        raise ExactLensError(f"the training text ({train_ids.numel()} characters) is shorter than one window")
    val = validation_windows(corpus, s.eval_windows, s.n_ctx)
    opt = torch.optim.Adam(model.parameters(), lr=s.lr)

    def lr_factor(step: int) -> float:  # step counts from 0
        if step < s.warmup_steps:
            return (step + 1) / s.warmup_steps
        return max(0.0, (s.steps - step) / max(1, s.steps - s.warmup_steps))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_factor)
    history: list[dict[str, float]] = []
    running, count = 0.0, 0
    start = time.perf_counter()
    for step in range(s.steps):
        starts = torch.randint(0, train_ids.numel() - s.n_ctx - 1, (s.batch_size,), generator=gen)
        batch = _windows(train_ids, starts, s.n_ctx + 1)
        logits = model(batch[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1))
        if not torch.isfinite(loss):
            raise ExactLensError(f"training diverged at step {step} (loss {float(loss)}); lower lr={s.lr}")
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), s.grad_clip)
        opt.step()
        sched.step()
        running += loss.item() / math.log(2)
        count += 1
        if (step + 1) % s.eval_every == 0 or step + 1 == s.steps:
            model.eval()
            with torch.no_grad():
                val_bits = _bits(model, val)
            model.train()
            record = {
                "step": step + 1,
                "train_bits_per_char": running / count,
                "val_bits_per_char": val_bits,
                "seconds": time.perf_counter() - start,
            }
            history.append(record)
            running, count = 0.0, 0
            if progress is not None:
                progress(record)
    model.eval()
    return LMRun(
        model=model, variant=variant, seed=seed, settings=s, history=history, seconds=time.perf_counter() - start
    )


def lm_unselectable(
    model: ExactTransformer,
    corpus: CharCorpus,
    *,
    sequences: int = 16,
    n_positions: int | None = None,
    tol: float = 1e-9,
    method: str = "fast",
) -> dict[str, Any]:
    """:func:`unselectable_by_layer` on the first ``sequences`` validation windows of ``n_positions`` characters.

    The model is evaluated in float64 (:func:`as_float64`) whatever dtype it was trained in.
    """
    if method not in METHODS:
        raise ExactLensError(f"method must be one of {METHODS}, got {method!r}")
    n = model.cfg.n_ctx if n_positions is None else n_positions
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= model.cfg.n_ctx:
        raise ExactLensError(f"n_positions must be an integer in [1, n_ctx={model.cfg.n_ctx}], got {n_positions!r}")
    tokens = validation_windows(corpus, sequences, n)[:, :-1]
    return unselectable_by_layer(as_float64(model), tokens, tol=tol, method=method)


def as_float64(model: ExactTransformer) -> ExactTransformer:
    """The same weights in a float64 copy of the model (the model itself when it already is float64).

    A float32-trained model is measured in float64 so that the keys are its exact activations up to
    float64 rounding, far below the hull check's default tolerance 1e-9.
    """
    if model.cfg.dtype == "float64":
        return model
    copy = ExactTransformer(model.cfg.replace(dtype="float64"))
    copy.load_state_dict(
        {k: v.to(torch.float64) if v.is_floating_point() else v for k, v in model.state_dict().items()}
    )
    return copy.eval()


def summarize_layers(result: dict[str, Any]) -> dict[str, Any]:
    """Per-layer percentages (before LN, after LN or null, per head) from an unselectable_by_layer result."""
    layers = result["layers"]
    return {
        "before_ln": [100 * e["before_ln"]["fraction_unselectable"] for e in layers],
        "after_ln": [None if e["after_ln"] is None else 100 * e["after_ln"]["fraction_unselectable"] for e in layers],
        "attention_input": [100 * (e["after_ln"] or e["before_ln"])["fraction_unselectable"] for e in layers],
        "per_head": [[100 * h["fraction_unselectable"] for h in e["per_head"]] for e in layers],
        "query_rank": [[h["query_rank"] for h in e["per_head"]] for e in layers],
    }


def brody_tables(
    variants: Sequence[str] = ("full", "no_scale"),
    *,
    seeds: Sequence[int] = (0,),
    settings: LMSettings | None = None,
    sequences: int = 16,
    tol: float = 1e-9,
    method: str = "fast",
    corpus: CharCorpus | None = None,
    progress: Any = None,
) -> dict[str, Any]:
    """Train one model per (variant, seed) and count unselectable keys; JSON-ready.

    Returns ``{"settings", "corpus", "tolerance", "sequences", "paper": {"table1", "table2"},
    "runs": [{"variant", "seed", "history", "train_seconds", "hull_seconds", "percent": {...},
    "hull": <unselectable_by_layer result>}]}`` where ``percent`` is :func:`summarize_layers`.
    """
    s = settings or LMSettings()
    unknown = [v for v in variants if v not in LN_VARIANTS]
    if unknown or not variants:
        raise ExactLensError(f"variants must be a non-empty subset of {sorted(LN_VARIANTS)}, got {list(variants)!r}")
    if not seeds or any(isinstance(x, bool) or not isinstance(x, int) for x in seeds):
        raise ExactLensError(f"seeds must be a non-empty sequence of integers, got {seeds!r}")
    corpus = corpus or char_corpus()
    runs = []
    for variant in variants:
        for seed in seeds:
            run = train_char_lm(
                corpus,
                variant,
                seed=seed,
                settings=s,
                progress=None if progress is None else (lambda r, v=variant, x=seed: progress(v, x, r)),
            )
            t0 = time.perf_counter()
            hull = lm_unselectable(run.model, corpus, sequences=sequences, tol=tol, method=method)
            runs.append(
                {
                    "variant": variant,
                    "seed": seed,
                    "history": run.history,
                    "train_seconds": run.seconds,
                    "hull_seconds": time.perf_counter() - t0,
                    "percent": summarize_layers(hull),
                    "hull": hull,
                }
            )
    return {
        "settings": asdict(s),
        "corpus": corpus.info(),
        "tolerance": float(tol),
        "method": method,
        "sequences": sequences,
        "positions": s.n_ctx,
        "paper": {"table1": PAPER_TABLE1, "table2": PAPER_TABLE2},
        "runs": runs,
    }


def quick_settings(**changes: Any) -> LMSettings:
    """Tiny settings for tests, notebooks and the quick report (seconds, not minutes)."""
    base = LMSettings(n_ctx=24, steps=30, batch_size=8, eval_every=10, eval_windows=8, warmup_steps=5)
    return replace(base, **changes)

"""Brody, Alon & Yahav (2023) Tables 1-2 in spirit: unselectable keys in a small trained language model.

The paper (§4.2, App. D, App. E.2) trains a GPT-2-style 4-layer language model with hidden size
d = 8 on Wikipedia for 50K steps and counts, on SQuAD sequences, the fraction of "unselectable"
key vectors (vectors inside the convex hull of the other vectors of the same sequence, which no
query can give the strictly highest score; Theorem 1):

* Table 1: the model trained with LN *without its scaling* (projection x - mean x only), measured
  right before attention (after that LN): 51.0 / 32.2 / 34.7 / 36.8 % in layers 1-4; with scaling 0.
* Table 2: the model with full LN, before LN 44.8 / 28.5 / 22.3 / 26.1 %, after LN 0 in every layer.

Here, with nothing downloaded: a character-level model of the same shape (4 layers, d_model = 8,
pre-LN, causal mask, learned positions, GELU MLP of width 4 d, a next-character prediction at every
position; see :func:`lm_config`) trained briefly with Adam through exactlens's one training loop
(:func:`train_char_lm`; the task is :class:`CharTask`, windows of the docstrings of Python's
standard library, :mod:`exactlens.papers.brody.corpus`), once with full LN and once with LN minus its
scaling (``ExactConfig(ln_scale=False)``), optionally also without LN. The keys are counted on
validation windows by :func:`exactlens.analysis.hull.model.unselectable_by_layer` (exact LP-based
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

import functools
import math
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import torch

from exactlens.analysis.hull import METHODS
from exactlens.analysis.hull.model import unselectable_by_layer
from exactlens.dtypes import dtype_name
from exactlens.errors import ExactLensError
from exactlens.model import ExactConfig, ExactTransformer
from exactlens.papers.brody.corpus import STDLIB_MODULES, CharCorpus, char_corpus
from exactlens.tasks import Task
from exactlens.tasks.base import check_count
from exactlens.tasks.variables import CausalVariable
from exactlens.train import Preset, fit

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
    "table_cells",
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


@functools.lru_cache(maxsize=4)
def _corpus(modules: tuple[str, ...], validation_fraction: float) -> CharCorpus:
    return char_corpus(modules, validation_fraction)


class CharTask(Task):
    """Next-character prediction on the docstring corpus (kind "prediction"): a word is a window of
    the text, and the target at position i is the character after it (the last position has none).
    Training words are windows of the training part, held-out words windows of the validation part."""

    name = "stdlib-chars"
    kind = "prediction"
    use_cls = False
    min_length = 2

    def __init__(self, validation_fraction: float = 0.1, modules: Sequence[str] | None = None):
        self.modules = tuple(STDLIB_MODULES if modules is None else modules)
        self.validation_fraction = validation_fraction
        self.corpus = _corpus(self.modules, validation_fraction)
        self.alphabet = self.corpus.vocab

    @property
    def params(self) -> dict[str, Any]:
        out: dict[str, Any] = {"validation_fraction": self.validation_fraction}
        if self.modules != tuple(STDLIB_MODULES):
            out["modules"] = list(self.modules)
        return out

    def target(self, word) -> list:
        symbols = [self.alphabet.index(s) for s in self.symbols_of(word)]
        self.check_length(len(symbols))
        return symbols[1:] + [None]

    def targets(self, symbol_ids: torch.Tensor) -> torch.Tensor:
        out = torch.zeros_like(symbol_ids, dtype=torch.long)
        out[:, :-1] = symbol_ids[:, 1:]
        return out

    def target_mask(self, lengths: torch.Tensor, width: int, truth: torch.Tensor | None = None) -> torch.Tensor:
        """Every position but the last (whose next character is not in the window); ``truth`` is always defined."""
        return torch.arange(width).unsqueeze(0) < (lengths - 1).unsqueeze(1)

    def _windows(self, ids: torch.Tensor, length: int, count: int, generator: torch.Generator) -> torch.Tensor:
        self.check_length(length)
        if ids.numel() <= length:
            raise ExactLensError(f"{self.name}: the text ({ids.numel()} characters) is shorter than one window")
        starts = torch.randint(0, ids.numel() - length, (count,), generator=generator)
        return ids[starts.unsqueeze(1) + torch.arange(length).unsqueeze(0)]

    def sample(self, length: int, count: int, generator: torch.Generator) -> torch.Tensor:
        self.check_length(length)
        check_count(count, self.name)
        return self._windows(self.corpus.train_ids, length, count, generator)

    def sample_held_out(self, length: int, count: int, generator: torch.Generator) -> torch.Tensor:
        self.check_length(length)
        check_count(count, self.name)
        return self._windows(self.corpus.validation_ids, length, count, generator)

    def variables(self) -> list[CausalVariable]:
        def previous(ids: torch.Tensor) -> torch.Tensor:
            return torch.cat([torch.zeros_like(ids[:, :1]), ids[:, :-1]], dim=1)

        return [CausalVariable("previous character", "position", previous, None, "w_(i-1) at position i")]


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
        object.__setattr__(self, "dtype", dtype_name(self.dtype))  # frozen: the name, also for a torch dtype


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
        readout="per_position",
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


def lm_preset(variant: str, settings: LMSettings, corpus: CharCorpus | None = None) -> Preset:
    """The character LM as a training preset of exactlens's loop: Adam with a linear warm-up then
    linear decay to 0, gradient clipping, one batch of ``batch_size`` windows of n_ctx characters per
    step; evaluation on ``eval_windows`` held-out windows every ``eval_every`` steps. ``corpus``: a
    docstring corpus of other modules (its validation part must be the default last 10 %)."""
    s = settings
    params = {} if corpus is None or corpus.modules == tuple(STDLIB_MODULES) else {"modules": list(corpus.modules)}
    if corpus is not None and CharTask(**params).corpus.n_train != corpus.n_train:
        raise ExactLensError(
            "train_char_lm reads the corpus through its task, which holds out the last 10 % of the text"
        )
    return Preset(
        name=f"char-lm-{variant}",
        task="stdlib-chars",
        paper="Brody et al. 2023, §4.2, App. E.2 (in spirit)",
        summary="4-layer d = 8 character LM on Python's docstrings",
        options={},
        config=lambda task, o: lm_config(len(task.vocab), variant, s),
        task_params=lambda o: params,
        defaults=dict(
            epochs=s.steps, strings_per_epoch=s.batch_size, test_strings=s.eval_windows, eval_every=s.eval_every,
            lr=s.lr, lr_schedule="warmup_linear", warmup_steps=s.warmup_steps, grad_clip=s.grad_clip,
            d_model=s.d_model, d_mlp=s.d_mlp, train_length=s.n_ctx, test_length=s.n_ctx, dtype=s.dtype,
        ),
    )


def train_char_lm(
    corpus: CharCorpus | None = None,
    variant: str = "full",
    *,
    seed: int = 0,
    settings: LMSettings | None = None,
    progress: Any = None,
) -> LMRun:
    """Train the character LM (exactlens.train.fit with :func:`lm_preset`) on random training windows.

    Seeded: the initialisation and the window samplers depend only on ``seed``. ``history`` holds,
    every ``eval_every`` steps and at the end, the mean training loss over the steps since the last
    record and the loss on fresh held-out windows, both in bits per character. ``progress``
    (optional) is called with each record. ``corpus``: the default docstring corpus (the task's).
    """
    s = settings or LMSettings()
    if variant not in LN_VARIANTS:
        raise ExactLensError(f"variant must be one of {sorted(LN_VARIANTS)}, got {variant!r}")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ExactLensError(f"seed must be an integer, got {seed!r}")
    spec = lm_preset(variant, s, corpus).spec({})
    start = time.perf_counter()
    run = fit(spec, [seed])[0]
    history, since = [], []
    for record in run.history:
        since.append(record["train_loss_bits"])
        if record["test_evaluated"]:
            entry = {
                "step": record["step"],
                "train_bits_per_char": sum(since) / len(since),
                "val_bits_per_char": record["test_loss_bits"],
                "seconds": record["wall_s"],
            }
            history.append(entry)
            since = []
            if progress is not None:
                progress(entry)
    return LMRun(model=run.model, variant=variant, seed=seed, settings=s, history=history,
                 seconds=time.perf_counter() - start)


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


def _stats(values: Sequence[float]) -> dict[str, float]:
    vals = [float(v) for v in values]
    mean = sum(vals) / len(vals)
    std = math.sqrt(sum((v - mean) ** 2 for v in vals) / (len(vals) - 1)) if len(vals) > 1 else 0.0
    return {"mean": mean, "std": std, "min": min(vals), "max": max(vals), "n": len(vals)}


def table_cells(result: dict[str, Any]) -> dict[str, Any]:
    """Tables 1-2 cells over seeds: per variant, per measure (before_ln, after_ln, attention_input) and
    layer, the mean / sample std / min / max over the runs (seeds) of the per-run percentage (itself the
    mean over the measured windows); plus the final validation loss (bits per character) over seeds.
    ``after_ln`` is null for a variant without LN."""
    try:
        runs = list(result["runs"])
    except (KeyError, TypeError) as err:
        raise ExactLensError(f"table_cells needs the dict returned by brody_tables: {err}") from err
    cells: dict[str, Any] = {}
    for variant in dict.fromkeys(run["variant"] for run in runs):
        mine = [run for run in runs if run["variant"] == variant]
        entry: dict[str, Any] = {"seeds": [run["seed"] for run in mine]}
        for measure in ("before_ln", "after_ln", "attention_input"):
            layers = zip(*(run["percent"][measure] for run in mine), strict=True)
            entry[measure] = [None if any(v is None for v in column) else _stats(column) for column in layers]
        entry["val_bits_per_char"] = _stats([run["history"][-1]["val_bits_per_char"] for run in mine])
        cells[variant] = entry
    return cells

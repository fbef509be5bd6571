"""Shin & Matzinger 2025 §4: train one-layer transformers on category pairs with LBFGS.

The paper's setup: N = 10 categories, M = 50 positions, q_true standard normal,
batch 1000, LBFGS for 50 iterations, MSE (first position masked); single-head
attention without softmax, then a normalization layer and two linear layers with
a ReLU between, whose output is the prediction. As ExactTransformer: pair_config
with normalization="post" and mlp_residual=False, so c = LN(X + ATT(X)) and
y = W_2 ReLU(W_1 c + b_1) + b_2. Trained: q, k, v (the full d x d matrices
W_Q, W_K, W_V; W_O stays I), the LN gain and bias, W_1, b_1, and the second layer
(W_out column 0 and b_out[0]: the readout W_U = e_0 is fixed). The inputs (one-hot
category and position) are fixed, as in the paper.

Systems (our reading of "attention weights that have access to either positional or
input information"; the paper gives no code):
- solution1: q, k read the position block; v maps each category to itself (diagonal
  category block): attention can only move X_{i-1}, the FFN must decode the pair.
- solution2: q, k read the category block; v maps positions to positions; the FFN's
  first layer is diagonal (skip + ReLU can only pick entries, eq. 2.21).
- solution3: q, k read the position block; v maps categories to categories (any
  matrix); diagonal first FFN layer (eq. 2.32).
- combined: everything free. Its four flavours add lean * (sum of squares of the
  weights that system s forbids) for s = solution1..3, or nothing (unconstrained).
Masked weights start at 0 and their gradients are masked, so LBFGS keeps them at 0.
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from exactlens.errors import ExactLensError
from exactlens.model import ExactTransformer
from exactlens.outputs import staged
from exactlens.papers.shin_matzinger.constructions import PAPER, pair_config, set_one_hot_inputs
from exactlens.papers.shin_matzinger.options import FLAVOURS, NORMALIZATIONS, SYSTEMS, WEIGHTINGS, PairOptions
from exactlens.papers.shin_matzinger.task import Pairs, check_categories, check_positions
from exactlens.requests import Choice, Float, Int, option
from exactlens.train import Preset, fit_into
from exactlens.train.data import check_lengths
from exactlens.train.loop import new_model, seed_generators


@dataclass(frozen=True)
class PairTrainConfig(PairOptions):
    """One training run: the options shared with ``exactlens pairlogic`` (PairOptions: categories, positions, seed,
    iterations, batch, system, flavour, q, q_seed, dtype) and training's own; each checked by its kind."""

    lean: float = option(1e-2, kind=Float(0), help="weight of the flavour's extra loss")
    normalization: str = option("post", kind=Choice(NORMALIZATIONS),
                                help='the §4 normalization layer ("none": §2/§3 without it)')
    weighting: str = option("none", kind=Choice(WEIGHTINGS),
                            help='"softmax": §3.2\'s remedy instead of the plain bilinear weights')
    d_mlp: int | None = option(None, kind=Int(1), help="hidden width; None: max(N^2, N + M), room for every solution")
    init_attention_scale: float = option(1.0, kind=Float(0),
                                         help="< 1 starts near the degenerate point q = k = v = 0 (§3)")
    test_batch: int = option(1000, kind=Int(1), help="held-out sequences")

    def __post_init__(self) -> None:
        self.check_kinds()
        check_categories(self.categories)
        check_positions(self.positions)
        if self.system != "combined" and self.flavour != "unconstrained":
            raise ExactLensError("flavours lean the combined system; constrained systems take flavour='unconstrained'")

    @property
    def hidden(self) -> int:
        n, m = self.categories, self.positions
        return self.d_mlp if self.d_mlp is not None else max(n * n, n + m)


@dataclass
class PairRun:
    config: PairTrainConfig
    model: ExactTransformer
    q_true: torch.Tensor
    history: list[dict[str, float]] = field(default_factory=list)  # one record per evaluation
    train_mse: float = math.nan
    test_mse: float = math.nan
    target_variance: float = math.nan
    seconds: float = 0.0

    def summary(self) -> dict[str, Any]:
        return {
            "config": asdict(self.config),
            "train_mse": self.train_mse,
            "test_mse": self.test_mse,
            "target_variance": self.target_variance,
            "seconds": self.seconds,
            "log10_mse": [math.log10(max(h["mse"], 1e-30)) for h in self.history],
        }


# ---- masks --------------------------------------------------------------------------------


def allowed_weights(system: str, n: int, m: int, hidden: int) -> dict[str, torch.Tensor]:
    """bool masks of the trainable weights a system may use (True = free), paper layout per head."""
    d = n + m
    cat = torch.zeros(d, dtype=torch.bool)
    cat[:n] = True
    pos = ~cat
    free_dd = torch.ones(d, d, dtype=torch.bool)
    masks = {
        "W_Q": free_dd.clone(),
        "W_K": free_dd.clone(),
        "W_V": free_dd.clone(),
        "W_in": torch.ones(d, hidden, dtype=torch.bool),
    }
    if system == "combined":
        return masks
    reads = pos if system in ("solution1", "solution3") else cat  # rows of W_Q, W_K = input dims
    masks["W_Q"] = reads[:, None].expand(d, d).clone()
    masks["W_K"] = masks["W_Q"].clone()
    if system == "solution1":
        masks["W_V"] = torch.diag(cat)
    elif system == "solution3":
        masks["W_V"] = cat[:, None] & cat[None, :]
    else:
        masks["W_V"] = pos[:, None] & pos[None, :]
    if system in ("solution2", "solution3"):
        masks["W_in"] = torch.eye(d, hidden, dtype=torch.bool)
    return masks


WEIGHT_NAMES = {"W_Q": "blocks.0.attn.W_Q", "W_K": "blocks.0.attn.W_K", "W_V": "blocks.0.attn.W_V",
                "W_in": "blocks.0.mlp.W_in"}


def _weights(params: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The masked weights in the paper's layout (per head, head 0) from a parameter table."""
    out = {}
    for short, name in WEIGHT_NAMES.items():
        w = params[name]
        out[short] = w[..., 0, :, :] if short != "W_in" else w
    return out


def gradient_masks(cfg: PairTrainConfig) -> dict[str, torch.Tensor | bool]:
    """What the paper trains: q, k, v (masked by the system), the FFN (first layer masked; the second
    layer's column 0 and bias[0]: W_U = e_0 reads it), the LN gain and bias; everything else is fixed."""
    n, m, hidden = cfg.categories, cfg.positions, cfg.hidden
    allowed = allowed_weights(cfg.system, n, m, hidden)
    d = n + m
    second = torch.zeros(hidden, d, dtype=torch.bool)
    second[:, 0] = True
    first_only = torch.zeros(d, dtype=torch.bool)
    first_only[0] = True
    masks: dict[str, torch.Tensor | bool] = {
        "embed.W_E": False, "pos_embed.W_pos": False, "blocks.0.attn.W_O": False, "unembed.W_U": False,
        "unembed.b_U": False,
        WEIGHT_NAMES["W_Q"]: allowed["W_Q"][None], WEIGHT_NAMES["W_K"]: allowed["W_K"][None],
        WEIGHT_NAMES["W_V"]: allowed["W_V"][None], WEIGHT_NAMES["W_in"]: allowed["W_in"],
        "blocks.0.mlp.b_in": True, "blocks.0.mlp.W_out": second, "blocks.0.mlp.b_out": first_only,
    }
    return masks


@torch.no_grad()
def prepare(model: ExactTransformer, cfg: PairTrainConfig) -> None:
    """After the initialization: the fixed one-hot inputs, the attention scale, the masked weights at 0,
    the readout W_U = e_0."""
    set_one_hot_inputs(model, cfg.categories)
    attn, mlp = model.blocks[0].attn, model.blocks[0].mlp
    for name in ("W_Q", "W_K", "W_V"):
        getattr(attn, name)[0] *= cfg.init_attention_scale
    masks = allowed_weights(cfg.system, cfg.categories, cfg.positions, cfg.hidden)
    for name, weight in _weights(dict(model.named_parameters())).items():
        weight.mul_(masks[name].to(weight.dtype))
    mlp.W_out[:, 1:] = 0
    mlp.b_out[1:] = 0
    model.unembed.W_U.zero_()
    model.unembed.W_U[0, 0] = 1.0
    model.unembed.b_U.zero_()


def lean_penalty(params: dict[str, torch.Tensor], flavour: str, n: int, m: int, hidden: int) -> torch.Tensor:
    """Sum of squares of the weights that the flavour's solution system forbids; per run when the
    parameters carry a leading run axis (exactlens.model.StackedRuns), [R]."""
    masks = allowed_weights(flavour, n, m, hidden)
    total = 0
    for name, weight in _weights(params).items():
        total = total + (weight.pow(2) * (~masks[name]).to(weight)).flatten(-2).sum(-1)  # weight's dtype, device
    return total


PAIRS_OPTIONS: dict[str, str] = {
    "system": f"which weights may be non-zero: {', '.join(SYSTEMS)} (module docstring)",
    "flavour": f"the combined system's lean: {', '.join(FLAVOURS)}",
    "lean": "weight of the flavour's extra loss (sum of squares of the weights its system forbids)",
    "normalization": "'post' (the §4 normalization layer between attention and FFN) or 'none'",
    "weighting": "'none' (the paper's bilinear attention) or 'softmax' (§3.2's remedy)",
    "categories": "N, the number of categories",
    "q": "q_true: 'normal' (standard normal) or 'code' (eq. 2.15)",
    "q_seed": "seed of a random q_true",
    "init_attention_scale": "factor on the initial q, k, v (< 1 starts near the degenerate point of §3)",
}
"""The ``pairs`` preset's own options; M (positions) is train_length (= test_length, fixed),
the batch strings_per_epoch, the LBFGS iterations epochs, the hidden width d_mlp."""


def config_of(o: dict[str, Any]) -> PairTrainConfig:
    """The PairTrainConfig of resolved ``pairs`` preset options."""
    lo, hi = o["train_length"]
    if lo != hi or tuple(o["test_length"]) != (lo, hi):
        raise ExactLensError(
            f"pairs: the model has M learned positions, so train_length and test_length are one fixed M; got "
            f"train_length={list(o['train_length'])}, test_length={list(o['test_length'])}"
        )
    return PairTrainConfig(
        categories=o["categories"], positions=hi, batch=o["strings_per_epoch"], iterations=o["epochs"],
        system=o["system"], flavour=o["flavour"], lean=o["lean"], normalization=o["normalization"],
        weighting=o["weighting"], d_mlp=o["d_mlp"], q=o["q"], q_seed=o["q_seed"],
        init_attention_scale=o["init_attention_scale"], test_batch=o["test_strings"], dtype=o["dtype"],
    )


def options_of(cfg: PairTrainConfig) -> dict[str, Any]:
    """The ``pairs`` preset options that train one PairTrainConfig."""
    return dict(
        epochs=cfg.iterations, strings_per_epoch=cfg.batch, test_strings=cfg.test_batch, train_length=cfg.positions,
        test_length=cfg.positions, d_mlp=cfg.hidden, dtype=cfg.dtype, categories=cfg.categories, system=cfg.system,
        flavour=cfg.flavour, lean=cfg.lean, normalization=cfg.normalization, weighting=cfg.weighting, q=cfg.q,
        q_seed=cfg.q_seed, init_attention_scale=cfg.init_attention_scale,
    )


def _architecture(task, o: dict[str, Any]):
    cfg = config_of(o)
    arch = pair_config(cfg.categories, cfg.positions, cfg.hidden, cfg.dtype, normalization=cfg.normalization)
    return arch.replace(attention_weighting=cfg.weighting, metadata={"paper": f"{PAPER} §4", "train": asdict(cfg)})


def _complete(o: dict[str, Any]) -> None:
    if o["d_mlp"] == "auto":  # room for every solution: max(N^2, N + M)
        n, (_, m) = o["categories"], check_lengths(o["train_length"])
        o["d_mlp"] = max(n * n, n + m) if isinstance(n, int) and isinstance(m, int) else 0


def _penalty(params: dict[str, torch.Tensor], o: dict[str, Any]) -> torch.Tensor:
    cfg = config_of(o)
    if cfg.system != "combined" or cfg.flavour == "unconstrained" or cfg.lean == 0:
        return torch.zeros(())
    return cfg.lean * lean_penalty(params, cfg.flavour, cfg.categories, cfg.positions, cfg.hidden)


_DEFAULT = PairTrainConfig()

PAIRS_PRESET = Preset(
    name="pairs",
    task="pairs",
    paper=f"{PAPER} §4",
    summary="one-layer softmax-free model of category pairs (N=10, M=50), LBFGS on one batch of 1000; "
    "systems solution1..3 or combined",
    config=_architecture,
    defaults=dict(
        options_of(_DEFAULT), d_mlp="auto", optimizer="lbfgs", lr=1.0, eval_every=0, d_model=_DEFAULT.categories
        + _DEFAULT.positions,
    ),
    options=PAIRS_OPTIONS,
    task_params=lambda o: {"categories": o["categories"], "q": o["q"], "seed": o["q_seed"]},
    validate=lambda o: config_of(o),
    prepare=lambda model, o: prepare(model, config_of(o)),
    masks=lambda model, o: gradient_masks(config_of(o)),
    penalty=_penalty,
    complete=_complete,
)
"""``exactlens train pairs --option system=solution2 --out DIR``: the runs of ``exactlens pairlogic``
as checkpoints that diff and the report read (d_model is N + M whatever is given)."""


def pair_preset(cfg: PairTrainConfig) -> Preset:
    """The training of one PairTrainConfig: the ``pairs`` preset with its options as defaults."""
    return dataclasses.replace(PAIRS_PRESET, name=f"pairs-{run_label(cfg.system, cfg.flavour)}",
                               defaults={**PAIRS_PRESET.defaults, **options_of(cfg)})


def train_pairs(cfg: PairTrainConfig, log=None, out: str | Path | None = None, overwrite: bool = False,
                device: Any = None) -> PairRun:
    """Train one model (deterministic for a seed) with exactlens's loop; history has one record per
    loss evaluation (LBFGS line-search trials included), with the iteration it belongs to. With
    ``out``, the run is written there as ``exactlens train`` writes one (config, weights, history,
    run.json), as one new directory (refused if it exists and is not empty, unless ``overwrite``).
    ``device``: where the model trains (exactlens.devices; None: the CPU); it stays there."""
    start = time.perf_counter()
    spec = pair_preset(cfg).spec({})
    run = fit_into(spec, [cfg.seed], out, progress=log, overwrite=overwrite, device=device)[0]
    history = [{"evaluation": r["step"], "iteration": r["epoch"], "mse": r["train_mse"]} for r in run.history]
    streams = seed_generators(cfg.seed)  # the loop's streams: the same training and test words
    task = spec.task
    train_words = task.sample(cfg.positions, cfg.batch, streams["train"])
    test_words = task.sample_held_out(cfg.positions, cfg.test_batch, streams["test"])
    return PairRun(cfg, run.model, task.q_true, history, mse(run.model, task, train_words), run.final["test_mse"],
                   float(task.targets(test_words)[:, 1:].var()), time.perf_counter() - start)


@torch.no_grad()
def mse(model: ExactTransformer, task: Pairs, words: torch.Tensor) -> float:
    """Mean squared error over the positions with a target."""
    encoded = task.encode(words)
    outputs = model.readout(encoded.tokens).double().cpu()
    return float(task.loss(outputs, task.targets(words), encoded.n_positions).mean())


# ---- many runs ------------------------------------------------------------------------------

GRID = (
    ("combined", "solution1"),
    ("combined", "solution2"),
    ("combined", "solution3"),
    ("combined", "unconstrained"),
    ("solution1", "unconstrained"),
    ("solution2", "unconstrained"),
    ("solution3", "unconstrained"),
)
"""(system, flavour) of Fig. 2 (the combined model in four flavours), then the three constrained systems."""


def run_label(system: str, flavour: str) -> str:
    return f"combined/{flavour}" if system == "combined" else f"system/{system}"


def _one_run(args: tuple[dict[str, Any], str | None]) -> dict[str, Any]:
    options, out = args
    torch.set_num_threads(1)
    cfg = PairTrainConfig(**options)
    label = run_label(cfg.system, cfg.flavour).replace("/", "_")
    folder = None if out is None else Path(out) / label / f"seed{cfg.seed}"
    run = train_pairs(cfg, out=folder)
    record = run.summary()
    if folder is not None:
        record["checkpoint"] = str(folder)
    return record


def train_grid(
    seeds: int = 10,
    grid: tuple[tuple[str, str], ...] = GRID,
    processes: int = 1,
    out: str | None = None,
    overwrite: bool = False,
    **options: Any,
) -> list[dict[str, Any]]:
    """Train every (system, flavour) of the grid for seeds 0..seeds-1; one record per run
    (summary(), plus the checkpoint folder when out is given; ``out`` appears, complete, when the
    grid is done). processes > 1 uses a process pool (one torch thread each)."""
    jobs = [({**options, "system": s, "flavour": f, "seed": seed}, out) for s, f in grid for seed in range(seeds)]
    for job, _ in jobs:  # bad options fail here, before any work
        PairTrainConfig(**job)
    if out is None:
        return _run_jobs(jobs, processes)
    with staged(out, overwrite=overwrite, what="grid output") as tmp:
        records = _run_jobs([(job, str(tmp)) for job, _ in jobs], processes)
    for record in records:
        record["checkpoint"] = str(Path(out) / Path(record["checkpoint"]).relative_to(tmp))
    return records


def _run_jobs(jobs: list[tuple[dict[str, Any], str | None]], processes: int) -> list[dict[str, Any]]:
    if processes <= 1:
        return [_one_run(job) for job in jobs]
    import multiprocessing

    with multiprocessing.get_context("spawn").Pool(processes) as pool:
        return pool.map(_one_run, jobs, chunksize=1)


# ---- §3: degenerate stationary points ---------------------------------------------------------

DEGENERATE_POINTS = ("q=k=0", "q=v=0", "k=v=0")


def attention_gradients(cfg: PairTrainConfig, point: str | None = None, batch: int | None = None) -> dict[str, float]:
    """Gradient norms of the MSE w.r.t. q, k, v (and the FFN's first layer) at a randomly
    initialized model, with the named pair of attention matrices set to zero (§3: q = 0 and
    v = 0 are stationary for the attention without softmax)."""
    if point is not None and point not in DEGENERATE_POINTS:
        raise ExactLensError(f"point {point!r} is unknown; choose one of {', '.join(DEGENERATE_POINTS)}")
    spec = pair_preset(cfg).spec({})
    streams = seed_generators(cfg.seed)
    model = new_model(spec, streams["init"])
    attn = model.blocks[0].attn
    with torch.no_grad():
        for letter in (point or "").replace("=0", "").split("="):
            if letter:
                getattr(attn, f"W_{letter.upper()}").zero_()
    words = spec.task.sample(cfg.positions, batch or cfg.batch, streams["train"])
    encoded = spec.task.encode(words)
    model.zero_grad()
    spec.task.loss(model.readout(encoded.tokens), spec.task.targets(words), encoded.n_positions).mean().backward()
    norms = {name: float(getattr(attn, f"W_{name}").grad.norm()) for name in ("Q", "K", "V")}
    norms["W_in"] = float(model.blocks[0].mlp.W_in.grad.norm())
    return norms


ESCAPE_VARIANTS = {
    "no normalization": {"normalization": "none", "weighting": "none"},
    "normalization layer": {"normalization": "post", "weighting": "none"},
    "softmax": {"normalization": "none", "weighting": "softmax"},
}


def escape_runs(scale: float = 1e-3, seeds: int = 3, **options: Any) -> dict[str, list[dict[str, Any]]]:
    """Train from near q = k = v = 0 (attention weights times ``scale``) with and without the
    normalization layer and with softmax: final MSE and the size of q, k, v per run."""
    out: dict[str, list[dict[str, Any]]] = {}
    for label, variant in ESCAPE_VARIANTS.items():
        rows = []
        for seed in range(seeds):
            run = train_pairs(PairTrainConfig(**{**options, **variant, "seed": seed, "init_attention_scale": scale}))
            attn = run.model.blocks[0].attn
            rows.append(
                {
                    "seed": seed,
                    "train_mse": run.train_mse,
                    "test_mse": run.test_mse,
                    "target_variance": run.target_variance,
                    "qkv_norms": [float(getattr(attn, f"W_{x}").detach().norm()) for x in "QKV"],
                }
            )
        out[label] = rows
    return out

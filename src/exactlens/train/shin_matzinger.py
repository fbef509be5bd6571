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

import math
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from exactlens.constructions.shin_matzinger import pair_config, set_one_hot_inputs
from exactlens.errors import ExactLensError
from exactlens.languages.pairs import PairBatch, PairGenerator, check_categories, check_positions, make_q
from exactlens.model import ExactTransformer

SYSTEMS = ("solution1", "solution2", "solution3", "combined")
FLAVOURS = ("solution1", "solution2", "solution3", "unconstrained")
NORMALIZATIONS = ("post", "none")
WEIGHTINGS = ("none", "softmax")


@dataclass
class PairTrainConfig:
    categories: int = 10
    positions: int = 50
    batch: int = 1000
    iterations: int = 50
    system: str = "combined"
    flavour: str = "unconstrained"  # only for system="combined"
    lean: float = 1e-2  # weight of the flavour's extra loss
    normalization: str = "post"  # the §4 normalization layer ("none": §2/§3 without it)
    weighting: str = "none"  # "softmax": §3.2's remedy instead of the plain bilinear weights
    d_mlp: int | None = None  # None: max(N^2, N + M), room for every solution
    q: str = "normal"
    q_seed: int = 0
    seed: int = 0
    init_attention_scale: float = 1.0  # < 1 starts near the degenerate point q = k = v = 0 (§3)
    test_batch: int = 1000
    dtype: str = "float32"

    def __post_init__(self) -> None:
        check_categories(self.categories)
        check_positions(self.positions)
        for name in ("batch", "iterations", "test_batch"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ExactLensError(f"{name} must be an integer >= 1, got {value!r}")
        for name, value, allowed in (
            ("system", self.system, SYSTEMS),
            ("flavour", self.flavour, FLAVOURS),
            ("normalization", self.normalization, NORMALIZATIONS),
            ("weighting", self.weighting, WEIGHTINGS),
        ):
            if value not in allowed:
                raise ExactLensError(f"{name}={value!r} is not allowed; choose one of {', '.join(allowed)}")
        if self.system != "combined" and self.flavour != "unconstrained":
            raise ExactLensError("flavours lean the combined system; constrained systems take flavour='unconstrained'")
        if not (self.lean >= 0 and math.isfinite(self.lean)):
            raise ExactLensError(f"lean must be a finite number >= 0, got {self.lean!r}")
        if not (self.init_attention_scale >= 0 and math.isfinite(self.init_attention_scale)):
            raise ExactLensError(f"init_attention_scale must be finite and >= 0, got {self.init_attention_scale!r}")

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


def _weights(model: ExactTransformer) -> dict[str, torch.Tensor]:
    attn, mlp = model.blocks[0].attn, model.blocks[0].mlp
    return {"W_Q": attn.W_Q[0], "W_K": attn.W_K[0], "W_V": attn.W_V[0], "W_in": mlp.W_in}


def new_model(cfg: PairTrainConfig) -> ExactTransformer:
    """The §4 architecture, randomly initialized (seeded), with the fixed parts set."""
    n, m = cfg.categories, cfg.positions
    arch = pair_config(n, m, cfg.hidden, cfg.dtype, normalization=cfg.normalization)
    arch = arch.replace(
        attention_weighting=cfg.weighting, metadata={"paper": "Shin & Matzinger 2025 §4", "train": asdict(cfg)}
    )
    model = ExactTransformer(arch).init_weights(seed=cfg.seed)
    set_one_hot_inputs(model, n)
    masks = allowed_weights(cfg.system, n, m, cfg.hidden)
    with torch.no_grad():
        attn, mlp = model.blocks[0].attn, model.blocks[0].mlp
        for name in ("W_Q", "W_K", "W_V"):
            getattr(attn, name)[0] *= cfg.init_attention_scale
        for name, weight in _weights(model).items():
            weight.mul_(masks[name].to(weight.dtype))
        mlp.W_out[:, 1:] = 0
        mlp.b_out[1:] = 0
        model.unembed.W_U.zero_()
        model.unembed.W_U[0, 0] = 1.0
        model.unembed.b_U.zero_()
    return model


def _trainable(
    model: ExactTransformer, masks: dict[str, torch.Tensor]
) -> list[tuple[torch.nn.Parameter, torch.Tensor]]:
    """(parameter, gradient mask) pairs of everything the paper trains."""
    attn, mlp = model.blocks[0].attn, model.blocks[0].mlp
    d, h = model.cfg.d_model, mlp.W_in.shape[1]
    dt = model.cfg.torch_dtype
    out = [
        (attn.W_Q, masks["W_Q"][None]),
        (attn.W_K, masks["W_K"][None]),
        (attn.W_V, masks["W_V"][None]),
        (mlp.W_in, masks["W_in"]),
        (mlp.b_in, torch.ones(h, dtype=torch.bool)),
    ]
    second = torch.zeros(h, d, dtype=torch.bool)
    second[:, 0] = True
    first_only = torch.zeros(d, dtype=torch.bool)
    first_only[0] = True
    out += [(mlp.W_out, second), (mlp.b_out, first_only)]
    if model.cfg.normalization != "none":
        ln = model.blocks[0].ln1
        out += [(ln.w, torch.ones(d, dtype=torch.bool)), (ln.b, torch.ones(d, dtype=torch.bool))]
    return [(p, mask.to(dt)) for p, mask in out]


def fast_predict(model: ExactTransformer, categories: torch.Tensor) -> torch.Tensor:
    """The model's predictions [batch, M], as model(categories)[..., 0] but for this one-layer
    architecture only (pair_config, no attention biases): the inputs are rows of
    R = [W_E; W_pos], so every score is an entry of R W_Q W_K^T R^T and every value a row of
    R W_V W_O, gathered instead of multiplied (tested against the model's own forward)."""
    cfg = model.cfg
    if cfg.n_layers != 1 or cfg.n_heads != 1 or cfg.attn_bias or cfg.mlp_residual or not cfg.learned_positions:
        return model(categories)[..., 0]
    block = model.blocks[0]
    attn, mlp = block.attn, block.mlp
    n, m = cfg.d_vocab, categories.shape[1]
    rows = torch.cat([model.embed.W_E, model.pos_embed.W_pos[:m]])  # [N + M, d]
    queries = rows @ attn.W_Q[0]
    scores_table = (queries @ (rows @ attn.W_K[0]).T) / cfg.scale_divisor  # [N + M, N + M]
    ov_table = rows @ attn.W_V[0] @ attn.W_O[0]  # [N + M, d]
    c = categories
    p = torch.arange(m)
    cc = scores_table[:n, :n][c[:, :, None], c[:, None, :]]
    cp = scores_table[:n, n:][c]  # [B, i, j] = S[c_i, p_j]
    pc = scores_table[n:, :n][:, c].permute(1, 0, 2)  # [B, i, j] = S[p_i, c_j]
    scores = cc + cp + pc + scores_table[n:, n:][None]
    allowed = p[None, :] <= p[:, None]  # causal: key j <= query i
    if attn.weighting == "softmax":
        pattern = torch.softmax(scores.masked_fill(~allowed, -math.inf), dim=-1)
    else:
        pattern = scores * allowed.to(scores.dtype)
    values = ov_table[c] + ov_table[n:][None]  # [B, M, d]
    x = rows[c] + rows[n:][None]
    mid = x + pattern @ values + attn.b_O
    if cfg.normalization == "post":
        mid = block.ln1(mid)
    out = mlp(mid)
    return out @ model.unembed.W_U[:, 0] + model.unembed.b_U[0]


def masked_mse(model: ExactTransformer, batch: PairBatch, fast: bool = True) -> torch.Tensor:
    """MSE over the positions with a target (the first position is left out)."""
    pred = fast_predict(model, batch.categories) if fast else model(batch.categories)[..., 0]
    target = batch.targets.to(pred.dtype)
    return (pred - target)[:, batch.mask].pow(2).mean()


def lean_penalty(model: ExactTransformer, flavour: str) -> torch.Tensor:
    """Sum of squares of the weights that the flavour's solution system forbids."""
    n, m = model.cfg.d_vocab, model.cfg.n_ctx
    masks = allowed_weights(flavour, n, m, model.blocks[0].mlp.W_in.shape[1])
    total = torch.zeros((), dtype=model.cfg.torch_dtype)
    for name, weight in _weights(model).items():
        total = total + weight.pow(2)[~masks[name]].sum()
    return total


def train_pairs(cfg: PairTrainConfig, q_true: torch.Tensor | None = None, log=None) -> PairRun:
    """Train one model (deterministic for a seed); history has one record per loss evaluation."""
    start = time.perf_counter()
    q = make_q(cfg.q, cfg.categories, cfg.q_seed) if q_true is None else q_true.double()
    data = PairGenerator(q, cfg.positions, seed=cfg.seed * 7919 + 1)
    train_batch, test_batch = data.batch(cfg.batch), data.batch(cfg.test_batch)
    model = new_model(cfg)
    model.train()
    pairs = _trainable(model, allowed_weights(cfg.system, cfg.categories, cfg.positions, cfg.hidden))
    params = [p for p, _ in pairs]
    use_lean = cfg.system == "combined" and cfg.flavour != "unconstrained" and cfg.lean > 0
    # One LBFGS call of `iterations` iterations (strong Wolfe line search); the tolerances are 0 so
    # that it runs all of them, as the paper's "50 iterations". The running MSE is logged at every
    # evaluation (line-search trials included) with the iteration it belongs to (0 = the initial model).
    optimizer = torch.optim.LBFGS(
        params,
        lr=1.0,
        max_iter=cfg.iterations,
        max_eval=25 * cfg.iterations,
        tolerance_grad=0.0,
        tolerance_change=0.0,
        history_size=20,
        line_search_fn="strong_wolfe",
    )
    history: list[dict[str, float]] = []

    def closure() -> torch.Tensor:
        optimizer.zero_grad()
        mse = masked_mse(model, train_batch)
        loss = mse + cfg.lean * lean_penalty(model, cfg.flavour) if use_lean else mse
        loss.backward()
        for p, mask in pairs:
            if p.grad is not None:
                p.grad.mul_(mask)
        value = float(mse.detach())
        if not math.isfinite(value):
            raise ExactLensError(f"training diverged (MSE {value}) after {len(history)} evaluations")
        iteration = optimizer.state[params[0]].get("n_iter", 0)
        history.append({"evaluation": len(history), "iteration": iteration, "mse": value})
        if log is not None and iteration % 10 == 0 and iteration not in logged:
            logged.add(iteration)
            log(f"  iteration {iteration}: mse {value:.4g}")
        return loss

    logged: set[int] = set()
    optimizer.step(closure)
    model.eval()
    with torch.no_grad():
        train_mse = float(masked_mse(model, train_batch))
        test_mse = float(masked_mse(model, test_batch))
        variance = float(test_batch.targets[:, test_batch.mask].var())
    return PairRun(cfg, model, q, history, train_mse, test_mse, variance, time.perf_counter() - start)


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
    run = train_pairs(PairTrainConfig(**options))
    record = run.summary()
    if out is not None:
        from pathlib import Path

        folder = (
            Path(out) / run_label(run.config.system, run.config.flavour).replace("/", "_") / f"seed{run.config.seed}"
        )
        run.model.save(folder)
        record["checkpoint"] = str(folder)
    return record


def train_grid(
    seeds: int = 10,
    grid: tuple[tuple[str, str], ...] = GRID,
    processes: int = 1,
    out: str | None = None,
    **options: Any,
) -> list[dict[str, Any]]:
    """Train every (system, flavour) of the grid for seeds 0..seeds-1; one record per run
    (summary(), plus the checkpoint folder when out is given). processes > 1 uses a
    process pool (one torch thread each)."""
    jobs = [({**options, "system": s, "flavour": f, "seed": seed}, out) for s, f in grid for seed in range(seeds)]
    for job, _ in jobs:  # bad options fail here, before any work
        PairTrainConfig(**job)
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
    model = new_model(cfg)
    attn = model.blocks[0].attn
    with torch.no_grad():
        for letter in (point or "").replace("=0", "").split("="):
            if letter:
                getattr(attn, f"W_{letter.upper()}").zero_()
    q = make_q(cfg.q, cfg.categories, cfg.q_seed)
    data = PairGenerator(q, cfg.positions, seed=cfg.seed * 7919 + 1).batch(batch or cfg.batch)
    model.zero_grad()
    masked_mse(model, data).backward()
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

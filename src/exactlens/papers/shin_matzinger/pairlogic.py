"""Where does a one-layer model do the pair logic of Shin & Matzinger 2025: attention or FFN?

Evidence for one model (architecture of exactlens.constructions.shin_matzinger.pair_config)
and its q_true:

- ablations: MSE of the model; with the attention output removed (the FFN sees
  LN(X) only); with the FFN replaced by its best linear replacement (least squares
  from the FFN input to the FFN's own output, fitted on one batch and scored on
  another). The target variance is the MSE of predicting the mean.
- circuit signatures, |Pearson correlation| over matrix entries:
  qk_category_q: category block of the bilinear form (score of query category t and
  key category s) vs q_true(s, t) (solution 2, eq. 2.17);
  ov_category_q: category block of the OV map (source s -> target t) vs q_true(s, t),
  i.e. v = A_2^T (solution 3); both over the off-diagonal entries only, so that an
  identity-like mover (solution 1's v) does not score by chance;
  qk_position_shift: position block of the bilinear form on the causal entries
  (key j <= query i) vs [j = i - 1] (D_{-1}, solutions 1 and 3);
  ov_position_shift: position block of OV vs the shift j -> j + 1 (S, solution 2);
  ov_category_identity: category block of OV vs the identity (solution 1's mover).
- verdict (our rule; the thresholds are choices, stated in VERDICT_RULE):
  "unlearned" if the attention is not used (removing it raises the MSE by < 20%):
  X_{i-1} reaches position i only through attention, so such a model has no pair
  logic anywhere; else "attention" if q_true is readable from the attention
  weights (max of the two q signatures >= 0.5); "ffn" if it is not (< 0.2) and the
  FFN needs its nonlinearity (its linear replacement raises the MSE by >= 20%);
  "mixed" otherwise.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import torch

from exactlens.errors import ExactLensError
from exactlens.model import ExactTransformer
from exactlens.papers.shin_matzinger.causal import causal_verdict, interchanges
from exactlens.papers.shin_matzinger.task import PairBatch, PairGenerator, check_q, make_q

VERDICTS = ("attention", "ffn", "mixed", "unlearned")
VERDICT_RULE = {"attention_q": 0.5, "ffn_q": 0.2, "used": 1.2}


def _corr(a: torch.Tensor, b: torch.Tensor) -> float:
    """|Pearson correlation| of two equally shaped tensors (0 when either is constant)."""
    a, b = a.double().flatten(), b.double().flatten()
    a, b = a - a.mean(), b - b.mean()
    denom = float(a.norm() * b.norm())
    return abs(float(a @ b)) / denom if denom > 1e-300 else 0.0


def _check_model(model: ExactTransformer, q_true: torch.Tensor) -> tuple[int, int]:
    cfg = model.cfg
    n = cfg.d_vocab
    if cfg.n_layers != 1 or cfg.n_heads != 1 or cfg.d_mlp == 0 or cfg.mlp_residual or not cfg.learned_positions:
        raise ExactLensError(
            "pair-logic analysis needs the Shin & Matzinger architecture (one layer, one head, "
            "an FFN whose output is the prediction, a learned position table); "
            "build it with exactlens.papers.shin_matzinger.constructions.pair_config"
        )
    check_q(q_true, n)
    return n, cfg.n_ctx


@torch.no_grad()
def signatures(model: ExactTransformer, q_true: torch.Tensor) -> dict[str, float]:
    """Correlations of the learned bilinear form and OV map with the three solutions' matrices."""
    n, m = _check_model(model, q_true)
    attn = model.blocks[0].attn
    rows = torch.cat([model.embed.W_E, model.pos_embed.W_pos[:m]]).double().cpu()  # inputs of the categories, positions
    w_q, w_k, w_v, w_o = (getattr(attn, name)[0].double().cpu() for name in ("W_Q", "W_K", "W_V", "W_O"))
    qk = rows @ w_q @ w_k.T @ rows.T  # [query input, key input]
    ov = rows @ w_v @ w_o  # [source input, residual dim]
    q = q_true.double()
    off = ~torch.eye(n, dtype=torch.bool)  # q signatures: off-diagonal entries, so an identity mover scores 0
    causal = torch.tril(torch.ones(m, m, dtype=torch.bool))
    shift = torch.diag(torch.ones(m - 1, dtype=torch.float64), -1)  # [query i, key i - 1]
    return {
        "qk_category_q": _corr(qk[:n, :n][off], q.T[off]),
        "ov_category_q": _corr(ov[:n, :n][off], q[off]),
        "qk_position_shift": _corr(qk[n:, n:][causal], shift[causal]),
        "ov_position_shift": _corr(ov[n:, n : n + m], shift.T),
        "ov_category_identity": _corr(ov[:n, :n], torch.eye(n, dtype=torch.float64)),
    }


@torch.no_grad()
def category_qk(model: ExactTransformer) -> torch.Tensor:
    """[key category s, query category t]: the score between two categories (position parts left
    out), the paper's k^T q on the category block; Fig. 1 compares it with q_true[s, t]."""
    attn = model.blocks[0].attn
    e = model.embed.W_E
    return (e @ attn.W_Q[0] @ attn.W_K[0].T @ e.T).T.cpu()


def _mse(pred: torch.Tensor, batch: PairBatch) -> float:
    return float((pred.double() - batch.targets)[:, batch.mask].pow(2).mean())


@torch.no_grad()
def ablations(model: ExactTransformer, fit: PairBatch, score: PairBatch) -> dict[str, float]:
    """MSE of the model, without attention, and with the FFN replaced by its best linear replacement."""
    _check_model(model, torch.zeros(model.cfg.d_vocab, model.cfg.d_vocab))
    full = model(score.categories)[..., 0].cpu()  # the model runs on its device; the figures on the CPU

    def no_attention(act, hook):
        return torch.zeros_like(act)

    without = model.run_with_hooks(score.categories, fwd_hooks=[("blocks.0.hook_attn_out", no_attention)])[..., 0].cpu()

    def ffn_io(batch: PairBatch) -> tuple[torch.Tensor, torch.Tensor]:
        out, cache = model.run_with_cache(batch.categories, names_filter=["blocks.0.hook_resid_mid"])
        ffn_in = cache["blocks.0.hook_resid_mid"].cpu()[:, batch.mask].reshape(-1, model.cfg.d_model).double()
        ones = torch.ones(ffn_in.shape[0], 1, dtype=torch.float64)
        return torch.cat([ffn_in, ones], 1), out.cpu()[..., 0][:, batch.mask].reshape(-1, 1).double()

    x_fit, y_fit = ffn_io(fit)
    beta = torch.linalg.lstsq(x_fit, y_fit, driver="gelsd").solution
    x_score, _ = ffn_io(score)
    linear = torch.zeros(score.targets.shape, dtype=torch.float64)
    linear[:, score.mask] = (x_score @ beta).reshape(score.categories.shape[0], -1)
    return {
        "mse": _mse(full, score),
        "mse_without_attention": _mse(without, score),
        "mse_linear_ffn": _mse(linear, score),
        "target_variance": float(score.targets[:, score.mask].var()),
    }


def verdict(ablation: dict[str, float], signature: dict[str, float]) -> str:
    rule = VERDICT_RULE
    mse = ablation["mse"]
    if ablation["mse_without_attention"] < rule["used"] * mse:
        return "unlearned"
    q_in_attention = max(signature["qk_category_q"], signature["ov_category_q"])
    if q_in_attention >= rule["attention_q"]:
        return "attention"
    if q_in_attention < rule["ffn_q"] and ablation["mse_linear_ffn"] >= rule["used"] * mse:
        return "ffn"
    return "mixed"


def analyse(model: ExactTransformer, q_true: torch.Tensor, batch: int = 1000, seed: int = 12345) -> dict[str, Any]:
    """Ablations, signatures and the verdict for one model, on fresh batches from a seed."""
    _, m = _check_model(model, q_true)
    data = PairGenerator(q_true, m, seed=seed)
    fit, score = data.batch(batch), data.batch(batch)
    ablation = ablations(model, fit, score)
    signature = signatures(model, q_true)
    swaps = interchanges(model, q_true, score, fit)
    return {"ablations": ablation, "signatures": signature, "verdict": verdict(ablation, signature),
            "interchanges": swaps, "causal_verdict": causal_verdict(swaps)}


def consensus(verdicts: list[str]) -> str:
    """The most common verdict; a tie between different verdicts is "mixed"."""
    if not verdicts:
        raise ExactLensError("consensus needs at least one verdict")
    counts = Counter(verdicts).most_common()
    if len(counts) > 1 and counts[0][1] == counts[1][1]:
        return "mixed"
    return counts[0][0]


@torch.no_grad()
def check_construction(
    model: ExactTransformer, q_true: torch.Tensor, strings: int = 1000, seed: int = 0, exhaustive_length: int = 3
) -> dict[str, Any]:
    """Max |prediction - q_true(X_{i-1}, X_i)| over every sequence of length <= exhaustive_length
    (when there are at most 2^16 of them) and over random full-length sequences."""
    n, m = _check_model(model, q_true)
    q = check_q(q_true, n)
    errors = []
    for length in range(2, min(exhaustive_length, m) + 1):
        if n**length > 2**16:
            break
        index = torch.arange(n**length).unsqueeze(1)
        words = (index // n ** torch.arange(length - 1, -1, -1)) % n
        pred = model(words)[..., 0].double().cpu()
        errors.append(float((pred[:, 1:] - q[words[:, :-1], words[:, 1:]]).abs().max()))
    batch = PairGenerator(q, m, seed=seed).batch(strings)
    pred = model(batch.categories)[..., 0].double().cpu()
    errors.append(float((pred - batch.targets)[:, batch.mask].abs().max()))
    scale = max(float(q.abs().max()), float(model.cfg.metadata.get("large", 1.0)), 1.0)
    tolerance = 16 * torch.finfo(model.cfg.torch_dtype).eps * scale
    return {
        "max_abs_error": max(errors),
        "tolerance": tolerance,
        "exact": max(errors) <= tolerance,
        "strings": strings,
        "exhaustive_length": exhaustive_length,
    }


def summarize_runs(records: list[dict[str, Any]], batch: int = 1000) -> dict[str, dict[str, Any]]:
    """Per (system, flavour): final test MSE (mean, std, min, max), verdict counts and consensus,
    mean signatures; records as returned by exactlens.train.shin_matzinger.train_grid(out=...)."""
    from exactlens.papers.shin_matzinger.training import run_label

    groups: dict[str, list[dict[str, Any]]] = {}
    for record in records:
        cfg = record["config"]
        groups.setdefault(run_label(cfg["system"], cfg["flavour"]), []).append(record)
    out = {}
    for label, runs in groups.items():
        mses = torch.tensor([r["test_mse"] for r in runs], dtype=torch.float64)
        verdicts, sigs = [], []
        for r in runs:
            if "checkpoint" not in r:
                continue
            cfg = r["config"]
            model = ExactTransformer.load(r["checkpoint"])
            result = analyse(
                model, make_q(cfg["q"], cfg["categories"], cfg["q_seed"]), batch=batch, seed=cfg["seed"] + 999
            )
            verdicts.append(result["verdict"])
            sigs.append(result["signatures"])
        out[label] = {
            "runs": len(runs),
            "test_mse_mean": float(mses.mean()),
            "test_mse_std": float(mses.std()) if len(runs) > 1 else 0.0,
            "test_mse_min": float(mses.min()),
            "test_mse_max": float(mses.max()),
            "target_variance_mean": sum(r["target_variance"] for r in runs) / len(runs),
            "verdicts": dict(Counter(verdicts)),
            "consensus": consensus(verdicts) if verdicts else None,
            "signatures_mean": {k: sum(s[k] for s in sigs) / len(sigs) for k in sigs[0]} if sigs else {},
        }
    return out

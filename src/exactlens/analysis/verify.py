"""verify and precision: accuracy and cross-entropy of constructions, and where floats break them.

Cross-entropy is in bits per string, as in Chiang & Cholak Fig. 2, computed in
float64 from the model's logit (so the model's dtype alone decides the logit).
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Iterable, Sequence
from typing import Any

import torch
import torch.nn.functional as F

from exactlens.constructions.registry import Construction, get
from exactlens.errors import ExactLensError
from exactlens.languages import Language
from exactlens.languages import get as get_language
from exactlens.model import ExactTransformer

ATTENTION_MEMORY_BUDGET = 2**28  # bytes of attention scores per chunk (~256 MB)
GAP_SCAN_LIMIT = 64  # precision(): gaps up to this many lengths are scanned one by one


def parse_lengths(spec: str) -> list[int]:
    """'A:B[:STEP]' (inclusive) or 'a,b,c' -> lengths."""
    try:
        if ":" in spec:
            parts = [int(p) for p in spec.split(":")]
            if len(parts) not in (2, 3):
                raise ValueError
            start, stop = parts[0], parts[1]
            step = parts[2] if len(parts) == 3 else 1
            if step < 1 or stop < start:
                raise ValueError
            lengths = list(range(start, stop + 1, step))
        else:
            lengths = [int(p) for p in spec.split(",")]
    except ValueError:
        raise ExactLensError(
            f"lengths {spec!r} must be A:B or A:B:STEP (A <= B, STEP >= 1) or a comma list of integers"
        ) from None
    if not lengths or min(lengths) < 0:
        raise ExactLensError(f"lengths {spec!r} must be non-negative and not empty")
    return lengths


def log_grid(max_length: int, points_per_decade: int = 8, start: int = 1) -> list[int]:
    """Distinct integer lengths on a logarithmic grid from start to max_length (both included)."""
    values = {start, max_length}
    decades = math.log10(max_length / start) if max_length > start else 0
    for j in range(int(decades * points_per_decade) + 1):
        values.add(int(round(start * 10 ** (j / points_per_decade))))
    return sorted(v for v in values if start <= v <= max_length)


@torch.no_grad()
def readout_logits(model: ExactTransformer, tokens: torch.Tensor) -> torch.Tensor:
    """Readout logits [batch], computed in chunks that keep attention memory bounded."""
    n_pos = tokens.shape[1]
    per_row = model.cfg.n_heads * n_pos * n_pos * torch.finfo(model.cfg.torch_dtype).bits // 8 * 4
    chunk = max(1, ATTENTION_MEMORY_BUDGET // max(per_row, 1))
    return torch.cat([_readout(model, tokens[i : i + chunk]) for i in range(0, tokens.shape[0], chunk)])


def _readout(model: ExactTransformer, tokens: torch.Tensor) -> torch.Tensor:
    """sigmoid: the logit [batch]; logits: the outputs at cfg.readout_position [batch, out];
    per_position: every output [batch, pos, out] (tokens are unpadded here)."""
    if model.cfg.readout == "sigmoid":
        return model.readout_logits(tokens)
    out = model(tokens)
    return out if model.cfg.readout == "per_position" else out[:, model.cfg.readout_position]


def language_of(construction: Construction, model: ExactTransformer | None = None) -> Language:
    """The construction's language with the parameters its model was built for
    (model.cfg.metadata["language_params"], e.g. Dyck's k and depth bound)."""
    params = model.cfg.metadata.get("language_params", {}) if model is not None else {}
    return get_language(construction.language, **params)


def check_model_length(construction: Construction, model: ExactTransformer, length: int) -> None:
    """The registry's limits plus a limit the model was built for (metadata["max_length"],
    e.g. a nonuniform construction's maximum length N)."""
    construction.check_length(length)
    limit = model.cfg.metadata.get("max_length")
    if limit is not None and length > limit:
        raise ExactLensError(f"{construction.name} was built for |w| <= {limit}; length {length} is beyond it")


def margins(construction: Construction, logits: torch.Tensor) -> torch.Tensor:
    """Per word, how far the output is from the decision boundary: construction.margin if
    set, else |logit| (sigmoid) or the gap between the two largest logits (classes)."""
    if construction.margin is not None:
        return construction.margin(logits)
    if logits.ndim == 2 and logits.shape[1] > 1:
        top = logits.topk(2, dim=1).values
        return top[:, 0] - top[:, 1]
    return logits.abs()


def cross_entropy_bits(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor | None:
    """-log2 P(correct label) per string, in float64: under sigmoid(logit) for bool labels,
    under softmax(logits) for class labels; None when the outputs are not probabilities
    of the labels (e.g. a uniform construction's external check on several outputs)."""
    s = logits.double()
    if labels.dtype == torch.bool and s.ndim == 1:
        return torch.where(labels, F.softplus(-s), F.softplus(s)) / math.log(2)
    if labels.dtype != torch.bool and s.ndim == labels.ndim + 1:
        return -torch.log_softmax(s, dim=-1).gather(-1, labels.unsqueeze(-1)).squeeze(-1) / math.log(2)
    return None


def words_for_length(
    construction: Construction, length: int, strings: int, seed: int, exhaustive_limit: int,
    model: ExactTransformer | None = None,
) -> tuple[torch.Tensor, bool]:
    """All words if there are at most exhaustive_limit of them, else `strings` sampled ones."""
    lang = language_of(construction, model)
    if len(lang.alphabet) ** length <= exhaustive_limit:
        return lang.all_words(length), True
    gen = torch.Generator().manual_seed(seed * 1_000_003 + length)
    return lang.sample(length, strings, gen), False


def decisions(construction: Construction, logits: torch.Tensor, n_positions: torch.Tensor) -> torch.Tensor:
    """construction.decide(logits), or decide(logits, n_positions) for a decide that takes
    two parameters (a threshold that depends on the length, e.g. Nowak et al.'s PALINDROME)."""
    if len(inspect.signature(construction.decide).parameters) == 2:
        return construction.decide(logits, n_positions)
    return construction.decide(logits)


def evaluate_words(construction: Construction, model: ExactTransformer, ids: torch.Tensor) -> dict[str, Any]:
    lang = language_of(construction, model)
    batch = lang.encode(ids)
    tokens = batch.tokens
    logits = readout_logits(model, tokens)
    truth = lang.targets(ids)  # membership bits, or class indices for tasks
    correct = decisions(construction, logits, batch.n_positions) == truth
    ce = cross_entropy_bits(logits, truth)
    return {
        "strings": int(ids.shape[0]),
        "accuracy": float(correct.double().mean()),
        "cross_entropy_bits": None if ce is None else float(ce.mean()),
        "min_abs_logit": float(margins(construction, logits).min()),
        "errors": int((~correct).sum()),
        "finite": bool(torch.isfinite(logits).all()),
    }


def verify(
    name: str,
    lengths: Iterable[int],
    strings: int = 1000,
    dtype: str = "float32",
    seed: int = 0,
    exhaustive_limit: int = 4096,
    params: dict[str, Any] | None = None,
    model: ExactTransformer | None = None,
) -> dict[str, Any]:
    """Accuracy, cross-entropy (bits/string) and the smallest |logit| per length.

    Lengths whose words number at most exhaustive_limit are checked exhaustively.
    """
    construction = get(name)
    if strings < 1:
        raise ExactLensError(f"strings must be >= 1, got {strings}")
    params = params or {}
    model = model if model is not None else construction.make(dtype=dtype, **params)
    results = []
    for length in lengths:
        check_model_length(construction, model, length)
        ids, exhaustive = words_for_length(construction, length, strings, seed, exhaustive_limit, model)
        row = evaluate_words(construction, model, ids)
        results.append({
            "length": length,
            "strings": row["strings"],
            "accuracy": row["accuracy"],
            "cross_entropy_bits": row["cross_entropy_bits"],
            "min_abs_logit": row["min_abs_logit"],
            "exhaustive": exhaustive,
        })
    return {"name": name, "dtype": dtype, "seed": seed, "params": params, "results": results}


def _check_length(construction: Construction, model: ExactTransformer, length: int, strings: int, seed: int
                  ) -> dict[str, Any]:
    lang = language_of(construction, model)
    ids, exhaustive = words_for_length(construction, length, strings, seed, exhaustive_limit=256, model=model)
    hard = lang.hard_words(length)
    if hard.shape[0]:
        ids = torch.cat([ids, hard])
    row = evaluate_words(construction, model, ids)
    return {"length": length, "strings": row["strings"], "errors": row["errors"],
            "min_abs_logit": row["min_abs_logit"], "exhaustive": exhaustive}


def precision(
    name: str,
    dtype: str = "float32",
    max_length: int = 1000,
    strings: int = 64,
    seed: int = 0,
    params: dict[str, Any] | None = None,
    lengths: Sequence[int] | None = None,
) -> dict[str, Any]:
    """Where a construction stops being exact in a dtype.

    Checks sampled words plus the language's hardest words at every length up to
    32 and on a logarithmic grid above; after the first failing grid length, the gap
    to the last passing one is narrowed by bisection down to GAP_SCAN_LIMIT lengths,
    which are then checked one by one (exact when failures persist once they start,
    as they do for every construction here). max_exact_length is the largest length L such that every checked
    length <= L is exact (the full range if nothing fails).
    """
    construction = get(name)
    if max_length < 1:
        raise ExactLensError(f"max_length must be >= 1, got {max_length}")
    params = params or {}
    model = construction.make(dtype=dtype, **params)
    check_model_length(construction, model, max_length)
    if lengths is None:
        grid = sorted(set(range(1, min(32, max_length) + 1)) | set(log_grid(max_length, 16, start=32)
                                                                   if max_length > 32 else []))
    else:
        grid = sorted(set(lengths))
    checked: dict[int, dict[str, Any]] = {}
    first_failure = None
    last_pass = 0
    for length in grid:
        checked[length] = _check_length(construction, model, length, strings, seed)
        if checked[length]["errors"]:
            first_failure = length
            break
        last_pass = length
    if first_failure is not None:
        # Narrow (last_pass, first_failure): every length when the gap is small, else by
        # bisection (assumes failures persist once they start; say so in the output).
        low, high = last_pass, first_failure
        while high - low > 1:
            if high - low <= GAP_SCAN_LIMIT:
                for length in range(low + 1, high):
                    checked[length] = _check_length(construction, model, length, strings, seed)
                    if checked[length]["errors"]:
                        high = length
                        break
                break
            mid = (low + high) // 2
            checked[mid] = _check_length(construction, model, mid, strings, seed)
            low, high = (low, mid) if checked[mid]["errors"] else (mid, high)
        first_failure = high
    rows = [checked[k] for k in sorted(checked)]
    max_exact = (first_failure - 1) if first_failure is not None else max(grid)
    return {
        "name": name,
        "dtype": dtype,
        "params": params,
        "max_exact_length": max_exact,
        "first_failure_length": first_failure,
        "checked": rows,
    }

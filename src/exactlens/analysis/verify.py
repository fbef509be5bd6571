"""verify and precision: accuracy and cross-entropy of constructions, and where floats break them.

Cross-entropy is in bits per string, as in Chiang & Cholak Fig. 2, computed in
float64 from the model's logit (so the model's dtype alone decides the logit).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

import torch
import torch.nn.functional as F

from exactlens.constructions.registry import Construction, get
from exactlens.errors import ExactLensError
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
    return torch.cat([model.readout_logits(tokens[i : i + chunk]) for i in range(0, tokens.shape[0], chunk)])


def cross_entropy_bits(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """-log2 P(correct label) under sigmoid(logit), per string, in float64."""
    s = logits.double()
    nats = torch.where(labels, F.softplus(-s), F.softplus(s))
    return nats / math.log(2)


def words_for_length(
    construction: Construction, length: int, strings: int, seed: int, exhaustive_limit: int
) -> tuple[torch.Tensor, bool]:
    """All words if there are at most exhaustive_limit of them, else `strings` sampled ones."""
    lang = construction.lang()
    if len(lang.alphabet) ** length <= exhaustive_limit:
        return lang.all_words(length), True
    gen = torch.Generator().manual_seed(seed * 1_000_003 + length)
    return lang.sample(length, strings, gen), False


def evaluate_words(construction: Construction, model: ExactTransformer, ids: torch.Tensor) -> dict[str, Any]:
    lang = construction.lang()
    tokens = lang.encode(ids).tokens
    logits = readout_logits(model, tokens)
    truth = lang.membership(ids)
    correct = construction.decide(logits) == truth
    ce = cross_entropy_bits(logits, truth)
    return {
        "strings": int(ids.shape[0]),
        "accuracy": float(correct.double().mean()),
        "cross_entropy_bits": float(ce.mean()),
        "min_abs_logit": float(logits.abs().min()),
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
        construction.check_length(length)
        ids, exhaustive = words_for_length(construction, length, strings, seed, exhaustive_limit)
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
    lang = construction.lang()
    ids, exhaustive = words_for_length(construction, length, strings, seed, exhaustive_limit=256)
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
    construction.check_length(max_length)
    params = params or {}
    model = construction.make(dtype=dtype, **params)
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

"""verify and precision: how well a model answers its task, and where floating point breaks it.

Both read a model only through the task protocol: the task samples (or enumerates) words and
gives their targets, the model's readout gives outputs, and the model's reader (its task and
decision rule, exactlens.tasks.reader) decides. So they work for every kind of task.

Cross-entropy is in bits per word (membership and classification, as in Chiang & Cholak
Fig. 2) or per predicted position (prediction), computed in float64 from the model's outputs
(so the model's dtype alone decides them). ``min_abs_logit`` is the smallest distance of a
word's outputs from the decision boundary (|logit|, or the gap between the two largest
logits); for regression it is null and ``max_abs_error`` says how far the outputs are from
the targets (exact within ``tolerance``: 16 rounding units of the model's dtype at the size of
the values involved).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

import torch

from exactlens import tasks
from exactlens.analysis.verify_request import PrecisionRequest, VerifyRequest
from exactlens.constructions.registry import Construction, get
from exactlens.devices import device_name
from exactlens.dtypes import dtype_name
from exactlens.errors import ExactLensError
from exactlens.model import ExactTransformer
from exactlens.progress import bar
from exactlens.resources import check_work
from exactlens.tasks import kinds
from exactlens.tasks.base import check_seed
from exactlens.tasks.decisions import Reader

ATTENTION_MEMORY_BUDGET = 2**28  # bytes of attention scores per chunk (~256 MB)
GAP_SCAN_LIMIT = 64  # precision(): gaps up to this many lengths are scanned one by one


MAX_LENGTHS = 100_000  # lengths in one 'A:B[:STEP]' grid


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
            grid = range(start, stop + 1, step)
            if len(grid) > MAX_LENGTHS:  # counted before the list is made
                raise ExactLensError(f"lengths {spec!r} name {len(grid)} lengths, more than {MAX_LENGTHS} (each is a "
                                     "run of its own); give a STEP (A:B:STEP) or a shorter range")
            lengths = list(grid)
        else:
            lengths = [int(p) for p in spec.split(",")]
    except ExactLensError:
        raise
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


READOUT_ONLY_FROM = 8192


@torch.no_grad()
def outputs_of(model: ExactTransformer, tokens: torch.Tensor, n_positions: torch.Tensor | None = None) -> torch.Tensor:
    """The model's readout, computed in chunks that keep attention memory bounded. From
    READOUT_ONLY_FROM positions on, the last layer is computed at the readout position only (the same
    outputs; half the [query, key] work of a two-layer model; shorter inputs keep the full pass, so
    every figure measured below that length is unchanged to the last bit). The model runs on its own
    device; the outputs come back on the tokens' device (scoring stays on the CPU)."""
    only = model.cfg.readout != "per_position" and tokens.shape[1] >= READOUT_ONLY_FROM
    outputs = model.readout(tokens, n_positions, max_score_bytes=ATTENTION_MEMORY_BUDGET, readout_only=only)
    return outputs.to(tokens.device)


def readout_logits(model: ExactTransformer, tokens: torch.Tensor) -> torch.Tensor:
    """The model's outputs on unpadded tokens (chunked); the name from before every readout was one."""
    return outputs_of(model, tokens)


def words_for_length(
    task: tasks.Task, length: int, strings: int, seed: int, exhaustive_limit: int
) -> tuple[torch.Tensor, bool]:
    """All words if there are at most exhaustive_limit of them, else `strings` sampled ones."""
    gen = torch.Generator().manual_seed(seed * 1_000_003 + length)
    return task.words(length, strings, gen, exhaustive_limit)


def regression_tolerance(model: ExactTransformer, targets: torch.Tensor) -> float:
    """Exactness tolerance of a regression model: 16 rounding units of its dtype at the size of the
    targets or of the largest value it computes on the way (metadata["value_scale"])."""
    return kinds.regression_tolerance(model.cfg.torch_dtype, targets, model.cfg.metadata.get("value_scale", 1.0))


def evaluate_words(reader: Reader, model: ExactTransformer, ids: torch.Tensor) -> dict[str, Any]:
    """Score the model on words of one length (ids [B, L])."""
    task = reader.task
    batch = task.encode(ids)
    outputs = outputs_of(model, batch.tokens)
    truth = task.targets(ids)
    predictions = reader.decide(outputs, batch.n_positions)
    tolerance = regression_tolerance(model, truth) if task.kind == "regression" else None
    scores = task.score(predictions, truth, batch.n_positions, tolerance)
    ce = kinds.cross_entropy_bits(task, outputs, truth, batch.n_positions) if reader.has_logits else None
    margin = reader.margin(outputs, batch.n_positions, truth)
    finite_word = torch.isfinite(outputs.reshape(outputs.shape[0], -1)).all(dim=1)
    non_finite = int((~finite_word).sum())
    row = {
        "strings": int(ids.shape[0]),
        # a word whose outputs are NaN or infinite has no decision: never counted, always an error
        "accuracy": scores.accuracy if not non_finite else None,
        "cross_entropy_bits": None if ce is None or non_finite else float(ce.mean()),
        "min_abs_logit": None if margin is None or non_finite else float(margin.min()),
        "errors": int((~(scores.correct & finite_word)).sum()),
        "non_finite_words": non_finite,
        "finite": not non_finite,
    }
    if scores.position_correct is not None:
        row["per_position_accuracy"] = scores.per_position_accuracy if not non_finite else None
    if scores.squared_error is not None:
        errors = scores.squared_error[scores.valid].sqrt()
        row["max_abs_error"] = float(errors.max()) if errors.numel() else 0.0
        row["mse"] = float(scores.squared_error[scores.valid].mean()) if errors.numel() else 0.0
        row["tolerance"] = tolerance
    return row


def check_request(model: ExactTransformer, task: tasks.Task, lengths: Iterable[int], words: int, what: str) -> None:
    """Refuse, before any work, a request whose total arithmetic (``words`` per length, each length's
    forward passes) is beyond the work limit (exactlens.resources)."""
    total = sum(model.forward_operations(words, n + task.n_specials) for n in lengths)
    check_work(total, what, "use fewer --strings, fewer lengths or shorter ones")


def verify_model(
    model: ExactTransformer,
    lengths: Iterable[int],
    strings: int = VerifyRequest.strings,
    seed: int = 0,
    exhaustive_limit: int = 4096,
    task: tasks.Task | None = None,
    construction: Construction | None = None,
) -> list[dict[str, Any]]:
    """Per length: accuracy, cross-entropy, smallest margin (and per kind: per-position accuracy,
    regression errors) of any model of a task (its own cfg.task unless ``task`` is given). A length
    where some word's outputs are NaN or infinite has null accuracy, cross-entropy and margin and
    counts those words in ``non_finite_words`` (present only then): no decision is read from a non-finite output."""
    if isinstance(strings, bool) or not isinstance(strings, int) or strings < 1:
        raise ExactLensError(f"strings must be an integer >= 1, got {strings!r}")
    check_seed(seed)
    if isinstance(lengths, (str, bytes)) or not hasattr(lengths, "__iter__"):
        raise ExactLensError(f"lengths are a list of integers (the CLI's 'A:B' is parse_lengths's), got {lengths!r}")
    reader = tasks.reader(model, task)
    lengths = list(lengths)
    if not lengths:
        raise ExactLensError("give at least one length")
    for length in lengths:  # every length checked before any work
        if construction is not None:
            construction.check_length(length, model)
        reader.task.check_length(length)
    check_request(model, reader.task, lengths, strings, f"verifying {len(lengths)} lengths x {strings} words")
    results = []
    for length in bar(lengths, desc="verify", unit="length"):
        ids, exhaustive = words_for_length(reader.task, length, strings, seed, exhaustive_limit)
        row = evaluate_words(reader, model, ids)
        drop = ("errors", "finite") + (() if row["non_finite_words"] else ("non_finite_words",))
        keep = {k: v for k, v in row.items() if k not in drop}
        results.append({"length": length, **keep, "exhaustive": exhaustive})
    return results


def verify(
    name: str,
    lengths: Iterable[int],
    strings: int = VerifyRequest.strings,
    dtype: str = "float32",
    seed: int = 0,
    exhaustive_limit: int = 4096,
    params: dict[str, Any] | None = None,
    model: ExactTransformer | None = None,
    device: Any = None,
) -> dict[str, Any]:
    """Accuracy, cross-entropy and the smallest margin per length of a construction.

    Lengths whose words number at most exhaustive_limit are checked exhaustively. ``device``
    (exactlens.devices; None: the CPU) is where the model runs; a given ``model`` runs where it is.
    """
    construction = get(name)
    params = params or {}
    dtype = dtype_name(dtype)
    model = model if model is not None else construction.make(dtype=dtype, device=device, **params)
    results = verify_model(model, lengths, strings, seed, exhaustive_limit, construction=construction)
    return {
        "name": name,
        "dtype": dtype,
        "seed": seed,
        "params": params,
        "device": device_name(model.device),
        "task": model.cfg.task,
        "decision_rule": tasks.reader(model).name,
        "results": results,
    }


def _check_length(
    construction: Construction, reader: Reader, model: ExactTransformer, length: int, strings: int, seed: int
) -> dict[str, Any]:
    task = reader.task
    ids, exhaustive = words_for_length(task, length, strings, seed, exhaustive_limit=256)
    hard = task.hard_words(length)
    if hard.shape[0]:
        ids = torch.cat([ids, hard.long()])
    row = evaluate_words(reader, model, ids)
    out = {"length": length, "strings": row["strings"], "errors": row["errors"],
           "min_abs_logit": row["min_abs_logit"], "exhaustive": exhaustive}
    if row["non_finite_words"]:  # NaN or infinite outputs: counted among the errors, and said
        out["non_finite_words"] = row["non_finite_words"]
    if "max_abs_error" in row:
        out["max_abs_error"] = row["max_abs_error"]
    return out


HARD_WORDS_BOUND = 128  # hard words per length join the sampled ones (work estimate; PALINDROME has ~100)


def precision_grid(low: int, max_length: int) -> list[int]:
    """Every length up to 32, then a logarithmic grid (16 per decade) up to max_length."""
    return sorted(set(range(low, min(32, max_length) + 1)) | set(log_grid(max_length, 16, start=32)
                                                                  if max_length > 32 else []))


def scan_exactness(model: ExactTransformer, reader: Reader, grid: Sequence[int], low: int, strings: int,
                   seed: int) -> tuple[list[dict[str, Any]], int, int | None]:
    """precision's scan on any model: the checked rows, max_exact_length and first_failure_length."""
    check_request(model, reader.task, grid, strings + HARD_WORDS_BOUND,
                  f"checking {len(grid)} lengths up to {max(grid)} x {strings} words")
    checked: dict[int, dict[str, Any]] = {}
    first_failure = None
    last_pass = low - 1
    for length in bar(grid, desc="precision", unit="length"):
        checked[length] = _check_length(None, reader, model, length, strings, seed)
        if checked[length]["errors"]:
            first_failure = length
            break
        last_pass = length
    if first_failure is not None:
        # Narrow (last_pass, first_failure): every length when the gap is small, else by
        # bisection (assumes failures persist once they start; say so in the output).
        low_end, high = last_pass, first_failure
        while high - low_end > 1:
            if high - low_end <= GAP_SCAN_LIMIT:
                for length in range(low_end + 1, high):
                    checked[length] = _check_length(None, reader, model, length, strings, seed)
                    if checked[length]["errors"]:
                        high = length
                        break
                break
            mid = (low_end + high) // 2
            checked[mid] = _check_length(None, reader, model, mid, strings, seed)
            low_end, high = (low_end, mid) if checked[mid]["errors"] else (mid, high)
        first_failure = high
    rows = [checked[k] for k in sorted(checked)]
    max_exact = (first_failure - 1) if first_failure is not None else max(grid)
    return rows, max_exact, first_failure


def precision(
    name: str,
    dtype: str = "float32",
    max_length: int = 1000,
    strings: int = PrecisionRequest.strings,
    seed: int = 0,
    params: dict[str, Any] | None = None,
    lengths: Sequence[int] | None = None,
    device: Any = None,
) -> dict[str, Any]:
    """Where a construction stops being exact in a dtype.

    Checks sampled words plus the task's hardest words at every length up to 32 and on a
    logarithmic grid above; after the first failing grid length, the gap to the last passing one
    is narrowed by bisection down to GAP_SCAN_LIMIT lengths, which are then checked one by one
    (exact when failures persist once they start, as they do for every construction here).
    max_exact_length is the largest length L such that every checked length <= L is exact (the
    full range if nothing fails). ``device``: where the model runs (exactlens.devices; None: the CPU).
    """
    construction = get(name)
    if isinstance(max_length, bool) or not isinstance(max_length, int) or max_length < 1:
        raise ExactLensError(f"max_length must be an integer >= 1, got {max_length!r}")
    check_seed(seed)
    if isinstance(strings, bool) or not isinstance(strings, int) or strings < 1:
        raise ExactLensError(f"strings must be an integer >= 1, got {strings!r}")
    params = params or {}
    dtype = dtype_name(dtype)
    model = construction.make(dtype=dtype, device=device, **params)
    reader = tasks.reader(model)
    construction.check_length(max_length, model)
    low = max(1, reader.task.min_length, construction.min_length)
    if lengths is None:
        grid = precision_grid(low, max_length)
    else:
        grid = sorted(set(lengths))
    rows, max_exact, first_failure = scan_exactness(model, reader, grid, low, strings, seed)
    return {
        "name": name,
        "dtype": dtype,
        "params": params,
        "device": device_name(model.device),
        "task": model.cfg.task,
        "max_exact_length": max_exact,
        "first_failure_length": first_failure,
        "checked": rows,
    }

"""Unselectable keys inside a model, layer by layer and head by head (Brody, Alon & Yahav 2023).

Brody et al. (Theorem 1, Tables 1-2) ask, for the vectors that enter the attention of each layer,
which of them lie in the convex hull of the others: such a key can never get the strictly highest
score q.k, whatever the query. :func:`unselectable_by_layer` answers this on any model with
TransformerLens hook names (our :class:`~exactlens.model.ExactTransformer`, or a TransformerLens 4
``TransformerBridge``) in two ways, with the exact check of :func:`exactlens.analysis.hull.selectable_keys`
applied to every sequence separately, over its real (unpadded) positions:

(a) Brody's way: the residual vectors of one sequence, as a set of points of R^d_model.
    ``before_ln`` is ``blocks.{l}.hook_resid_pre``; ``after_ln`` is ``blocks.{l}.ln1.hook_normalized``
    (LN before its gain and bias: centring and scaling, the part Brody et al. analyse) for a pre-LN
    model. A gain without zero entries and a bias form an invertible affine map, which keeps hull
    membership, so the LN output proper has the same answer in that case. For a post-LN or LN-free
    model the vectors that enter attention are ``hook_resid_pre`` itself (for post-LN at layer l >= 1
    it is the previous block's LN output); then ``after_ln`` is null and the output says so in
    ``attention_input``.

(b) Per head, with the queries this head can actually form. The (unscaled) score of query position
    a and key position b is s_ab = q_a . k_b with q_a = W_Q^T x_a + b_Q and k_b = W_K^T x_b + b_K in
    R^d_head (``attn.hook_k`` holds the k_b). Whatever the attention input x_a is, q_a lies in the
    affine set b_Q + R, R = range(W_Q^T) (the row space of W_Q [d_model, d_head]), hence in the
    linear subspace Q = span(R, b_Q) of R^d_head. Let B be an orthonormal basis of Q (rows) and
    P = B^T B the orthogonal projection onto Q. For q in Q, q . k = q . (P k) = (B q) . (B k), so
    "some q in Q gives k_i a strictly higher score than every other key" is exactly the
    selectability of B k_i among the points B k_j of R^dim(Q), with queries ranging over all of
    R^dim(Q). We therefore run ``selectable_keys`` on the projected coordinates B k. Consequences:
    a rank-1 W_Q (with b_Q in its row space) puts the projected keys on a line, where only the two
    extreme points can be selected; W_Q = 0 and b_Q = 0 make every score tie, so no key is
    selectable (unless it is alone).

    Q is a superset of the queries the head can reach, so the per-head result is one-sided: a key
    counted *unselectable* is unselectable for every query the head can ever form (sound); a key
    counted *selectable* is selectable by some q in Q, which the head may not reach. The two causes
    of a gap are reported: (i) b_Q outside R (``query_bias_outside_span``): the reachable queries
    form only a half-space {t b_Q + r : t > 0} of Q up to positive scaling; (ii) constrained inputs:
    after LN (pre-LN, or post-LN for l >= 1) x lies in an affine hyperplane, so the reachable
    queries can be a smaller set than b_Q + R. With b_Q in R and unconstrained x the check is exact.
    A positive factor on the scores (1/sqrt(d_head), log n for n >= 2) does not change any argmax.
    The attention mask is not applied: as in Brody et al., the key set is every real position of
    the sequence.

Numerical rank of the query map: singular values of [W_Q; b_Q] below s_max * max(shape) * eps of
the weights' dtype (numpy's ``matrix_rank`` rule) are treated as zero, so a W_Q that is rank 1 in
exact arithmetic but stored in float32 gets rank 1. Every hull check runs in float64 on the cached
activations (in the model's dtype) with the relative tolerance ``tol`` of ``selectable_keys``; for
float32 models a tolerance near float32 rounding (about 1e-6) is the conservative choice when keys
that are equal in exact arithmetic may differ by rounding.
"""

from __future__ import annotations

import numbers
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from exactlens.analysis.hull.keys import METHODS, selectable_keys
from exactlens.analysis.hull.request import HullRequest
from exactlens.dtypes import dtype_name
from exactlens.errors import ExactLensError
from exactlens.tasks.base import check_seed

__all__ = [
    "hull_report",
    "query_space",
    "unselectable_by_layer",
]

DEFAULT_LENGTHS = (2, 4, 8)  # word lengths |w| for constructions
DEFAULT_CHECKPOINT_POSITIONS = (4, 8, 16)  # sequence lengths (positions) for checkpoints


# ----------------------------------------------------------------------------- the query space


def query_space(w_q: Any, b_q: Any | None = None, eps: float | None = None) -> tuple[np.ndarray, bool]:
    """Orthonormal basis (rows, [r, d_head]) of span(range(W_Q^T), b_Q), and whether b_Q is outside range(W_Q^T).

    ``w_q`` is one head's W_Q [d_model, d_head] (row i is the query of the unit input e_i), ``b_q``
    its bias [d_head] or None. ``eps`` is the machine epsilon used for the numerical rank (default:
    that of ``w_q``'s dtype when it is a float32 tensor/array, else float64's).
    """
    if eps is None:
        dt = w_q.dtype if isinstance(w_q, (torch.Tensor, np.ndarray)) else None
        is32 = dt in (torch.float32, torch.float16, torch.bfloat16) or dt == np.float32
        eps = float(np.finfo(np.float32).eps) if is32 else float(np.finfo(np.float64).eps)
    m = _to_numpy(w_q)
    if m.ndim != 2:
        raise ExactLensError(f"W_Q of one head must be [d_model, d_head], got shape {m.shape}")
    b = np.zeros(m.shape[1]) if b_q is None else _to_numpy(b_q).reshape(-1)
    if b.shape != (m.shape[1],):
        raise ExactLensError(f"b_Q has shape {b.shape}, W_Q implies ({m.shape[1]},)")
    g = np.vstack([m, b[None, :]])
    _, sv, vt = np.linalg.svd(g, full_matrices=False)
    if sv.size == 0 or sv[0] == 0:
        return np.zeros((0, m.shape[1])), False
    thresh = sv[0] * max(g.shape) * eps
    basis = vt[: int(np.count_nonzero(sv > thresh))]
    sv_m = np.linalg.svd(m, compute_uv=False)
    rank_m = int(np.count_nonzero(sv_m > thresh))
    return basis, basis.shape[0] > rank_m


def _to_numpy(x: Any) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        return x.detach().cpu().to(torch.float64).numpy()
    return np.asarray(x, dtype=np.float64)


# ----------------------------------------------------------------------------- model access


def _model_facts(model: Any) -> dict[str, Any]:
    cfg = getattr(model, "cfg", None)
    if cfg is None:
        raise ExactLensError(
            f"expected a model with TransformerLens hooks and a cfg (ExactTransformer or TransformerBridge), "
            f"got {type(model).__name__}"
        )
    try:
        facts = {
            "class": type(model).__name__,
            "n_layers": int(cfg.n_layers),
            "n_heads": int(cfg.n_heads),
            "d_model": int(cfg.d_model),
            "d_head": int(cfg.d_head),
        }
    except (AttributeError, TypeError) as err:
        raise ExactLensError(f"the model's cfg lacks n_layers/n_heads/d_model/d_head: {err}") from err
    from exactlens.model.config import ExactConfig

    if isinstance(cfg, ExactConfig):
        uniform = cfg.uniform("normalization")
        facts["normalization"] = uniform if uniform is not None else list(cfg.per_layer("normalization"))
        facts["normalization_source"] = "ExactConfig.normalization"
    else:
        kind = getattr(cfg, "normalization_type", None)
        facts["normalization"] = "none" if kind is None else "pre"
        facts["normalization_source"] = (
            f"cfg.normalization_type={kind!r}" + ("" if kind is None else " (assumed pre-LN: LN before attention)")
        )
    return facts


def _stacked(model: Any, name: str, n_layers: int, n_heads: int) -> torch.Tensor | None:
    """model.W_Q / model.b_Q ([n_layers, n_heads, ...]) or the per-block attn parameters; None if absent."""
    value = getattr(model, name, None)
    if isinstance(value, torch.Tensor) and value.shape[:2] == (n_layers, n_heads):
        return value.detach()
    blocks = getattr(model, "blocks", None)
    try:
        per_block = [getattr(blocks[layer].attn, name) for layer in range(n_layers)]
    except (TypeError, AttributeError, IndexError):
        return None
    if all(isinstance(p, torch.Tensor) for p in per_block):
        return torch.stack([p.detach() for p in per_block])
    return None


def _real_positions(tokens: torch.Tensor, n_positions: Any) -> list[int]:
    if n_positions is None:
        return [int(tokens.shape[1])] * int(tokens.shape[0])
    n = torch.as_tensor(n_positions)
    if n.shape != (tokens.shape[0],) or n.dtype not in (torch.int64, torch.int32):
        raise ExactLensError(
            f"n_positions must be an integer tensor of shape [batch]=({tokens.shape[0]},), got "
            f"shape {tuple(n.shape)} and dtype {n.dtype}"
        )
    out = [int(v) for v in n]
    if min(out) < 1 or max(out) > tokens.shape[1]:
        raise ExactLensError(f"n_positions must lie in [1, {tokens.shape[1]}] (real positions per sequence)")
    return out


def _selectability(vectors: list[np.ndarray], tol: float, method: str, what: str) -> dict[str, Any]:
    fractions, n_unsel = [], []
    for s, v in enumerate(vectors):
        try:
            res = selectable_keys(v, tol=tol, method=method)
        except ExactLensError as err:
            raise ExactLensError(f"{what}, sequence {s}: {err}") from err
        fractions.append(float(res.fraction_unselectable))
        n_unsel.append(int(res.n_unselectable))
    return {
        "fraction_unselectable": float(np.mean(fractions)),
        "fraction_per_sequence": fractions,
        "n_unselectable_per_sequence": n_unsel,
        "n_selectable_per_sequence": [v.shape[0] - u for v, u in zip(vectors, n_unsel, strict=True)],
    }


# ----------------------------------------------------------------------------- public API


@torch.no_grad()
def unselectable_by_layer(
    model: Any, tokens: torch.Tensor, n_positions: Any = None, tol: float = HullRequest.tol, method: str = "fast"
) -> dict[str, Any]:
    """Fractions of unselectable keys per layer (before/after LN) and per head, averaged over sequences.

    ``tokens`` [batch, pos] (integer ids); ``n_positions`` [batch] the real positions of right-padded
    sequences (ExactTransformer only; None = every position is real). ``tol`` and ``method`` are
    those of :func:`~exactlens.analysis.hull.selectable_keys`. See the module docstring for what is
    measured. Returns a JSON-ready dict::

        {"model": {...}, "n_sequences", "n_positions": [...], "tolerance", "method",
         "attention_input": "after_ln" | "before_ln", "attention_input_note",
         "layers": [{"layer", "attention_input",
                     "before_ln": {"hook", "dim", "fraction_unselectable", "fraction_per_sequence",
                                   "n_unselectable_per_sequence", "n_selectable_per_sequence"},
                     "after_ln": {... same fields} | null,
                     "per_head": [{"head", "hook", "query_rank", "query_bias_outside_span", "dim",
                                   ... same fields}]}]}

    ``fraction_unselectable`` is the mean over sequences of each sequence's fraction.
    """
    _check_arguments(tokens, tol, method)
    facts = _model_facts(model)
    n_layers, n_heads = facts["n_layers"], facts["n_heads"]
    lengths = _real_positions(tokens, n_positions)
    kwargs = _forward_options(model, tokens, n_positions, lengths)
    w_q = _stacked(model, "W_Q", n_layers, n_heads)
    if w_q is None:
        raise ExactLensError(f"{type(model).__name__} has no W_Q [n_layers, n_heads, d_model, d_head] to read")
    b_q = _stacked(model, "b_Q", n_layers, n_heads)

    wanted = set()
    for layer in range(n_layers):
        wanted |= {f"blocks.{layer}.hook_resid_pre", f"blocks.{layer}.ln1.hook_normalized",
                   f"blocks.{layer}.attn.hook_k"}
    _, cache = model.run_with_cache(tokens, names_filter=lambda name: name in wanted, **kwargs)
    present = set(cache.keys())

    def vectors(name: str) -> list[np.ndarray]:
        if name not in present:
            raise ExactLensError(f"the model has no hook {name!r} (needed for the hull analysis)")
        acts = cache[name].detach().cpu().to(torch.float64).numpy()
        return [acts[s, :n] for s, n in enumerate(lengths)]

    per_layer = facts["normalization"]
    if isinstance(per_layer, str):
        per_layer = [per_layer] * n_layers
    layers = []
    for layer in range(n_layers):
        pre_ln = per_layer[layer] == "pre"
        entry: dict[str, Any] = {"layer": layer}
        hook = f"blocks.{layer}.hook_resid_pre"
        entry["before_ln"] = {"hook": hook, "dim": facts["d_model"],
                              **_selectability(vectors(hook), tol, method, hook)}
        ln_hook = f"blocks.{layer}.ln1.hook_normalized"
        if pre_ln and ln_hook in present:
            entry["attention_input"] = "after_ln"
            entry["after_ln"] = {"hook": ln_hook, "dim": facts["d_model"],
                                 **_selectability(vectors(ln_hook), tol, method, ln_hook)}
        elif pre_ln:
            raise ExactLensError(f"the model is pre-LN but has no hook {ln_hook!r}")
        else:
            entry["attention_input"] = "before_ln"
            entry["after_ln"] = None
        k_hook = f"blocks.{layer}.attn.hook_k"
        entry["per_head"] = _per_head(vectors(k_hook), tuple(cache[k_hook].shape), k_hook, w_q[layer],
                                      None if b_q is None else b_q[layer], tol, method)
        layers.append(entry)

    norm = facts["normalization"]
    return {
        "model": facts,
        "n_sequences": len(lengths),
        "n_positions": lengths,
        "tolerance": float(tol),
        "method": method,
        "attention_input": "after_ln" if norm == "pre" else "before_ln",
        "attention_input_note": _input_note(norm),
        "query_space_note": ("per_head: keys projected onto span(range(W_Q^T), b_Q); an unselectable key there "
                             "is unselectable for every query the head can form"),
        "layers": layers,
    }


def _check_arguments(tokens: Any, tol: Any, method: Any) -> None:
    if method not in METHODS:
        raise ExactLensError(f"method must be one of {METHODS}, got {method!r}")
    if isinstance(tol, bool) or not isinstance(tol, (int, float)) or not 0.0 < float(tol) < 1.0:
        raise ExactLensError(f"tol must be a float in (0, 1) (relative to the keys' scale), got {tol!r}")
    if not isinstance(tokens, torch.Tensor) or tokens.ndim != 2 or tokens.dtype not in (torch.int64, torch.int32):
        raise ExactLensError("tokens must be an integer torch.Tensor [batch, pos]")
    if tokens.shape[0] == 0 or tokens.shape[1] == 0:
        raise ExactLensError(f"tokens must have shape [batch >= 1, pos >= 1], got {tuple(tokens.shape)}")


def _forward_options(model: Any, tokens: torch.Tensor, n_positions: Any, lengths: list[int]) -> dict[str, Any]:
    """The forward's keyword arguments: ``n_positions`` for an ExactTransformer; other models take no padding."""
    from exactlens.model.transformer import ExactTransformer

    kwargs: dict[str, Any] = {}
    if isinstance(model, ExactTransformer):
        if n_positions is not None:
            kwargs["n_positions"] = torch.as_tensor(n_positions).long()
    elif any(n != tokens.shape[1] for n in lengths):
        raise ExactLensError(
            f"padded sequences (n_positions) need an ExactTransformer; a {type(model).__name__} would attend to "
            "the padding: pass sequences of equal length without n_positions"
        )
    return kwargs


def _per_head(keys: list[np.ndarray], shape: tuple[int, ...], k_hook: str, w_q: Any, b_q: Any, tol: float,
              method: str) -> list[dict[str, Any]]:
    """One layer's heads: its keys (``hook_k``, per sequence [pos, kv_head, d_head]) projected onto each head's
    query space, then checked."""
    n_heads = w_q.shape[0]
    if keys[0].ndim != 3 or keys[0].shape[-1] != w_q.shape[-1]:
        raise ExactLensError(f"{k_hook} has shape {shape}, expected [batch, pos, head, d_head]")
    n_kv = keys[0].shape[1]
    if n_heads % n_kv:
        raise ExactLensError(f"{k_hook} has {n_kv} key heads, which does not divide n_heads={n_heads}")
    heads = []
    for head in range(n_heads):
        basis, outside = query_space(w_q[head], None if b_q is None else b_q[head])
        kv = head // (n_heads // n_kv)
        if basis.shape[0] == 0:  # every query is 0: all scores tie
            projected = [np.zeros((k.shape[0], 1)) for k in keys]
        else:
            projected = [k[:, kv, :] @ basis.T for k in keys]
        what = f"{k_hook} head {head}"
        heads.append({"head": head, "hook": k_hook, "query_rank": int(basis.shape[0]),
                      "query_bias_outside_span": bool(outside), "dim": int(max(basis.shape[0], 1)),
                      **_selectability(projected, tol, method, what)})
    return heads


def _input_note(norm: Any) -> str:
    """What the vectors entering attention are, for the model's normalization (one or per layer)."""
    if not isinstance(norm, str):
        return ("normalization differs per layer (model.normalization lists it): pre-LN layers read ln1's output "
                "(after_ln), the others blocks.{l}.hook_resid_pre (after_ln null)")
    if norm == "pre":
        return ("pre-LN: attention reads ln1's output; after_ln is blocks.{l}.ln1.hook_normalized "
                "(centred and scaled, before gain and bias), before_ln is blocks.{l}.hook_resid_pre")
    if norm == "post":
        return ("post-LN: the vectors entering attention are blocks.{l}.hook_resid_pre itself (the previous "
                "block's LN output for l >= 1, the embeddings for l = 0); after_ln is null")
    return "no layer norm: the vectors entering attention are blocks.{l}.hook_resid_pre itself; after_ln is null"


def _pad(batches: Sequence[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(b.shape[1] for b in batches)
    rows, n_pos = [], []
    for b in batches:
        padded = torch.zeros(b.shape[0], width, dtype=torch.long)
        padded[:, : b.shape[1]] = b
        rows.append(padded)
        n_pos += [b.shape[1]] * b.shape[0]
    return torch.cat(rows), torch.tensor(n_pos, dtype=torch.long)


def _check_lengths(lengths: Sequence[int], what: str, minimum: int) -> list[int]:
    if isinstance(lengths, (str, bytes)) or not hasattr(lengths, "__iter__"):
        raise ExactLensError(f"{what} must be a list of integers, got {lengths!r}")
    lengths = list(lengths)
    if not all(isinstance(n, numbers.Integral) and not isinstance(n, bool) for n in lengths):
        raise ExactLensError(f"{what} must be integers (never rounded), got {lengths!r}")
    out = sorted({int(n) for n in lengths})
    if not out or out[0] < minimum:
        raise ExactLensError(f"{what} must be a non-empty list of integers >= {minimum}, got {list(lengths)!r}")
    return out


def _task_word_batches(spec: dict, positions: list[int], count: int, gen: torch.Generator,
                       defaults: bool) -> tuple[list[torch.Tensor], list[int]]:
    """``count`` of the task's words per number of positions (word length = positions less the task's
    special tokens), encoded. Default positions are moved into the task's word lengths; a given number of
    positions that no word of the task fills is refused, naming the range."""
    from exactlens import tasks

    task = tasks.from_spec(spec)
    low = max(1, task.min_length) + task.n_specials
    high = None if task.max_length is None else task.max_length + task.n_specials
    if defaults:
        positions = sorted({max(low, n) if high is None else min(max(low, n), high) for n in positions})
    for n in positions:
        if n < low or (high is not None and n > high):
            raise ExactLensError(f"{n} positions hold no word of task {task.name!r}: its words fill {low}.."
                                 f"{'' if high is None else high} positions ({task.n_specials} special tokens)")
    return encoded_words(task, [n - task.n_specials for n in positions], count, gen), positions


def encoded_words(task: Any, lengths: Sequence[int], count: int, gen: torch.Generator) -> list[torch.Tensor]:
    """``count`` of the task's words per word length (all of them where there are fewer), as the model
    reads them (its token ids and special tokens), one tensor per length."""
    return [task.encode(task.words(n, count, gen, exhaustive_limit=count)[0]).tokens for n in lengths]


def hull_report(
    target: str | Path,
    *,
    tol: float = HullRequest.tol,
    seed: int = 0,
    lengths: Sequence[int] | None = None,
    sequences_per_length: int = 4,
    dtype: str = "float64",
    method: str = "fast",
    device: Any = None,
) -> dict[str, Any]:
    """:func:`unselectable_by_layer` on a construction (by name) or a checkpoint directory.

    A construction is built in ``dtype`` and run on ``sequences_per_length`` words of its language
    at each word length in ``lengths`` (default 2, 4, 8, raised to its shortest word; capped at the
    construction's stated maximum; all words when there are fewer), right-padded into one batch. A checkpoint
    (``ExactTransformer.load``) is run on ``lengths`` positions (default 4, 8, 16; capped at n_ctx for a
    learned positional table): on its task's words when it records its task (word length = positions less
    the task's special tokens; the defaults moved into the task's lengths), else on uniformly random token
    ids from ``cfg.d_vocab``.
    ``seed`` drives the sampling. ``device`` (exactlens.devices; None: the CPU) is where the model
    runs; the keys come back to the CPU for the hull's linear programs. Returns the dict of
    :func:`unselectable_by_layer` with a ``"target"`` entry describing what was run and ``"device"``.
    """
    from exactlens.devices import device_name, resolve_device

    if not isinstance(target, (str, os.PathLike)):
        raise ExactLensError(f"the hull's target is a construction name or a checkpoint directory, got "
                             f"{type(target).__name__} {target!r:.80}")
    check_seed(seed)
    if isinstance(tol, bool) or not isinstance(tol, (int, float)) or not 0 < tol < 1:
        raise ExactLensError(f"tol must be a float in (0, 1) (relative to the keys' scale), got {tol!r}")
    if isinstance(sequences_per_length, bool) or not isinstance(sequences_per_length, int) or sequences_per_length < 1:
        raise ExactLensError(f"sequences_per_length must be an integer >= 1, got {sequences_per_length!r}")
    gen = torch.Generator().manual_seed(int(seed))
    path = Path(target)
    resolve_device(device)  # a device that is not there fails before any work
    if path.is_dir():
        from exactlens.model.transformer import ExactTransformer

        model = ExactTransformer.load(path)
        model.eval()
        cfg = model.cfg
        wanted = _check_lengths(lengths or DEFAULT_CHECKPOINT_POSITIONS, "lengths (positions)", 1)
        if cfg.learned_positions:
            wanted = sorted({min(n, cfg.n_ctx) for n in wanted})
        info = {"kind": "checkpoint", "path": str(path), "dtype": cfg.dtype,
                "sequences_per_length": sequences_per_length, "seed": int(seed)}
        if cfg.task is not None:  # the words the model was trained on, as it reads them (as for a model object)
            batches, wanted = _task_word_batches(cfg.task, wanted, sequences_per_length, gen, lengths is None)
            info["tokens"] = f"words of task {cfg.task['name']!r} (its token ids and special tokens)"
        else:
            batches = [torch.randint(0, cfg.d_vocab, (sequences_per_length, n), generator=gen) for n in wanted]
            info["tokens"] = "uniform random ids (the checkpoint records no task)"
        info["positions"] = wanted
    else:
        from exactlens.constructions.registry import get_target

        construction = get_target(target)
        dtype = dtype_name(dtype)
        model = construction.make(dtype=dtype)
        lang = construction.lang()
        wanted = _check_lengths(lengths or DEFAULT_LENGTHS, "lengths (word lengths)", 0)
        shortest, longest = construction.length_range(model)  # the construction's, its task's, the model's
        if longest is not None:
            wanted = sorted({min(n, longest) for n in wanted})
        if lengths is None:  # the defaults start at the shortest word it answers (majority-per-position: 6)
            wanted = sorted({max(n, shortest) for n in wanted})
        batches = encoded_words(lang, wanted, sequences_per_length, gen)
        info = {"kind": "construction", "name": construction.name, "paper": construction.paper, "dtype": dtype,
                "word_lengths": wanted, "sequences_per_length": sequences_per_length, "seed": int(seed)}
    tokens, n_positions = _pad(batches)
    where = resolve_device(device, model.cfg.dtype)  # MPS: float32 only
    result = unselectable_by_layer(model.to(where), tokens, n_positions=n_positions, tol=tol, method=method)
    return {"target": info, **result, "device": device_name(where)}

"""Causal alignment by distributed alignment search (DAS; Geiger, Wu, Icard, Potts & Goodman 2024).

A probe says where a variable is *readable*; an intervention on the right subspace says the model
*uses* it there. For a high-level variable V, a site S of the trained model (``hook_resid_pre``,
``hook_attn_out``, ``hook_resid_mid``, ``hook_mlp_out``, ``hook_resid_post``) and a set of positions
(the readout position, or every position), DAS learns an orthonormal basis Q [d_model, k] of a
k-dimensional subspace such that the interchange intervention

    h' = h_base + ((h_source - h_base) Q) Q^T        (at S, at the chosen positions)

makes the trained model give the *counterfactual* answer: what the high-level model answers on
the base input with V set to its value on the source input. Q is fitted by gradient descent on the
task kind's loss (cross-entropy; squared error for regression) against the counterfactual answers,
the model frozen; k in 1..max_dim is chosen on validation pairs; the interchange-intervention
accuracy (IIA) is measured on held-out test pairs.

High-level variables come from two places:

* the task's named causal variables (``Task.variables()`` with a known effect): the counterfactual
  is ``variable.counterfactual(base, source)``, e.g. FIRST with w_1 taken from the source word;
* the exact circuit's residual labels (features it computes, e.g. ``k/n``): the counterfactual is the
  exact model's own decision when that one residual dimension is swapped at the site where the
  label is settled (at the readout position for labels only the unembedding reads).

``iia`` counts the pairs (per target position for per-position tasks) where the intervened trained
model decides the counterfactual answer; ``iia_changed`` only those whose counterfactual answer
differs from the base answer (elsewhere a model that ignores V also scores 1). Two baselines in the
same run: a random orthonormal subspace of the same dimension (``random_iia_changed``) and the same
fit on an untrained model of the same shape (``untrained_iia_changed``, at the row's dimension).
Regression answers are decided by the nearest value among the answers of the batch.

Fits are trained together: the fits (variables x dims x starts) of a group of sites are stacked along
the batch, each row patched with its own Q at its own site, so one forward from the earliest site's
layer on serves them all (:func:`fit_sites`; k by increasing size, a larger k only where a smaller one
is below 1 - DIM_TOLERANCE on validation pairs).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from exactlens import tasks
from exactlens.analysis.diff import illusion, verdicts
from exactlens.analysis.diff.interventions import _patched_outputs
from exactlens.analysis.diff.runs import LengthRun, Side, writer_site
from exactlens.analysis.diff.starts import (
    pick_best,
    pooled_alternative,
    probe_directions,
    start_weights,
    variable_dim,
)
from exactlens.devices import device_of
from exactlens.errors import ExactLensError
from exactlens.model import ExactConfig, ExactTransformer
from exactlens.model.labels import is_negated_copy, label_direction
from exactlens.progress import bar
from exactlens.tasks import kinds

DETERMINED = 0.99  # a variable whose counterfactual is the source's own answer on this share of pairs
SITE_KINDS = ("hook_resid_pre", "hook_attn_out", "hook_resid_mid", "hook_mlp_out", "hook_resid_post")
TRANSPORT_RTOL = 1e-10  # singular values below this (relative) do not count in transported_directions
TRANSPORT_EXACT = 1e-6  # relative misfit above which the trained side is no linear copy of the exact one
SPLIT = (0.6, 0.2, 0.2)  # train / validation (chooses k) / test (reported) pairs


@dataclass
class Settings:
    max_dim: int = 3
    steps: int = 80
    lr: float = 0.05
    batch: int = 32  # pairs per fit per step
    pairs: int = 64  # pairs per length
    seed: int = 0
    untrained: bool = True
    warm_steps: int | None = None  # Adam steps of a fit warm-started from an earlier model's subspace (None: steps)


@dataclass
class HighLevel:
    """One high-level variable: its name, where it comes from, and its counterfactual answers."""

    name: str
    origin: str  # "task" or "exact"
    scope: str  # "word" or "position"
    counterfactual: Callable[[LengthRun, torch.Tensor, torch.Tensor], torch.Tensor]
    base_answer: Callable[[LengthRun, torch.Tensor], torch.Tensor]
    detail: dict[str, Any] = field(default_factory=dict)
    # the variable's value on words b of a run at every token position, [B, n, m] (NaN where it has none):
    # what a probe start fits to (:mod:`.starts`)
    values: Callable[[LengthRun, torch.Tensor], torch.Tensor] | None = None


@dataclass
class PairSet:
    """Base and source word indices of one length, and the answers of every variable on them."""

    run: LengthRun
    base: torch.Tensor
    source: torch.Tensor
    cf: list[torch.Tensor]  # per variable: counterfactual answers
    base_answers: list[torch.Tensor]


# ----------------------------------------------------------------------------- variables


def task_variables(task: tasks.Task) -> list[HighLevel]:
    out = []
    for var in task.variables():
        if not var.interventional:
            continue
        out.append(HighLevel(
            var.name, "task", var.scope,
            lambda run, b, s, v=var: v.counterfactual(run.ids[b], run.ids[s]),
            lambda run, b: run.truth[b],
            {"description": var.description},
            lambda run, b, v=var: _task_values(task, v, run, b),
        ))
    return out


def _task_values(task: tasks.Task, var: Any, run: LengthRun, b: torch.Tensor) -> torch.Tensor:
    """A task variable's values on words b at every token position [B, n, m]: a word's value at every
    position, a position's at its symbol's token (NaN at the specials)."""
    values = var.values(run.ids[b]).double()
    rows, n = len(b), run.tokens.shape[1]
    if var.scope == "position":
        values = values.reshape(rows, values.shape[1], -1)
        out = torch.full((rows, n, values.shape[2]), float("nan"), dtype=torch.float64)
        out[:, task.symbol_offset:task.symbol_offset + values.shape[1]] = values
        return out
    return values.reshape(rows, 1, -1).expand(rows, n, -1)


def exact_variables(exact: Side, features: list[dict[str, Any]]) -> tuple[list[HighLevel], list[dict[str, Any]]]:
    """The exact circuit's computed, non-constant residual labels (from the probe table's features)."""
    out, skipped = [], []
    labels = [feat["label"] for feat in sorted(features, key=lambda f: f["index"])]
    for feat in features:
        if feat["constant"]:
            skipped.append({"variable": feat["label"], "reason": "constant on these words"})
            continue
        if feat["exact_site"] == exact.sites[0]:
            skipped.append({"variable": feat["label"], "reason": "input feature (set by the embedding)"})
            continue
        if is_negated_copy(labels, feat["label"]):
            skipped.append({"variable": feat["label"], "reason": "negated copy in a doubled residual [x; -x]: tested "
                            f"with {feat['label'][2:-1]} as the one direction e_L - e_-(L)"})
            continue
        index, site, scope = feat["index"], feat["exact_site"], feat["positions"]
        direction = (label_direction(labels, feat["label"]).numpy() if len(labels) == exact.d_model
                     else np.eye(exact.d_model)[index])

        def counterfactual(run: LengthRun, b: torch.Tensor, s: torch.Tensor, site=site, direction=direction,
                           scope=scope) -> torch.Tensor:
            rows = exact.model.readout_rows(run.n_positions)
            positions = np.array([int(rows[0])]) if scope == "readout" and rows is not None else None
            n_pos = run.n_positions[b]
            writer = writer_site(exact, site)
            outputs = _patched_outputs(exact, run.tokens[b], writer, direction, run.exact_acts[writer][s.numpy()],
                                       positions, n_pos)
            return no_answer_where_tied(exact, outputs, exact.reader.decide(outputs, n_pos))

        def base_answer(run: LengthRun, b: torch.Tensor) -> torch.Tensor:
            return exact.reader.decide(run.exact_outputs[b], run.n_positions[b])

        def values(run: LengthRun, b: torch.Tensor, site=site, index=index) -> torch.Tensor:
            return torch.as_tensor(run.exact_acts[site][b.numpy()][:, :, index], dtype=torch.float64)[..., None]

        out.append(HighLevel(feat["label"], "exact", "position" if scope == "all" else "word", counterfactual,
                             base_answer, {"exact_site": site, "exact_positions": scope}, values))
    return out, skipped


TIED = -100  # a counterfactual class with no answer (cross-entropy's ignore_index; units() leaves it out)


def no_answer_where_tied(exact: Side, outputs: torch.Tensor, decisions: torch.Tensor) -> torch.Tensor:
    """Argmax decisions of an exact label's patched model, TIED where its two largest logits are equal
    (within 16 rounding units of its dtype): the exact model's answer there is its argmax's tie-break
    (the first class), which a copy in another basis breaks by rounding. tracr-hist: patching one
    dimension of its one-hot count hist_2:0..5 leaves two counts set, whose logits tie; its rotated
    copy took the other class on 2 of 28 changed test pairs (hist_2:1, 0.93)."""
    task = exact.reader.task
    if task.kind not in ("classification", "prediction"):
        return decisions
    logits = outputs.double() if task.kind == "classification" else kinds.symbol_outputs(task, outputs).double()
    if logits.shape[-1] < 2 or logits.shape[:-1] != decisions.shape or not torch.equal(logits.argmax(-1), decisions):
        return decisions  # not an argmax decision
    top = logits.topk(2, -1).values
    tol = kinds.regression_tolerance(exact.model.cfg.torch_dtype, top) if exact.exact else 0.0
    return torch.where(top[..., 0] - top[..., 1] <= tol, torch.full_like(decisions, TIED), decisions)


# ----------------------------------------------------------------------------- pairs and scoring


MIN_SPLIT_WORDS = 10  # distinct words a length needs to give validation and test words of its own


def split_words(run: LengthRun, rng: np.random.Generator) -> list[np.ndarray] | None:
    """Per split (train, validation, test), the indices of one occurrence of each distinct word given
    to it; the three sets of words are disjoint. None where the length has fewer than MIN_SPLIT_WORDS
    distinct words (its pairs then only train)."""
    _, first = np.unique(run.ids.numpy(), axis=0, return_index=True)
    first = np.sort(first)
    if len(first) < MIN_SPLIT_WORDS:
        return None
    order = rng.permutation(first)
    n_val = n_test = max(2, int(round(SPLIT[2] * len(order))))
    return [order[n_val + n_test:], order[:n_val], order[n_val:n_val + n_test]]


def make_pairs(runs: list[LengthRun], variables: list[HighLevel], pairs: int, seed: int,
               notes: dict[str, Any] | None = None) -> tuple[list[PairSet], list[PairSet], list[PairSet]]:
    """Per length: ``pairs`` (base, source) pairs of distinct words, split train / validation / test
    60/20/20 so that no word of a test (or validation) pair is in any other split's pairs. A length
    with fewer than MIN_SPLIT_WORDS distinct words gives training pairs only (listed in
    ``notes["training_only_lengths"]``); validation and test pool the other lengths."""
    rng = np.random.default_rng(seed + 7)
    splits: tuple[list[PairSet], list[PairSet], list[PairSet]] = ([], [], [])
    training_only = []
    counts = [int(round(f * pairs)) for f in SPLIT[:-1]]
    counts.append(pairs - sum(counts))
    for run in runs:
        words = split_words(run, rng)
        if words is None:
            _, first = np.unique(run.ids.numpy(), axis=0, return_index=True)
            if len(first) < 2:
                continue
            words, wanted = [np.sort(first), np.zeros(0, int), np.zeros(0, int)], [pairs, 0, 0]
            training_only.append(run.length)
        else:
            wanted = counts
        for part, pool, count in zip(splits, words, wanted, strict=True):
            if count <= 0 or len(pool) < 2:
                continue
            base_u, source_u = draw_pairs(run.truth[torch.as_tensor(pool)], count, rng)
            b, s = torch.as_tensor(pool[base_u]), torch.as_tensor(pool[source_u])
            part.append(PairSet(run, b, s, [v.counterfactual(run, b, s) for v in variables],
                                [v.base_answer(run, b) for v in variables]))
    word_disjoint = bool(splits[1] and splits[2])
    if not word_disjoint:  # no length has words to spare: split the pairs instead (words then recur), and say so
        splits = _pairs_split(runs, variables, pairs, rng)
        training_only = []
    if notes is not None:
        notes["training_only_lengths"] = training_only
        notes["min_split_words"] = MIN_SPLIT_WORDS
        notes["word_disjoint"] = word_disjoint
        if not word_disjoint:
            notes["note"] = (f"no length has {MIN_SPLIT_WORDS} distinct words: pairs are split 60/20/20 and test "
                             "pairs may share words with training pairs")
    return splits


def draw_pairs(answers: torch.Tensor, count: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """``count`` (base, source) pairs of distinct words of a pool (indices; ``answers``: their task
    answers). Where a word has one discrete answer (membership, classification), the bases take every
    answer equally often (a word uniform among those of its answer), else they are uniform; the source is
    uniform among the other words. Among distinct words some answers are rare (Dyck-1: 2 members among
    the 16 words of length 4), and the pairs that change the answer mostly need a base with the rare one:
    over 10 seeds of the self-diff's pairs (lengths 4-10) this raises the changed test pairs from 11.5 to
    15.8 for Dyck-1's balance, 9.8 to 16.2 for its violation, 14.8 to 25.8 for PALINDROME's mismatches."""
    size = len(answers)
    if answers.ndim != 1 or answers.is_floating_point():
        base = rng.integers(0, size, size=count)
    else:
        _, index = torch.unique(answers, return_inverse=True)
        members = [np.flatnonzero(index.numpy() == c) for c in range(int(index.max()) + 1)]
        classes = np.resize(rng.permutation(len(members)), count)  # every answer as often (+-1) as another
        base = np.array([rng.choice(members[c]) for c in classes], dtype=np.int64)
    return base, (base + rng.integers(1, size, size=count)) % size  # never the base word


def _pairs_split(runs: list[LengthRun], variables: list[HighLevel], pairs: int, rng: np.random.Generator
                 ) -> tuple[list[PairSet], list[PairSet], list[PairSet]]:
    splits: tuple[list[PairSet], list[PairSet], list[PairSet]] = ([], [], [])
    for run in runs:
        count = run.tokens.shape[0]
        if count < 2:
            continue
        base = rng.integers(0, count, size=pairs)
        source = (base + rng.integers(1, count, size=pairs)) % count
        cuts = np.cumsum([int(round(f * pairs)) for f in SPLIT[:-1]])
        for part, (lo, hi) in zip(splits, ((0, cuts[0]), (cuts[0], cuts[1]), (cuts[1], pairs)), strict=True):
            if hi > lo:
                b, s = torch.as_tensor(base[lo:hi]), torch.as_tensor(source[lo:hi])
                part.append(PairSet(run, b, s, [v.counterfactual(run, b, s) for v in variables],
                                    [v.base_answer(run, b) for v in variables]))
    return splits


def units(task: tasks.Task, decisions: torch.Tensor, cf: torch.Tensor, base: torch.Tensor,
          n_positions: torch.Tensor, base_is_decision: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """(right, changed) over the scored units: one per pair, or one per target position of a pair
    for per-position tasks. ``base``: what the counterfactual is compared with to call a unit changed
    (the model's own unpatched decision, or an answer). Regression decisions (and a base that is a
    decision) are decoded to the nearest answer of the batch, answers closer than rounding being one
    (:func:`regression_answers`)."""
    if task.kind == "classification":  # an exact label's tied counterfactual (TIED) is no unit
        keep = cf.long() != TIED
        return (decisions == cf.to(decisions.dtype))[keep], (cf.to(decisions.dtype) != base.to(decisions.dtype))[keep]
    if task.kind == "membership":
        return decisions == cf.to(decisions.dtype), cf.to(decisions.dtype) != base.to(decisions.dtype)
    width = cf.shape[1]
    valid = task.target_mask(n_positions - task.n_specials, width, cf)  # cf's undefined answers are no units
    if task.kind == "prediction":
        valid = valid & (cf.long() != TIED)
    decisions, base = decisions[:, :width], base[:, :width]
    if task.kind == "regression":
        decode, tol = regression_answers(cf[valid])
        right = decode(decisions) == decode(cf)
        changed = decode(cf) != decode(base) if base_is_decision else (cf.double() - base.double()).abs() > tol
    else:
        right = decisions == cf.long()
        changed = cf.long() != base.long()
    return right[valid], changed[valid]


def regression_answers(cf: torch.Tensor) -> tuple[Callable[[torch.Tensor], torch.Tensor], float]:
    """(decode, tol): decode maps outputs to the index of the nearest counterfactual answer of ``cf``,
    answers within tol of each other being one (16 float32 rounding units at the largest answer's size:
    a patch in another basis, e.g. a rotated copy, reaches the same answer by other roundings, and an
    exact float32 model is right within this; sm-solution1's rotated self-diff counted 19 % of its
    exact patches wrong by 1e-14 before)."""
    values = torch.unique(cf.double())
    tol = kinds.regression_tolerance(torch.float32, values)
    if not values.numel():
        return (lambda x: torch.zeros(x.shape, dtype=torch.long)), tol
    answer = torch.cat([values.new_zeros(1, dtype=torch.long), torch.cumsum(torch.diff(values) > tol, 0)])

    def decode(x: torch.Tensor) -> torch.Tensor:
        return answer[(x.double().unsqueeze(-1) - values).abs().argmin(-1)]

    return decode, tol


# ----------------------------------------------------------------------------- the model side


def alignment_sites(side: Side) -> list[str]:
    hooks = set(getattr(side.model, "hook_dict", {}))
    names = ["blocks.0.hook_resid_pre"]
    for layer in range(side.n_layers):
        names += [f"blocks.{layer}.{kind}" for kind in SITE_KINDS[1:]]
    if not side.exact:  # edits at resid_mid of a TransformerBridge do not reach the output (runs.make_side)
        names = [n for n in names if "resid_mid" not in n]
    else:  # a layer without an FFN never runs its hook_mlp_out
        names = [n for n in names if not (n.endswith("hook_mlp_out") and side.model.blocks[_layer_of(n)].mlp is None)]
    return [n for n in names if n in hooks]


def _layer_of(site: str) -> int:
    return int(site.split(".")[1])


class Patcher:
    """Runs a model with rows patched at one site: each row r gets h + m_r ((h_src,r - h) P_r), P_r a
    projector and m_r a 0/1 mask over positions."""

    def __init__(self, side: Side, site: str):
        self.side = side
        self.site = site
        self.model = side.model
        self.start = _layer_of(site) if isinstance(self.model, ExactTransformer) else 0
        self.dtype = next(self.model.parameters()).dtype

    def prepare(self, run: LengthRun, index: torch.Tensor) -> dict[str, torch.Tensor]:
        """Activations of words ``index`` of a run: the site's, and the input of the site's layer."""
        names = {self.site}
        pre = f"blocks.{self.start}.hook_resid_pre"
        if self.start > 0:
            names.add(pre)
        _, cache = self.model.run_with_cache(run.tokens[index], names_filter=lambda n: n in names)
        acts = {"site": cache[self.site].detach()}
        acts["input"] = cache[pre].detach() if self.start > 0 else run.tokens[index]
        return acts

    def outputs(self, base: dict[str, torch.Tensor], source_site: torch.Tensor | dict[str, torch.Tensor],
                projector: torch.Tensor, mask: torch.Tensor, n_positions: torch.Tensor,
                row_sites: list[str] | None = None) -> torch.Tensor:
        """Task outputs of F stacked copies of the base rows, copy f patched with projector[f]
        ([F, d, d]) towards ``source_site`` at the positions of mask[f] ([F, pos]). ``row_sites``: copy
        f is patched at row_sites[f] instead of this patcher's site, towards source_site[row_sites[f]]
        (the input ``base["input"]`` is at this patcher's layer, the earliest of them)."""
        repeats, device = projector.shape[0], device_of(self.model)  # the patch is computed where the model runs
        mask = mask.to(device=device, dtype=self.dtype)
        projector_here = projector.to(device)
        sources = source_site if isinstance(source_site, dict) else {self.site: source_site}
        sources = {k: v.to(device=device, dtype=self.dtype) for k, v in sources.items()}
        row_sites = [self.site] * repeats if row_sites is None else row_sites

        def patch_at(site: str) -> Callable[..., torch.Tensor]:
            rows = [f for f, s in enumerate(row_sites) if s == site]
            src = sources[site]
            if len(rows) == repeats:  # every copy patched here
                def hook(act: torch.Tensor, hook: Any = None) -> torch.Tensor:
                    shaped = act.reshape(repeats, src.shape[0], *act.shape[1:])
                    delta = (src.unsqueeze(0) - shaped) @ projector_here.unsqueeze(1)
                    return (shaped + delta * mask[:, None, :, None]).reshape(act.shape)
                return hook
            index = torch.tensor(rows, device=device)
            here, keep = projector_here[index].unsqueeze(1), mask[index][:, None, :, None]

            def some(act: torch.Tensor, hook: Any = None) -> torch.Tensor:
                shaped = act.reshape(repeats, src.shape[0], *act.shape[1:])
                delta = (src.unsqueeze(0) - shaped[index]) @ here
                return shaped.index_add(0, index, delta * keep).reshape(act.shape)
            return some

        hooks = [(site, patch_at(site)) for site in dict.fromkeys(row_sites)]
        inputs = base["input"].repeat(repeats, *([1] * (base["input"].ndim - 1)))
        n_pos = n_positions.repeat(repeats)
        if not self.side.exact:
            with self.model.hooks(fwd_hooks=hooks):
                return self.side.outputs(self.model(inputs).cpu(), n_pos)
        # An ExactTransformer: the hooks go on their hook points directly (TransformerLens's hooks()
        # context resets every hook point on exit, a tenth of a fit's time). The last layer runs at the
        # readout position only, unless a site is inside that layer (its activations there would
        # cover the readout row only).
        handles = [self.model.hook_dict[site].register_forward_hook(lambda module, args, out, fn=fn: fn(out))
                   for site, fn in hooks]
        try:
            fast = self.model.cfg.readout != "per_position" and not any(
                _inside_last(self.side, site) for site, _ in hooks)
            logits = self.model(inputs, n_pos, start_at_layer=self.start or None, readout_only=fast)
        finally:
            for handle in handles:
                handle.remove()
        return self.model.select_readout(logits, n_pos.to(device)).double().cpu()


def _masks(side: Side, run: LengthRun, fits: list[Fit]) -> torch.Tensor:
    """[F, pos]: where each fit patches (every position, or the readout position)."""
    n = run.tokens.shape[1]
    readout = torch.zeros(n)
    readout[side._row(run.n_positions[:1])] = 1
    return torch.stack([torch.ones(n) if f.positions == "all" else readout for f in fits])


def _orthonormal(weights: torch.Tensor, dims: torch.Tensor) -> torch.Tensor:
    """[F, d, kmax] free weights -> projectors [F, d, d] onto the span of each fit's first dims[f] columns."""
    q, _ = torch.linalg.qr(weights)
    keep = (torch.arange(weights.shape[-1]) < dims.unsqueeze(1)).to(q.dtype)  # [F, kmax]
    q = q * keep.unsqueeze(1)
    return q @ q.transpose(1, 2)


# ----------------------------------------------------------------------------- fitting


@dataclass
class Fit:
    variable: int
    dim: int
    positions: str  # "readout" or "all"


def _acts(patcher: Patcher, pset: PairSet, cache: dict) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    key = id(pset)
    if key not in cache:
        cache[key] = (patcher.prepare(pset.run, pset.base), patcher.prepare(pset.run, pset.source)["site"])
    return cache[key]


SKIPPED = {"iia": None, "iia_changed": None, "skipped": "a smaller k of this variable reached the validation IIA "
           "no larger k can beat by more than DIM_TOLERANCE"}


def fit_sites(task: tasks.Task, side: Side, jobs: list[FitJob], train: list[PairSet], select: list[PairSet],
              settings: Settings, generator: torch.Generator, caches: dict[str, dict], staged: bool = True
              ) -> list[tuple[torch.Tensor, list[str], list[dict[str, Any]]]]:
    """:func:`fit_stage` by increasing k: the fits of each cell (variable, positions) with its smallest k
    first, then the next k only for the cells whose best validation IIA so far is below 1 - DIM_TOLERANCE
    (choose_dim would pick that smaller k whatever a larger one scored). A fit not run gets a zero
    projector, start "skipped" and the scores SKIPPED. ``staged=False``: every k at once (a timeline,
    whose later models start from every k's subspace)."""
    def cell(fit: Fit) -> tuple[int, str]:
        return fit.variable, fit.positions

    rank = [[sorted({g.dim for g in job.fits if cell(g) == cell(f)}).index(f.dim) if staged else 0
             for f in job.fits] for job in jobs]
    out = [(torch.zeros(len(job.fits), side.d_model, side.d_model, dtype=Patcher(side, job.site).dtype),
            ["skipped"] * len(job.fits), [dict(SKIPPED) for _ in job.fits]) for job in jobs]
    done: list[set[tuple[int, str]]] = [set() for _ in jobs]
    for stage in range(max((max(r, default=0) for r in rank), default=0) + 1):
        chosen = [[n for n, f in enumerate(job.fits) if rank[j][n] == stage and cell(f) not in done[j]]
                  for j, job in enumerate(jobs)]
        live = [j for j in range(len(jobs)) if chosen[j]]
        if not live:
            break
        sub = [_restrict(jobs[j], chosen[j]) for j in live]
        for j, (projector, started, scores) in zip(live, fit_stage(task, side, sub, train, select, settings,
                                                                   generator, caches), strict=True):
            for m, n in enumerate(chosen[j]):
                out[j][0][n], out[j][1][n], out[j][2][n] = projector[m], started[m], scores[m]
                if (scores[m]["iia"] or 0.0) >= 1 - DIM_TOLERANCE:
                    done[j].add(cell(jobs[j].fits[n]))
    return out


def _restrict(job: FitJob, keep: list[int]) -> FitJob:
    """The job with only fits ``keep`` (their starts and warm starts with them)."""
    starts = None if job.starts is None else {k: [v[n] for n in keep] for k, v in job.starts.items()}
    warm = None if job.warm is None else (None if job.warm[0] is None else [job.warm[0][n] for n in keep],
                                          job.warm[1])
    return FitJob(job.site, [job.fits[n] for n in keep], starts, warm)


def fit_stage(task: tasks.Task, side: Side, jobs: list[FitJob], train: list[PairSet], select: list[PairSet],
              settings: Settings, generator: torch.Generator, caches: dict[str, dict]
              ) -> list[tuple[torch.Tensor, list[str], list[dict[str, Any]]]]:
    """Fit one subspace per fit of every job (a site, its fits, their starts and warm start); per job the
    projectors [F, d, d], each fit's start and each projector's scores on ``select`` (validation pairs:
    they pick the start here and k in the caller). Every fit starts at random; a job's ``starts`` add,
    per start kind ("probe", "known direction"), per fit the directions [d, r] (or None) of one more
    start, fitted alongside and also scored unfitted (:mod:`.starts`). ``warm`` (a timeline): (per fit
    None or an orthonormal basis [d, dim], the subspace an earlier model's fit found; the Adam steps,
    None: ``settings.steps``); where every fit of a job has one, it is each fit's only start ("warm
    start") and the job takes those steps; otherwise it is one more start where present.

    The candidates of all jobs that take the same steps (and, on an ExactTransformer, are all inside its
    last layer or all before it) are trained in one batch, each row patched at its own site in one
    forward pass (fewer, larger passes; measured on bench_das's trained FIRST with one thread this saved
    little CPU time, the rows being most of the cost; the 2-thread benchmark took 45 s after this and the
    k stages together, 83.9 s before)."""
    plans = []
    for job in jobs:
        start, steps = job.warm if job.warm is not None else (None, None)
        only_warm = start is not None and all(b is not None for b in start)
        starts = job.starts
        if start is not None and any(b is not None for b in start):
            starts = {"warm start": start} if only_warm else {**(starts or {}), "warm start": start}
        candidates = [] if only_warm else [(f, "random", None) for f in range(len(job.fits))]
        candidates += [(f, kind, dirs) for kind, per_fit in (starts or {}).items()
                       for f, dirs in enumerate(per_fit) if dirs is not None and dirs.shape[1]]
        plans.append((candidates, settings.steps if steps is None else steps))
    batches: dict[tuple[int, bool], list[int]] = {}
    for j, job in enumerate(jobs):
        batches.setdefault((plans[j][1], _inside_last(side, job.site)), []).append(j)
    fitted: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
    for (steps, _), members in batches.items():
        fitted.update(_fit_batch(task, side, [jobs[j] for j in members], [plans[j][0] for j in members], members,
                                 train, settings, generator, caches, steps))
    out = []
    for j, job in enumerate(jobs):
        candidates = plans[j][0]
        trained_q, initial = fitted[j]
        started = [c for c, (_, kind, _) in enumerate(candidates) if kind != "random"]
        pool = torch.cat([trained_q, initial[started]])
        meta = [(f, kind) for f, kind, _ in candidates] + [(candidates[c][0], f"{candidates[c][1]}, unfitted")
                                                           for c in started]
        # a fit that diverged (non-finite Q: e.g. a layer norm with a tiny eta) patches nothing and never wins
        diverged = ~torch.isfinite(pool).flatten(1).all(1)
        pool = torch.where(diverged[:, None, None], torch.zeros_like(pool), pool)
        meta = [(f, f"{kind}, diverged") if bool(diverged[c]) else (f, kind) for c, (f, kind) in enumerate(meta)]
        scores = score_group(task, side, job.site, [job.fits[f] for f, _ in meta], select, pool, caches[job.site])
        scores = [{"iia": None, "iia_changed": None, "diverged": True} if bool(diverged[c]) else sc
                  for c, sc in enumerate(scores)]
        best = [_best_of(f, meta, scores) for f in range(len(job.fits))]
        out.append((pool[best], [meta[b][1] for b in best], [scores[b] for b in best]))
    return out


ACTIVATION_BUDGET = 1 << 30  # bytes of cached activations a group of sites may hold (per model)


def site_groups(side: Side, sites: list[str], psets: list[PairSet]) -> list[list[str]]:
    """Consecutive sites whose fits run in one batch (:func:`fit_sites`): as many as the activations
    they cache (base and source words, at the site and at its layer's input, for every pair set) fit
    in ACTIVATION_BUDGET; at least one site per group."""
    words = sum(len(p.base) * p.run.tokens.shape[1] for p in psets)
    per_site = 4 * words * side.d_model * torch.finfo(next(side.model.parameters()).dtype).bits // 8
    size = max(1, ACTIVATION_BUDGET // max(per_site, 1))
    return [sites[i:i + size] for i in range(0, len(sites), size)]


@dataclass
class FitJob:
    site: str
    fits: list[Fit]
    starts: dict[str, list[torch.Tensor | None]] | None = None
    warm: tuple[list[torch.Tensor | None], int | None] | None = None


def _inside_last(side: Side, site: str) -> bool:
    return _layer_of(site) == side.n_layers - 1 and not site.endswith("resid_pre")


def _best_of(f: int, meta: list[tuple[int, str]], scores: list[dict[str, Any]]) -> int:
    """Fit f's best candidate; on a tie an unfitted start wins: it did not move to fit the training pairs
    (majority's 20-class frac_h: its fitted known direction tied at 1.0 with few changed units, 0.7 on test)."""
    own = sorted((c for c, (g, _) in enumerate(meta) if g == f), key=lambda c: not meta[c][1].endswith("unfitted"))
    return own[pick_best([scores[c] for c in own])]


def _fit_batch(task: tasks.Task, side: Side, jobs: list[FitJob], candidates: list[list[tuple[int, str, Any]]],
               ids: list[int], train: list[PairSet], settings: Settings, generator: torch.Generator,
               caches: dict[str, dict], steps: int) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
    """Adam on the candidates of several jobs (per job: fit index, start kind, start directions or None)
    stacked along one batch, each patched at its job's site; per job id its fitted projectors and
    their starts' projectors."""
    patchers = [Patcher(side, job.site) for job in jobs]
    first = min(range(len(jobs)), key=lambda j: patchers[j].start)  # the group's forward starts at its layer
    cand_fits = [job.fits[f] for job, cands in zip(jobs, candidates, strict=True) for f, _, _ in cands]
    rows_of = [j for j, cands in enumerate(candidates) for _ in cands]
    dims = torch.tensor([f.dim for f in cand_fits])
    weights = start_weights([c[2] for cands in candidates for c in cands], dims.tolist(), side.d_model, generator,
                            patchers[0].dtype)
    initial = _orthonormal(weights, dims)
    weights.requires_grad_(True)
    optimizer = torch.optim.Adam([weights], lr=settings.lr)
    frozen = [p for p in side.model.parameters() if p.requires_grad]
    for p in frozen:
        p.requires_grad_(False)
    usable = [p for p in train if len(p.base)]
    try:
        with torch.enable_grad():
            for step in range(steps):
                pset = usable[step % len(usable)]
                pick = torch.randperm(len(pset.base), generator=generator)[: settings.batch]
                base = _acts(patchers[first], pset, caches[jobs[first].site])[0]
                sources = {job.site: _acts(p, pset, caches[job.site])[1][pick]
                           for p, job in zip(patchers, jobs, strict=True)}
                n_pos = pset.run.n_positions[pset.base[pick]]
                outputs = patchers[first].outputs(
                    {"input": base["input"][pick]}, sources, _orthonormal(weights, dims),
                    _masks(side, pset.run, cand_fits), n_pos, [jobs[j].site for j in rows_of])
                targets = torch.cat([pset.cf[f.variable][pick] for f in cand_fits])
                n_all = n_pos.repeat(len(cand_fits))
                loss = kinds.loss(task, side.reader.evidence(outputs, n_all), targets, n_all).sum() / len(pick)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
    finally:
        for p in frozen:
            p.requires_grad_(True)
    with torch.no_grad():
        fitted = _orthonormal(weights.detach(), dims)
    out, at = {}, 0
    for j, cands in zip(ids, candidates, strict=True):
        out[j] = (fitted[at:at + len(cands)], initial[at:at + len(cands)])
        at += len(cands)
    return out


def probe_starts(side: Side, site: str, fits: list[Fit], train: list[PairSet], variables: list[HighLevel],
                 cache: dict) -> dict[str, list[torch.Tensor | None]]:
    """Per start kind, per fit, the directions of a ridge probe of its variable's value on the site's
    activations of the training base words at the fit's positions (:func:`.starts.probe_directions`); a fit
    at every position: "probe", one probe per length and position, taken together, and "probe (pooled)", one
    over all of them where its direction differs (:func:`.starts.pooled_alternative`)."""
    patcher = Patcher(side, site)
    out: dict[tuple[int, str], torch.Tensor | None] = {}
    alternative: dict[tuple[int, str], torch.Tensor | None] = {}
    for fit in fits:
        key = (fit.variable, fit.positions)
        if key in out:
            continue
        v = variables[fit.variable]
        xs, ys, groups, offset = [], [], [], 0
        for pset in train:
            if not len(pset.base) or v.values is None:
                continue
            mask = _masks(side, pset.run, [fit])[0].bool()
            x = _acts(patcher, pset, cache)[0]["site"][:, mask].double().cpu()
            y = v.values(pset.run, pset.base)[:, mask]
            group = (offset + torch.arange(x.shape[1])).expand(x.shape[0], -1)  # one per pair set and position
            offset += x.shape[1]
            x, y, group = x.reshape(-1, x.shape[-1]), y.reshape(-1, y.shape[-1]), group.reshape(-1)
            keep = torch.isfinite(y).all(-1) & torch.isfinite(x).all(-1)
            xs.append(x[keep])
            ys.append(y[keep])
            groups.append(group[keep])
        grouped = torch.cat(groups) if fit.positions == "all" and xs else None
        out[key] = probe_directions(torch.cat(xs), torch.cat(ys), grouped) if xs else None
        alternative[key] = (pooled_alternative(torch.cat(xs), torch.cat(ys), out[key])
                            if grouped is not None and out[key] is not None else None)
    return {"probe": [out[(f.variable, f.positions)] for f in fits],
            "probe (pooled)": [alternative[(f.variable, f.positions)] for f in fits]}


def variable_dims(variables: list[HighLevel], cells: list[tuple[int, str]], side: Side, train: list[PairSet],
                  cap: int) -> dict[tuple[int, str], int]:
    """Per cell (variable, positions), the variable's dimension on the training base words at those
    positions (:func:`.starts.variable_dim`)."""
    out = {}
    for i, pos in cells:
        v, ys = variables[i], []
        for pset in train:
            if not len(pset.base) or v.values is None:
                continue
            mask = _masks(side, pset.run, [Fit(i, 1, pos)])[0].bool()
            y = v.values(pset.run, pset.base)[:, mask]
            y = y.reshape(-1, y.shape[-1])
            ys.append(y[torch.isfinite(y).all(-1)])
        out[(i, pos)] = variable_dim(torch.cat(ys), cap) if ys else 1
    return out


@torch.no_grad()
def score_group(task: tasks.Task, side: Side, site: str, fits: list[Fit], psets: list[PairSet],
                projector: torch.Tensor, cache: dict | None = None, rows: list[int] | None = None
                ) -> list[dict[str, Any]]:
    """IIA of each fit's projector on pair sets, scored against the model: a unit is *changed* when
    its counterfactual answer differs from the model's own unpatched decision on the base (run in the
    same batch as a zero projector). Per fit: units, changed_units, right_changed, iia, iia_changed,
    do_nothing_iia (not patching, on the changed units), and the same against the task's answer
    (task_changed_units, iia_changed_task, do_nothing_iia_task: what "changed" meant before).
    ``rows``: fit f's projector is projector[rows[f]] (default: f); fits that share one (at the same
    positions: random subspaces scored for several variables) share its patched run."""
    patcher = Patcher(side, site)
    keys = ("right", "changed", "nothing", "task_changed")
    got: list[dict[str, list[torch.Tensor]]] = [{k: [] for k in keys} for _ in fits]
    cache = {} if cache is None else cache
    rows = list(range(len(fits))) if rows is None else rows
    at = {r: fits[f] for f, r in reversed(list(enumerate(rows)))}  # the positions each projector patches
    if len(at) != projector.shape[0] or any(fits[f].positions != at[r].positions for f, r in enumerate(rows)):
        raise ValueError("score_group: every projector row is used, by fits patching the same positions")
    stacked = [at[r] for r in range(projector.shape[0])] + [Fit(-1, 0, "readout")]
    zero = torch.zeros(1, *projector.shape[1:], dtype=patcher.dtype)
    projector = torch.cat([projector.to(patcher.dtype), zero])
    for pset in psets:
        if not len(pset.base):
            continue
        base, source = _acts(patcher, pset, cache)
        n_pos = pset.run.n_positions[pset.base]
        outputs = patcher.outputs(base, source, projector, _masks(side, pset.run, stacked), n_pos)
        decisions = side.reader.decide(outputs, n_pos.repeat(len(stacked)))
        decisions = decisions.reshape(len(stacked), len(pset.base), *decisions.shape[1:])
        own = decisions[-1]
        for f, fit in enumerate(fits):
            cf = pset.cf[fit.variable]
            r, c = units(task, decisions[rows[f]], cf, own, n_pos)
            nothing, _ = units(task, own, cf, own, n_pos)
            _, task_changed = units(task, own, cf, pset.base_answers[fit.variable], n_pos, base_is_decision=False)
            for k, v in zip(keys, (r, c, nothing, task_changed), strict=True):
                got[f][k].append(v)
    out = []
    for g in got:
        r, c, nothing, tc = (torch.cat(g[k]) if g[k] else torch.zeros(0, dtype=torch.bool) for k in keys)
        n_changed, n_task = int(c.sum()), int(tc.sum())
        out.append({
            "units": int(r.numel()),
            "changed_units": n_changed,
            "right_changed": int(r[c].sum()),
            "iia": float(r.double().mean()) if r.numel() else None,
            "iia_changed": float(r[c].double().mean()) if n_changed else None,
            "do_nothing_iia": float(nothing[c].double().mean()) if n_changed else None,
            "task_changed_units": n_task,
            "iia_changed_task": float(r[tc].double().mean()) if n_task else None,
            "do_nothing_iia_task": float(nothing[tc].double().mean()) if n_task else None,
        })
    return out


DIM_TOLERANCE = 0.01


def choose_dim(by_dim: dict[int, float | None]) -> int:
    """The smallest dimension whose validation IIA is within DIM_TOLERANCE of the best."""
    scored = [v for v in by_dim.values() if v is not None]
    if not scored:
        return min(by_dim)
    best = max(scored)
    return min(k for k, v in by_dim.items() if v is not None and v >= best - DIM_TOLERANCE)


def random_projectors(dims: list[int], d: int, generator: torch.Generator, dtype: torch.dtype) -> torch.Tensor:
    weights = torch.randn(len(dims), d, max(dims), generator=generator, dtype=dtype)
    return _orthonormal(weights, torch.tensor(dims))


def random_scores(task: tasks.Task, side: Side, site: str, fits: list[Fit], psets: list[PairSet],
                  generator: torch.Generator, dtype: torch.dtype, cache: dict) -> list[dict[str, Any]]:
    """The random-subspace baseline: RANDOM_DRAWS random subspaces of each fit's dimension, scored for
    its variable (fit n's draws are scores n * RANDOM_DRAWS ...). Fits of one dimension and positions
    share their draws: a random subspace does not depend on the variable, only the comparison does."""
    shapes = sorted({(f.dim, f.positions) for f in fits})
    projector = random_projectors([dim for dim, _ in shapes for _ in range(verdicts.RANDOM_DRAWS)], side.d_model,
                                  generator, dtype)
    draws = [f for f in fits for _ in range(verdicts.RANDOM_DRAWS)]
    rows = [shapes.index((f.dim, f.positions)) * verdicts.RANDOM_DRAWS + j
            for f in fits for j in range(verdicts.RANDOM_DRAWS)]
    return score_group(task, side, site, draws, psets, projector, cache, rows)


def bases(projector: torch.Tensor, fits: list[Fit]) -> list[torch.Tensor]:
    """Per fit, an orthonormal basis [d, dim] of its projector's range (its top eigenvectors)."""
    _, vectors = torch.linalg.eigh(projector.double())  # ascending eigenvalues: the range is the last columns
    return [vectors[f, :, vectors.shape[-1] - fit.dim:].flip(-1) for f, fit in enumerate(fits)]


def untrained_copy(model: Any, seed: int) -> Any | None:
    """A randomly initialized model of the same shape (ExactTransformer only; None otherwise)."""
    if not isinstance(model, ExactTransformer):
        return None
    copy = ExactTransformer(ExactConfig.from_dict(model.cfg.to_dict()))
    copy.init_weights(seed)
    return copy.to(device_of(model)).eval()


# ----------------------------------------------------------------------------- the table


def alignment_table(
    runs: list[LengthRun],
    trained: Side,
    exact: Side,
    features: list[dict[str, Any]] | None,
    settings: Settings,
    untrained: Side | None = None,
    progress: Callable[[int, int], None] | None = None,
    carry: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The ``alignment`` rows of the diff JSON and their summary (see the module docstring), with the
    trained model's hard attention tolerant of rounding while it is patched (:func:`rounding_ties`).
    ``carry``: what a timeline shares between its models (empty for one diff): the variables and pairs,
    made for the first model and reused (they read only the words and the exact side), and each fit's
    subspace, where the next model's fit starts (``settings.warm_steps`` steps instead of ``settings.steps``)."""
    carry = {} if carry is None else carry
    if "alignment_pairs" not in carry:
        carry["alignment_pairs"] = _prepare(runs, trained, exact, features, settings)
    with rounding_ties(trained) as tolerance:
        table = _alignment_rows(runs, trained, exact, settings, untrained, progress, carry, carry["alignment_pairs"])
    table["settings"]["hard_tie_tolerance"] = tolerance
    return table


@contextmanager
def rounding_ties(side: Side) -> Iterator[float | None]:
    """Hard attention picks the maximal scores, and the constructions rely on exact ties (e.g. the
    rightmost of several equal keys). A subspace patch h + ((h_src - h) Q) Q^T with Q off the axes
    moves every value by rounding (~1e-16), which breaks such ties at random: induction-recent's own
    "previous symbol" directions, swapped exactly, scored 0.83 instead of 1.0. While DAS patches an
    ExactTransformer with hard attention, scores within the rounding scale (1e-9 in float64, 1e-4 in
    float32, as for a rotated copy: ``model.basis.rotate_residual``) count as tied; yields the
    tolerance used (None: no hard attention, or not an ExactTransformer)."""
    model = side.model
    cfg = getattr(model, "cfg", None)
    hard = isinstance(model, ExactTransformer) and any(
        w != "softmax" and "hard" in w for w in cfg.per_layer("attention_weighting"))
    if not hard:
        yield None
        return
    before = cfg.hard_tie_tolerance
    cfg.hard_tie_tolerance = max(before, 1e-9 if cfg.dtype == "float64" else 1e-4)
    try:
        yield cfg.hard_tie_tolerance
    finally:
        cfg.hard_tie_tolerance = before


def _prepare(runs: list[LengthRun], trained: Side, exact: Side, features: list[dict[str, Any]] | None,
             settings: Settings) -> tuple:
    """The variables to align, the skipped ones, the train/validation/test pairs and the split's notes."""
    task = exact.reader.task
    if not 1 <= settings.max_dim:
        raise ExactLensError(f"max_dim must be >= 1, got {settings.max_dim}")
    variables = task_variables(task)
    skipped: list[dict[str, Any]] = [
        {"variable": v.name, "reason": "no known effect on the answer"}
        for v in task.variables() if not v.interventional
    ]
    if features is not None:
        more, skip = exact_variables(exact, features)
        variables += more
        skipped += skip
    rule = trained.reader.rule
    if rule is not None and rule.evidence is None and not rule.logits:
        skipped.append({"variable": None, "reason": f"the trained model's decision rule {rule.name!r} gives no "
                        "differentiable evidence to fit a subspace by"})
        variables = []
    split_notes: dict[str, Any] = {}
    train, val, test = make_pairs(runs, variables, settings.pairs, settings.seed, split_notes)
    return variables, skipped, (train, val, test), split_notes


def _alignment_rows(runs: list[LengthRun], trained: Side, exact: Side, settings: Settings, untrained: Side | None,
                    progress: Callable[[int, int], None] | None, carry: dict[str, Any], prepared: tuple
                    ) -> dict[str, Any]:
    """The rows of :func:`alignment_table` from its ``prepared`` variables, skipped ones, pairs and notes."""
    variables, skipped, (train, val, test), split_notes = prepared
    task = exact.reader.task
    if not variables or not train:
        return {"rows": [], "skipped": skipped, "sites": [], "settings": _settings(settings, trained)}
    sites = alignment_sites(trained)
    per_position = task.readout == "per_position"
    gen = torch.Generator().manual_seed(settings.seed)
    max_dim = min(settings.max_dim, trained.d_model)
    determined = [source_determined(task, train, i) for i in range(len(variables))]
    base_cells = [(i, positions_of(v, determined[i], per_position)) for i, v in enumerate(variables)]
    # Answer-determined variables are localized where they can be told from the answer: at every
    # position of a component's output (which does not hold the input), see localizable().
    extra = [(i, "all") for i, v in enumerate(variables)
             if determined[i] >= DETERMINED and localizable(v) and base_cells[i][1] != "all"]
    solves = verdicts.solves_task(task, runs, trained, units)
    if settings.warm_steps is not None and not solves["solves"]:  # a timeline's checkpoint: no fit changes it
        return _unsolved(variables, skipped, settings, trained, split_notes, solves)
    known = known_directions(trained, variables, exact, train)
    warm = carry.setdefault("alignment_fits", {})  # (site, origin, variable, positions, dim, d) -> basis
    # k = 1..max_dim, and the variable's own dimension where it needs more (classes - 1, a count vector)
    needs = variable_dims(variables, base_cells + extra, trained, train, trained.d_model)
    dims_of = {cell: sorted(set(range(1, max_dim + 1)) | {need}) for cell, need in needs.items()}
    rows: list[dict[str, Any]] = []
    finished = 0
    site_bar = bar(total=len(sites), desc="DAS sites", unit="site")
    for group in site_groups(trained, sites, train + val + test):
        caches: dict[str, dict] = {site: {} for site in group}  # per site: its activations of every pair set
        plans, jobs = {}, []
        for site in group:
            cells = base_cells + (extra if site.endswith(COMPONENT_SITES) else [])
            fits = [Fit(i, k, pos) for i, pos in cells for k in dims_of[(i, pos)]]
            keys = [(site, variables[f.variable].origin, variables[f.variable].name, f.positions, f.dim,
                     trained.d_model) for f in fits]
            start = [warm.get(key) for key in keys]
            all_warm = all(b is not None for b in start)
            steps = _fit_steps(settings, all_warm)
            starts = {} if all_warm else probe_starts(trained, site, fits, train, variables, caches[site])
            if known and not all_warm:  # an exact label's own dimension replaces its probe starts (a probe finds it)
                for kind in ("probe", "probe (pooled)"):
                    starts[kind] = [None if f.variable in known else p for f, p in zip(fits, starts[kind], strict=True)]
                starts["known direction"] = [known[f.variable][:, None] if f.variable in known else None
                                             for f in fits]
            plans[site] = {"cells": cells, "fits": fits, "keys": keys, "steps": steps}
            jobs.append(FitJob(site, fits, starts, (start, steps)))
        fitted = fit_sites(task, trained, jobs, train, val, settings, gen, caches, staged=settings.warm_steps is None)
        for job, (projector, started, val_scores) in zip(jobs, fitted, strict=True):
            plan, site, cache = plans[job.site], job.site, caches[job.site]
            if settings.warm_steps is not None and solves["solves"]:  # a timeline's later model starts here
                warm.update((key, basis) for key, basis, how in zip(plan["keys"], bases(projector, job.fits), started,
                                                                     strict=True) if how != "skipped")
            chosen = []
            for i, pos in plan["cells"]:
                index = {f.dim: j for j, f in enumerate(job.fits) if (f.variable, f.positions) == (i, pos)}
                index = {k: j for k, j in index.items() if "skipped" not in val_scores[j]}
                by_dim = {k: val_scores[j]["iia"] for k, j in index.items()}
                chosen.append((choose_dim(by_dim), by_dim, index))
            picked_index = [c[2][c[0]] for c in chosen]
            picked = [job.fits[j] for j in picked_index]
            proj = projector[picked_index]
            plan.update(chosen=chosen, picked=picked, proj=proj, started=started, val_scores=val_scores,
                        test_scores=score_group(task, trained, site, picked, test, proj, cache),
                        train_scores=score_group(task, trained, site, picked, train, proj, cache),
                        rand_scores=random_scores(task, trained, site, picked, test, gen, proj.dtype, cache))
        if untrained is not None:  # the same fit on the untrained copy, at each row's dimension
            u_caches: dict[str, dict] = {site: {} for site in group}
            u_jobs = [FitJob(site, plans[site]["picked"], probe_starts(
                untrained, site, plans[site]["picked"], train, variables, u_caches[site])) for site in group]
            for job, (u_proj, _, _) in zip(u_jobs, fit_sites(task, untrained, u_jobs, train, val, settings, gen,
                                                              u_caches), strict=True):
                plans[job.site]["u_scores"] = score_group(task, untrained, job.site, job.fits, test, u_proj,
                                                          u_caches[job.site])
        for site in group:
            common = {"variables": variables, "determined": determined, "needs": needs, "settings": settings,
                      "solves": solves}
            rows += _site_rows(task, trained, site, plans[site], common, train, test, caches[site])
            finished += 1
            site_bar.update(1)
            if progress is not None:
                progress(finished, len(sites))
    site_bar.close()
    readout = "CLS" if task.use_cls and exact.readout_position == 0 and not per_position else "readout"
    return {"rows": rows, "skipped": skipped, "sites": sites, "variables": _describe(variables, determined),
            "settings": _settings(settings, trained), "split": split_notes, "solves": solves,
            "verdicts": verdicts.variable_verdicts(rows, sites, readout), **summarize(rows, variables, sites)}


def _site_rows(task: tasks.Task, trained: Side, site: str, plan: dict[str, Any], common: dict[str, Any],
               train: list[PairSet], test: list[PairSet], cache: dict) -> list[dict[str, Any]]:
    """One site's rows from its fits' scores (``plan``: the cells, the chosen k, the picked fits and
    their projectors, and their validation, test, training, random and untrained scores; ``common``:
    the variables, their source_determined shares and dimensions, the settings, and whether the model
    solves the task)."""
    variables, determined, needs = common["variables"], common["determined"], common["needs"]
    settings, solves = common["settings"], common["solves"]
    with_untrained = "u_scores" in plan
    component = site.endswith(COMPONENT_SITES)
    steps, started, val_scores = plan["steps"], plan["started"], plan["val_scores"]
    test_scores, train_scores, rand_scores = plan["test_scores"], plan["train_scores"], plan["rand_scores"]
    site_rows = []
    for n, ((i, pos), (dim, by_dim, index)) in enumerate(zip(plan["cells"], plan["chosen"], strict=True)):
        v = variables[i]
        scores = test_scores[n]
        random_draws = [r["iia_changed"] for r in rand_scores[n * verdicts.RANDOM_DRAWS:
                                                               (n + 1) * verdicts.RANDOM_DRAWS]]
        training = train_scores[n]["iia_changed"]
        row = {
            "variable": v.name,
            "origin": v.origin,
            "site": site,
            "position": pos,
            "dim": dim,
            "pairs": sum(len(p.base) for p in test),
            "units": scores["units"],
            "changed": scores["changed_units"] / scores["units"] if scores["units"] else None,
            "iia": scores["iia"],
            "iia_changed": scores["iia_changed"],
            "changed_pairs": scores["changed_units"],
            "iia_ci": verdicts.wilson(scores["right_changed"], scores["changed_units"]),
            "do_nothing_iia": scores["do_nothing_iia"],
            "lift": None if scores["iia_changed"] is None else scores["iia_changed"] - scores["do_nothing_iia"],
            "iia_changed_task": scores["iia_changed_task"],
            "do_nothing_iia_task": scores["do_nothing_iia_task"],
            "task_changed_pairs": scores["task_changed_units"],
            "random_iia_changed": verdicts.mean(random_draws),
            "random_iia_p95": verdicts.p95(random_draws),
            "random_draws": len(random_draws),
            "untrained_iia_changed": plan["u_scores"][n]["iia_changed"] if with_untrained else None,
            "training_iia_changed": training,
            "converged": None if training is None else training >= verdicts.CONVERGED_IIA,
            "validation_iia": val_scores[index[dim]]["iia"],
            "validation_iia_changed": val_scores[index[dim]]["iia_changed"],
            "validation_iia_by_dim": {str(k): val for k, val in by_dim.items()},
            "init": started[index[dim]],  # the start the fit kept (random, probe, known direction[, unfitted])
            "variable_dim": needs[(i, pos)],
        }
        if settings.warm_steps is not None:  # a timeline's fit: how many Adam steps it took
            row["fit_steps"] = settings.steps if steps is None else steps
        # the localization test of an answer-determined variable: every position of a component output
        row["source_determined"] = determined[i]
        row["test"] = "localization" if determined[i] >= DETERMINED and component and pos == "all" \
            and localizable(v) else "interchange"
        site_rows.append(row)
    check_illusions(task, trained, site, plan["picked"], plan["proj"], site_rows, train, test, cache)
    for row, (i, _) in zip(site_rows, plan["cells"], strict=True):
        row["verdict"] = verdicts.row_verdict(row, determined[i] if row["test"] == "interchange" else 0.0,
                                              solves["solves"], DETERMINED)
    return site_rows


def _unsolved(variables: list[HighLevel], skipped: list[dict[str, Any]], settings: Settings, trained: Side,
              split_notes: dict[str, Any], solves: dict[str, Any]) -> dict[str, Any]:
    """A timeline's checkpoint that does not solve the task: every variable's verdict is "model does not solve
    the task" whatever a fit would find (verdicts.row_verdict), so none is fitted; the lines say so."""
    names = [(v.origin, v.name) for v in variables]
    lines = {}
    for origin, name in names:
        key = name if origin == "task" or ("task", name) not in names else f"exact:{name}"
        lines[key] = {"verdict": "model does not solve the task", "site": None, "position": None, "dim": None,
                      "iia": None, "iia_ci": None, "changed_pairs": 0, "lift": None, "random_iia_p95": None,
                      "origin": origin, "position_name": None, "not_fitted": "the model does not solve the task"}
    return {"rows": [], "skipped": skipped + [{"variable": None, "reason": "not fitted: the model does not solve the "
                                               "task (accuracy below the threshold in solves)"}],
            "sites": [], "settings": _settings(settings, trained), "split": split_notes, "solves": solves,
            "verdicts": lines, **summarize([], variables)}


def _fit_steps(settings: Settings, all_warm: bool) -> int | None:
    """A site's Adam steps in a timeline (``settings.warm_steps`` set; None: ``settings.steps``): the short
    count where every fit starts from an earlier solving model's subspace, else the full count."""
    return settings.warm_steps if settings.warm_steps is not None and all_warm else None


def known_directions(side: Side, variables: list[HighLevel], exact: Side | None = None,
                     train: list[PairSet] | None = None) -> dict[int, torch.Tensor]:
    """Where the trained side is itself an exact construction that names its residual dimensions (a
    self-diff), each exact label's own direction (its dimension; e_L - e_-(L) in a doubled residual,
    :mod:`exactlens.model.labels`): the fit of that label starts from it. An exact construction that names
    none (a copy in a rotated residual basis) gets the exact side's label directions carried into its basis
    (:func:`transported_directions`)."""
    labels = getattr(side.model.cfg, "residual_labels", None) if side.exact else None
    if not labels:
        return transported_directions(variables, exact, train or []) if side.exact and exact is not None else {}
    out = {}
    for i, v in enumerate(variables):
        if v.origin == "exact" and v.name in labels and list(labels).count(v.name) == 1:
            out[i] = label_direction(labels, v.name)
    return out


def transported_directions(variables: list[HighLevel], exact: Side, train: list[PairSet]) -> dict[int, torch.Tensor]:
    """Each exact label's dimension e_i carried into the trained side's basis by the least-squares
    linear map M from the exact model's activations to the trained side's (minimum norm; training base
    words, every position, the rows of all their common residual sites stacked): e_i M. For a copy in a
    rotated basis (x -> x Q) M = Q on the span of the activations, so e_i M = e_i Q wherever e_i lies in
    that span. The rows are not centred and the sites are stacked: labels that sum to a constant at a
    site (tracr-hist's one-hot count hist_2:0..5) are told apart by the rows of the site before they
    are written; a probe, which centres, finds only e_i minus their mean, a different patch. Only where
    M maps the exact activations onto the trained side's exactly (relative misfit <= TRANSPORT_EXACT): a
    trained model is no linear image of the exact one, and its fits keep their probe starts."""
    labels = list(getattr(exact.model.cfg, "residual_labels", None) or [])
    wanted = {i: label_direction(labels, v.name) for i, v in enumerate(variables)
              if v.origin == "exact" and labels.count(v.name) == 1}
    xs, ys = [], []
    for pset in train if wanted else []:
        words = pset.base.numpy()
        for site in exact.sites:  # the residual-like sites (not attention patterns)
            acts, mine = pset.run.exact_acts.get(site), (pset.run.trained_acts or {}).get(site)
            if acts is not None and mine is not None and len(words):
                xs.append(acts[words].reshape(-1, acts.shape[-1]))
                ys.append(mine[words].reshape(-1, mine.shape[-1]))
    if not xs:
        return {}
    x, y = torch.as_tensor(np.concatenate(xs)), torch.as_tensor(np.concatenate(ys))
    keep = torch.isfinite(x).all(1) & torch.isfinite(y).all(1)
    carry = torch.linalg.pinv(x[keep], rtol=TRANSPORT_RTOL) @ y[keep]  # [d_exact, d_trained]
    misfit = float((x[keep] @ carry - y[keep]).norm()) / max(float(y[keep].norm()), 1e-300)
    if misfit > TRANSPORT_EXACT:  # not a copy of the exact model in another basis (e.g. a trained model)
        return {}
    out = {}
    for i, own in wanted.items():
        direction = own.to(carry.dtype) @ carry
        if float(direction.norm()) > TRANSPORT_RTOL * max(float(carry.norm()), 1e-300):
            out[i] = direction / direction.norm()
    return out


def check_illusions(task: tasks.Task, side: Side, site: str, fits: list[Fit], projector: torch.Tensor,
                    rows: list[dict[str, Any]], train: list[PairSet], test: list[PairSet], cache: dict) -> None:
    """``row["illusion"]`` for every row whose test scores would make it "computed": the test IIA of
    the part of its subspace that varies at the site and of the part later components read, each alone
    (:mod:`.illusion`); None where not checked (the row is not a candidate, or the model's weights are
    not an ExactTransformer's)."""
    for row in rows:
        row["illusion"] = None
    candidates = [n for n, row in enumerate(rows) if verdicts.passes_scores(row)]
    read = illusion.read_basis(side.model, site) if candidates else None
    if read is None:
        return
    patcher = Patcher(side, site)
    vary: dict[str, torch.Tensor] = {}
    for positions in {fits[n].positions for n in candidates}:
        acts = []
        for pset in train:
            if len(pset.base):
                mask = _masks(side, pset.run, [Fit(-1, 0, positions)])[0].bool()
                acts.append(_acts(patcher, pset, cache)[0]["site"][:, mask].double())
        vary[positions] = illusion.varying_basis(acts)
    split = torch.cat([illusion.split_projectors(projector[n], vary[fits[n].positions], read) for n in candidates])
    scores = score_group(task, side, site, [fits[n] for n in candidates for _ in range(2)], test, split, cache)
    for j, n in enumerate(candidates):
        rows[n]["illusion"] = illusion.verdict(rows[n]["iia_changed"], scores[2 * j]["iia_changed"],
                                               scores[2 * j + 1]["iia_changed"], verdicts.COMPUTED_IIA)


def source_determined(task: tasks.Task, train: list[PairSet], i: int) -> float:
    """Share of units whose counterfactual answer is the source word's own answer."""
    same = []
    for pset in train:
        if not len(pset.base):
            continue
        cf = pset.cf[i]
        own = pset.run.truth[pset.source]
        if task.kind in ("membership", "classification"):
            same.append((cf.long() == own.long())[cf.long() != TIED].reshape(-1))
        else:
            valid = task.target_mask(pset.run.n_positions[pset.base] - task.n_specials, cf.shape[1], cf)
            valid = valid & (cf.long() != TIED) if task.kind == "prediction" else valid
            same.append((cf.double() == own.double())[valid])
    joined = torch.cat(same) if same else torch.zeros(0, dtype=torch.bool)
    return float(joined.double().mean()) if joined.numel() else 0.0


COMPONENT_SITES = ("hook_attn_out", "hook_mlp_out")


def localizable(variable: HighLevel) -> bool:
    """An answer-determined variable can be localized apart from the answer where the exact circuit
    computes it at every position (or it is a task variable, which the circuit computes before it
    reaches the readout): patched at every position of a component's output. A label only the
    readout position holds (e.g. FIRST's s) is the answer itself there."""
    return variable.origin == "task" or variable.detail.get("exact_positions") == "all"


def positions_of(variable: HighLevel, determined: float, per_position: bool) -> str:
    """Where a variable is patched. Swapping a subspace at every position that holds the tokens
    themselves swaps the input, which realizes any variable that decides the answer alone: such
    (source-determined) and word-level variables are patched at the readout position, where the
    answer has to be gathered; position-level ones at every position (each from its own position
    of the source). Per-position readouts have no single readout position: every position."""
    if per_position:
        return "all"
    if variable.scope == "word" or determined >= DETERMINED:
        return "readout"
    return "all"


def _describe(variables: list[HighLevel], determined: list[float] | None = None) -> list[dict[str, Any]]:
    return [{"variable": v.name, "origin": v.origin, "scope": v.scope,
             "source_determined": None if determined is None else determined[i], **v.detail}
            for i, v in enumerate(variables)]


def _settings(settings: Settings, side: Side) -> dict[str, Any]:
    return {"max_dim": min(settings.max_dim, side.d_model), "steps": settings.steps, "lr": settings.lr,
            "batch": settings.batch, "pairs_per_length": settings.pairs, "split": list(SPLIT),
            "untrained_baseline": settings.untrained}


def summarize(rows: list[dict[str, Any]], variables: list[HighLevel], sites: list[str] | None = None
              ) -> dict[str, Any]:
    """Per variable, its best interchange row (not the localization rows of an answer-determined
    variable), chosen on validation pairs (highest validation IIA on changed pairs, then the earlier
    site; the reported IIA is the test pairs'); the means over variables."""
    order = {s: i for i, s in enumerate(sites or [])}
    best: dict[str, dict[str, Any]] = {}

    def key(row: dict[str, Any]) -> tuple:
        v = row.get("validation_iia_changed")
        return (-(v if v is not None else -1.0), -(row.get("validation_iia") or 0.0), order.get(row["site"], 0))

    for row in rows:
        if row["iia_changed"] is None or row.get("test") == "localization":
            continue
        name = f"{row['origin']}:{row['variable']}"
        if name not in best or key(row) < key(best[name]):
            best[name] = row

    def mean(values: list[float | None]) -> float | None:
        kept = [v for v in values if v is not None]
        return float(np.mean(kept)) if kept else None

    task_best = [r for r in best.values() if r["origin"] == "task"]
    return {
        "best": [{k: r.get(k) for k in ("variable", "origin", "site", "position", "dim", "iia_changed",
                                       "random_iia_changed", "untrained_iia_changed", "iia_ci", "changed_pairs",
                                       "lift", "random_iia_p95", "verdict")} for r in best.values()],
        "mean_das_iia_changed": mean([r["iia_changed"] for r in best.values()]),
        "mean_random_iia_changed": mean([r["random_iia_changed"] for r in best.values()]),
        "mean_untrained_iia_changed": mean([r["untrained_iia_changed"] for r in best.values()]),
        "mean_das_iia_changed_task": mean([r["iia_changed"] for r in task_best]),
    }

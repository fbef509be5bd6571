"""Fitting the subspaces: stacked Adam fits from several starts, k by increasing size."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from exactlens import tasks
from exactlens.analysis.diff.alignment.pairs import PairSet
from exactlens.analysis.diff.alignment.patch import (
    Fit,
    Patcher,
    copies_per_pass,
    inside_last,
    patch_masks,
    site_acts,
    span_projectors,
)
from exactlens.analysis.diff.alignment.score import score_group
from exactlens.analysis.diff.alignment.starts import (
    pick_best,
    pooled_alternative,
    probe_directions,
    start_weights,
    variable_dim,
)
from exactlens.analysis.diff.alignment.variables import TIED, HighLevel
from exactlens.analysis.diff.alignment.verdicts import CONVERGED_IIA
from exactlens.analysis.diff.runs import Side
from exactlens.tasks import kinds

PAIR_DESIGNS = ("designed", "random")  # how DAS pairs are drawn (:mod:`.designed`, :mod:`.pairs`)


@dataclass
class Settings:
    max_dim: int = 3
    steps: int = 80
    lr: float = 0.05
    batch: int = 32  # pairs per fit per step
    pairs: int = 64  # designed: changed test pairs per variable; random: pairs per length
    seed: int = 0
    untrained: bool = True
    warm_steps: int | None = None  # Adam steps of a fit warm-started from an earlier model's subspace (None: steps)
    design: str = "designed"  # the pairs: "designed" from the exact circuit (:mod:`.designed`) or "random"
    positions: int = 1  # position-resolved variables per answer-determined exact label (.variables.position_variables)
    unsolved_steps: int | None = None  # Adam steps where the trained model does not solve the task (None: steps)


SKIPPED = {"iia": None, "iia_changed": None, "skipped": "a smaller k of this variable reached the validation IIA "
           "no larger k can beat by more than DIM_TOLERANCE"}


def fit_sites(task: tasks.Task, side: Side, jobs: list[FitJob], train: list[PairSet], select: list[PairSet],
              settings: Settings, generator: torch.Generator, caches: dict[str, dict], staged: bool = True
              ) -> list[tuple[torch.Tensor, list[str], list[dict[str, Any]]]]:
    """:func:`fit_stage` by increasing k: the fits of each cell (variable, positions) with its smallest k
    first, then the next k only for the cells whose best validation IIA so far is below 1 - DIM_TOLERANCE
    (choose_dim would pick that smaller k whatever a larger one scored) or whose fits that reach it fit fewer than
    CONVERGED_IIA of their training pairs (scored here, ``training_iia`` in their scores). A fit not run gets a zero
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
        stage_scores: dict[str, list[dict[str, Any]]] = {}
        for j, job, (projector, started, scores) in zip(live, sub, fit_stage(task, side, sub, train, select, settings,
                                                                             generator, caches), strict=True):
            stage_scores[job.site] = scores
            reached = [m for m in range(len(chosen[j])) if (scores[m]["iia"] or 0.0) >= 1 - DIM_TOLERANCE]
            if staged and reached and job.twin is not None:  # its twin's, scored just before (the same fits)
                for m in reached:
                    scores[m]["training_iia"] = stage_scores[job.twin][m].get("training_iia")
            elif staged and reached:  # a k that passes few validation pairs must also fit its training pairs
                held = score_group(task, side, job.site, [job.fits[m] for m in reached], train, projector[reached],
                                   caches[job.site])
                for m, got in zip(reached, held, strict=True):
                    scores[m]["training_iia"] = got["iia_changed"] if got["iia_changed"] is not None else got["iia"]
            for m, n in enumerate(chosen[j]):
                out[j][0][n], out[j][1][n], out[j][2][n] = projector[m], started[m], scores[m]
                if m in reached and (not staged or (scores[m]["training_iia"] or 0.0) >= CONVERGED_IIA):
                    done[j].add(cell(jobs[j].fits[n]))
    return out


def _restrict(job: FitJob, keep: list[int]) -> FitJob:
    """The job with only fits ``keep`` (their starts and warm starts with them)."""
    starts = None if job.starts is None else {k: [v[n] for n in keep] for k, v in job.starts.items()}
    warm = None if job.warm is None else (None if job.warm[0] is None else [job.warm[0][n] for n in keep],
                                          job.warm[1])
    return FitJob(job.site, [job.fits[n] for n in keep], starts, warm, job.twin)


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
        batches.setdefault((plans[j][1], inside_last(side, job.site)), []).append(j)
    fitted: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
    for (steps, _), members in batches.items():
        fitted.update(_fit_batch(task, side, [jobs[j] for j in members], [plans[j][0] for j in members], members,
                                 train, settings, generator, caches, steps))
    out: list[Any] = [None] * len(jobs)
    index = {job.site: j for j, job in enumerate(jobs)}
    for j, job in enumerate(jobs):
        if job.twin is not None:
            continue
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
        out[j] = (pool[best], [meta[b][1] for b in best], [scores[b] for b in best])
    for j, job in enumerate(jobs):
        if job.twin is not None:  # the same fits as its twin's, which precedes it in depth order
            projector, started, scores = out[index[job.twin]]
            if len(started) != len(job.fits):
                raise ValueError(f"fit_stage: {job.site} has other fits than its twin {job.twin}")
            out[j] = (projector.clone(), list(started), [dict(score) for score in scores])
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
    # an earlier site whose patch is the same intervention (.patch.twin_sites), in the same batch with the same
    # fits and starts: this job's candidates are drawn (the generator's draws stay those of running them) but
    # neither run nor scored, and its results are the twin's
    twin: str | None = None


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
    their starts' projectors. An inert candidate (:func:`inert_candidates`) keeps its start without running."""
    patchers = [Patcher(side, job.site) for job in jobs]
    cand_fits = [job.fits[f] for job, cands in zip(jobs, candidates, strict=True) for f, _, _ in cands]
    rows_of = [j for j, cands in enumerate(candidates) for _ in cands]
    dims = torch.tensor([f.dim for f in cand_fits])
    weights = start_weights([c[2] for cands in candidates for c in cands], dims.tolist(), side.d_model, generator,
                            patchers[0].dtype)
    initial = span_projectors(weights, dims)
    usable = [p for p in train if len(p.base)]
    twins = {c for c, j in enumerate(rows_of) if jobs[j].twin is not None}  # their results are their twins'
    own = [c for c in range(len(cand_fits)) if c not in twins]
    inert = twins | {own[c] for c in inert_candidates(side, patchers, [cand_fits[c] for c in own],
                                                      [rows_of[c] for c in own], usable, caches)} \
        if SKIP_INERT else twins
    live = [c for c in range(len(cand_fits)) if c not in inert]
    moving = weights[live].clone().requires_grad_(True)
    optimizer = torch.optim.Adam([moving], lr=settings.lr)
    frozen = [p for p in side.model.parameters() if p.requires_grad]
    for p in frozen:
        p.requires_grad_(False)
    try:
        with torch.enable_grad():
            _adam_steps(task, side, (jobs, patchers), [cand_fits[c] for c in live], [rows_of[c] for c in live],
                        (moving, dims[live], optimizer), usable, settings, generator, caches, steps)
    finally:
        for p in frozen:
            p.requires_grad_(True)
    with torch.no_grad():
        weights[live] = moving.detach()
        fitted = span_projectors(weights, dims)
    out, at = {}, 0
    for j, cands in zip(ids, candidates, strict=True):
        out[j] = (fitted[at:at + len(cands)], initial[at:at + len(cands)])
        at += len(cands)
    return out


def _adam_steps(task: tasks.Task, side: Side, sites: tuple[list[FitJob], list[Patcher]], cand_fits: list[Fit],
                rows_of: list[int], fitted: tuple[torch.Tensor, torch.Tensor, torch.optim.Optimizer],
                usable: list[PairSet], settings: Settings, generator: torch.Generator, caches: dict[str, dict],
                steps: int) -> None:
    """``steps`` Adam steps on the free weights of ``cand_fits`` (``fitted``: the weights, their fits' dimensions
    and the optimizer; candidate c is patched at the site of job rows_of[c]). Each step draws its training words
    whether or not a candidate is left (the generator's draws are the same as when every candidate runs)."""
    jobs, patchers = sites
    weights, dims, optimizer = fitted
    # each pass's copies start at their own sites' layer (LAYER_PASSES), on that layer's cached input
    layers = [patchers[j].start if LAYER_PASSES else min(p.start for p in patchers) for j in rows_of]
    masks_of: dict[int, torch.Tensor] = {}  # per pair set: where each candidate patches
    for step in range(steps):
        pset = usable[step % len(usable)]
        pick = torch.randperm(len(pset.base), generator=generator)[: settings.batch]
        if not cand_fits:
            continue
        acts = {j: site_acts(patchers[j], pset, caches[jobs[j].site]) for j in dict.fromkeys(rows_of)}
        sources = {jobs[j].site: a[1][pick] for j, a in acts.items()}
        n_pos = pset.run.n_positions[pset.base[pick]]
        if id(pset) not in masks_of:
            masks_of[id(pset)] = patch_masks(side, pset.run, cand_fits)
        masks = masks_of[id(pset)]
        optimizer.zero_grad()
        # the candidates in passes that fit in memory, each pass's loss backpropagated alone (the
        # candidates' weights are disjoint rows, so the summed gradient is the whole batch's)
        for lo, hi in layer_passes(layers, copies_per_pass(side, len(pick), masks.shape[1])):
            j = rows_of[lo] if LAYER_PASSES else min(acts, key=lambda n: patchers[n].start)
            outputs = patchers[j].outputs(
                {"input": acts[j][0]["input"][pick]}, sources, span_projectors(weights[lo:hi], dims[lo:hi]),
                masks[lo:hi], n_pos, [jobs[j].site for j in rows_of[lo:hi]])
            targets = torch.cat([pset.cf[f.variable][pick] for f in cand_fits[lo:hi]])
            n_all = n_pos.repeat(hi - lo)
            loss = _loss(task, side.reader.evidence(outputs, n_all), targets, n_all).sum() / len(pick)
            loss.backward()
        optimizer.step()


SKIP_INERT = True  # False: inert candidates run their Adam steps too (the same fits, more work)


def inert_candidates(side: Side, patchers: list[Patcher], cand_fits: list[Fit], rows_of: list[int],
                     train: list[PairSet], caches: dict[str, dict]) -> list[int]:
    """The candidates whose patch moves nothing on any training pair: at their site and positions every
    training pair's source activations equal its base's (a component that writes zero on every word: a
    compiled program's empty attention layer). The patch h + ((h_src - h) Q) Q^T is then h whatever Q is,
    so the loss's gradient in Q is zero at every step, and Adam (a zero gradient moves neither its moments
    nor its weights) leaves the start as it is: such a fit's result is its start, without running it."""
    still: dict[tuple[str, str], bool] = {}
    out = []
    for c, fit in enumerate(cand_fits):
        patcher = patchers[rows_of[c]]
        key = (patcher.site, fit.positions)
        if key not in still:
            still[key] = bool(train) and all(_unmoved(side, patcher, pset, fit, caches[patcher.site])
                                             for pset in train)
        if still[key]:
            out.append(c)
    return out


def _unmoved(side: Side, patcher: Patcher, pset: PairSet, fit: Fit, cache: dict) -> bool:
    base, source = site_acts(patcher, pset, cache)
    mask = patch_masks(side, pset.run, [fit])[0].bool()
    return torch.equal(base["site"][:, mask], source[:, mask])


LAYER_PASSES = True  # False: every pass runs from the batch's earliest layer (the same fits, more work)


def layer_passes(layers: list[int], size: int) -> list[tuple[int, int]]:
    """Slices [lo, hi) of the stacked candidates (``layers``: the layer each one's forward starts at) run as one
    pass each: at most ``size`` candidates (:func:`..interventions.copies_per_pass`), all starting at one layer. A copy
    patched at layer L is its base word up to L, so its pass starts there, on the cached input of layer L,
    instead of repeating (and backpropagating through) the layers before L: in an 8-layer program the
    later sites' copies then skip most of the model."""
    out, lo = [], 0
    while lo < len(layers):
        hi = lo + 1
        while hi < len(layers) and hi - lo < size and layers[hi] == layers[lo]:
            hi += 1
        out.append((lo, hi))
        lo = hi
    return out


def _loss(task: tasks.Task, evidence: torch.Tensor, targets: torch.Tensor, n_positions: torch.Tensor
          ) -> torch.Tensor:
    """Per-word loss towards the counterfactual answers; a membership answer decided by rounding (TIED, of an
    exact label's patch: :class:`.variables.NormWatch`) adds none (cross-entropy leaves classes' TIED out)."""
    if task.kind != "membership":
        return kinds.loss(task, evidence, targets, n_positions)
    keep = targets.long() != TIED
    return kinds.loss(task, evidence, torch.where(keep, targets.long(), 0), n_positions) * keep


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
            mask = patch_masks(side, pset.run, [fit])[0].bool()
            x = site_acts(patcher, pset, cache)[0]["site"][:, mask].double().cpu()
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
    positions (:func:`.starts.variable_dim`); a one-hot group's at least its members' count (the exact
    patch swaps all of them)."""
    out = {}
    for i, pos in cells:
        v, ys = variables[i], []
        for pset in train:
            if not len(pset.base) or v.values is None:
                continue
            mask = patch_masks(side, pset.run, [Fit(i, 1, pos)])[0].bool()
            y = v.values(pset.run, pset.base)[:, mask]
            y = y.reshape(-1, y.shape[-1])
            ys.append(y[torch.isfinite(y).all(-1)])
        out[(i, pos)] = variable_dim(torch.cat(ys), cap) if ys else 1
        out[(i, pos)] = min(cap, max(out[(i, pos)], len(v.detail.get("members", ()))))
    return out


DIM_TOLERANCE = 0.01


def choose_dim(by_dim: dict[int, float | None], training: dict[int, float | None] | None = None) -> int:
    """The smallest dimension whose validation IIA is within DIM_TOLERANCE of the best; of those, where
    ``training`` (IIA on the training pairs, per dimension) says some fit them (>= CONVERGED_IIA), the smallest
    of these: a small validation split can pass a k too small for the variable (tracr-max_element's answer at
    blocks.1.hook_attn_out: k = 1 right on every validation pair, 0.78 on its training pairs, while k = 2 fits
    both)."""
    scored = [v for v in by_dim.values() if v is not None]
    if not scored:
        return min(by_dim)
    best = max(scored)
    near = [k for k, v in by_dim.items() if v is not None and v >= best - DIM_TOLERANCE]
    fitted = [k for k in near if ((training or {}).get(k) or 0.0) >= CONVERGED_IIA]
    return min(fitted or near)


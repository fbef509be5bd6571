"""The alignment table: variables, pairs, fits and scores put together into the diff's rows and summary."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch

from exactlens import tasks
from exactlens.analysis.diff.alignment import verdicts
from exactlens.analysis.diff.alignment.designed import (
    GROWN_POOL_FACTOR,
    POOL_FACTOR,
    constant_within_length,
    design_pairs,
    pool_summary,
    token_function,
    untestable_reason,
    with_variables,
)
from exactlens.analysis.diff.alignment.directions import known_directions
from exactlens.analysis.diff.alignment.fit import (
    PAIR_DESIGNS,
    FitJob,
    Settings,
    choose_dim,
    fit_sites,
    probe_starts,
    site_groups,
    variable_dims,
)
from exactlens.analysis.diff.alignment.grow import grow_runs, scarce
from exactlens.analysis.diff.alignment.localization import (
    COMPONENT_SITES,
    DETERMINED,
    check_illusions,
    localizable,
    positions_of,
    source_determined,
)
from exactlens.analysis.diff.alignment.pairs import SPLIT, PairSet, make_pairs
from exactlens.analysis.diff.alignment.patch import Fit, alignment_sites, position_index, twin_sites
from exactlens.analysis.diff.alignment.score import bases, random_draws, random_scores, score_group, units
from exactlens.analysis.diff.alignment.variables import (
    HighLevel,
    exact_variables,
    position_variables,
    task_variables,
)
from exactlens.analysis.diff.runs import LengthRun, Side
from exactlens.devices import device_of
from exactlens.errors import ExactLensError
from exactlens.model import ExactConfig, ExactTransformer
from exactlens.model.idle import without_idle_units
from exactlens.progress import bar


def untrained_copy(model: Any, seed: int) -> Any | None:
    """A randomly initialized model of the same shape (ExactTransformer only; None otherwise)."""
    if not isinstance(model, ExactTransformer):
        return None
    copy = ExactTransformer(ExactConfig.from_dict(model.cfg.to_dict()))
    copy.init_weights(seed)
    return copy.to(device_of(model)).eval()


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
    trained, exact = _lean(trained), _lean(exact)
    if "alignment_pairs" not in carry:
        carry["alignment_pairs"] = _prepare(runs, trained, exact, features, settings)
    with rounding_ties(trained) as tolerance:
        table = _alignment_rows(runs, trained, exact, settings, untrained, progress, carry, carry["alignment_pairs"])
    table["settings"]["hard_tie_tolerance"] = tolerance
    return table


DROP_IDLE_UNITS = True  # False: an exact model's idle FFN units run in every forward too (the same rows, more work)


def _lean(side: Side) -> Side:
    """The side with its model's idle FFN units dropped (:func:`exactlens.model.idle.without_idle_units`: the same
    residual stream and outputs; an ExactTransformer only, and a copy: the caller's model is left as it is).
    tracr-shuffle_dyck's forward takes half the time without them."""
    if not (DROP_IDLE_UNITS and side.exact):
        return side
    lean = without_idle_units(side.model)
    return side if lean is side.model else replace(side, model=lean)


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


@dataclass
class Prepared:
    """What a diff (or a timeline, once for all its models) fixes before fitting: the variables to fit,
    the skipped ones, the untestable ones (variable, reason, search), the pairs, their notes, each fitted
    variable's source_determined share and its search (designed pairs; None for random ones)."""

    variables: list[HighLevel]
    skipped: list[dict[str, Any]]
    untestable: list[tuple[HighLevel, str, dict[str, Any] | None]]
    splits: tuple[list[PairSet], list[PairSet], list[PairSet]]
    notes: dict[str, Any]
    determined: list[float]
    pools: list[dict[str, Any] | None]
    design: str  # "designed" or "random"
    token_functions: frozenset  # (origin, name) of the variables the token at their position determines


def _prepare(runs: list[LengthRun], trained: Side, exact: Side, features: list[dict[str, Any]] | None,
             settings: Settings) -> Prepared:
    """The variables to align, the skipped and untestable ones, the train/validation/test pairs (designed from
    the exact circuit, :mod:`.designed`, or random, :mod:`.pairs`) and their notes."""
    task = exact.reader.task
    if not 1 <= settings.max_dim:
        raise ExactLensError(f"max_dim must be >= 1, got {settings.max_dim}")
    if settings.design not in PAIR_DESIGNS:
        raise ExactLensError(f"pairs must be one of {', '.join(PAIR_DESIGNS)}, got {settings.design!r}")
    variables = task_variables(task)
    skipped: list[dict[str, Any]] = [
        {"variable": v.name, "reason": "no known effect on the answer"}
        for v in task.variables() if not v.interventional
    ]
    if features is not None:
        more, skip = exact_variables(exact, features, runs)
        variables += more
        skipped += skip
    rule = trained.reader.rule
    if rule is not None and rule.evidence is None and not rule.logits:
        skipped.append({"variable": None, "reason": f"the trained model's decision rule {rule.name!r} gives no "
                        "differentiable evidence to fit a subspace by"})
        variables = []
    found = _searches(task, runs, variables, exact, settings)
    short = scarce(found["pools"], found["reasons"], settings.pairs, found["notes"].get("word_disjoint", True)) \
        if settings.design == "designed" else []
    grown = grow_runs(task, runs, trained, exact, settings.seed) if short else None
    if grown is not None:  # effective pairs scarce among these words: the search again on more words (:mod:`.grow`)
        names = [found["variables"][i].name for i in short]
        runs = grown[0]
        found = _searches(task, runs, variables, exact, settings, GROWN_POOL_FACTOR)
        found["notes"] = {**found["notes"], "grown": grown[1], "grown_for": names}
    variables = found["variables"]
    reasons = found["reasons"]
    keep = [i for i, reason in enumerate(reasons) if reason is None]
    untestable = [(variables[i], reasons[i], found["pools"][i]) for i in range(len(variables))
                  if reasons[i] is not None]
    splits = tuple([_only(pset, keep) for pset in split] for split in found["splits"])
    kept = [variables[i] for i in keep]
    return Prepared(kept, skipped, untestable, splits, found["notes"],  # type: ignore[arg-type]
                    [found["determined"][i] for i in keep], [found["pools"][i] for i in keep], settings.design,
                    frozenset((v.origin, v.name) for v in kept if token_function(v, runs)))


def _searches(task: tasks.Task, runs: list[LengthRun], variables: list[HighLevel], exact: Side, settings: Settings,
              pool_factor: int = POOL_FACTOR) -> dict[str, Any]:
    """:func:`_search` for the variables, then for their position-resolved variables (joined)."""
    found = _search(task, runs, variables, settings, pool_factor=pool_factor)
    if variables and task.readout != "per_position":
        resolved = position_variables(exact, variables, found["determined"], DETERMINED, settings.positions, runs)
        if resolved:
            found = _search(task, runs, resolved, settings, found, pool_factor)
    return found


def _search(task: tasks.Task, runs: list[LengthRun], variables: list[HighLevel], settings: Settings,
            before: dict[str, Any] | None = None, pool_factor: int = POOL_FACTOR) -> dict[str, Any]:
    """The pairs of ``variables`` (designed, :mod:`.designed`, or random, :mod:`.pairs`): the splits, their
    notes, each variable's source_determined share, its search (designed pairs; None for random ones) and why
    it is untestable (None: it is not). ``before``: the same for earlier variables, whose pairs (with these
    variables' counterfactuals added) are kept and joined with these variables' own designed pairs."""
    if settings.design == "designed" and variables:
        design = design_pairs(task, runs, variables, settings.pairs, settings.seed, pool_factor)
        determined = [source_determined(task, design.sampled, i) for i in range(len(variables))]
        pools: list[dict[str, Any] | None] = [pool_summary(design, i) for i in range(len(variables))]
        reasons = [untestable_reason(v, [design.pools[k][i] for k in range(3)], runs)
                   for i, v in enumerate(variables)]
        if before is not None:
            splits = tuple([with_variables(p, variables) for p in before["splits"][k]]
                           + [with_variables(p, before["variables"], after=False) for p in design.splits[k]]
                           for k in range(3))
        else:
            splits = design.splits
        notes = dict(before["notes"] if before is not None else design.notes)
    elif before is not None:  # random pairs: the earlier variables' pairs, with these variables' counterfactuals
        splits = tuple([with_variables(p, variables) for p in before["splits"][k]] for k in range(3))
        notes = before["notes"]
        determined = [source_determined(task, splits[0], len(before["variables"]) + i) for i in range(len(variables))]
        pools, reasons = [None] * len(variables), [_constant(v, runs) for v in variables]
    else:
        notes = {}
        splits = make_pairs(runs, variables, settings.pairs, settings.seed, notes)
        determined = [source_determined(task, splits[0], i) for i in range(len(variables))]
        pools, reasons = [None] * len(variables), [_constant(v, runs) for v in variables]
    if before is None:
        return {"variables": variables, "splits": splits, "notes": notes, "determined": determined, "pools": pools,
                "reasons": reasons}
    return {"variables": before["variables"] + variables, "splits": splits, "notes": notes,
            "determined": before["determined"] + determined, "pools": before["pools"] + pools,
            "reasons": before["reasons"] + reasons}


def _constant(variable: HighLevel, runs: list[LengthRun]) -> str | None:
    return ("constant within a length: no same-length interchange changes it"
            if constant_within_length(variable, runs) else None)


def _only(pset: PairSet, keep: list[int]) -> PairSet:
    """The pair set with the counterfactuals of variables ``keep`` only."""
    return PairSet(pset.run, pset.base, pset.source, [pset.cf[i] for i in keep],
                   [pset.base_answers[i] for i in keep])


def _alignment_rows(runs: list[LengthRun], trained: Side, exact: Side, settings: Settings, untrained: Side | None,
                    progress: Callable[[int, int], None] | None, carry: dict[str, Any], prepared: tuple
                    ) -> dict[str, Any]:
    """The rows of :func:`alignment_table` from its ``prepared`` variables, skipped ones, pairs and notes."""
    variables, skipped, (train, val, test) = prepared.variables, prepared.skipped, prepared.splits
    split_notes, determined = prepared.notes, prepared.determined
    task = exact.reader.task
    if not variables or not train:
        out = {"rows": [], "skipped": skipped, "sites": [], "settings": _settings(settings, trained)}
        if prepared.untestable:
            out["verdicts"] = _with_searches({}, prepared, [])
        return out
    sites = alignment_sites(trained)
    per_position = task.readout == "per_position"
    gen = torch.Generator().manual_seed(settings.seed)
    max_dim = min(settings.max_dim, trained.d_model)
    base_cells = [(i, positions_of(v, determined[i], per_position)) for i, v in enumerate(variables)]
    # Answer-determined variables are localized where they can be told from the answer: at every
    # position of a component's output (which does not hold the input), see localizable().
    extra = [(i, "all") for i, v in enumerate(variables)
             if determined[i] >= DETERMINED and localizable(v) and base_cells[i][1] != "all"]
    solves = verdicts.solves_task(task, runs, trained, units)
    if settings.warm_steps is not None and not solves["solves"]:  # a timeline's checkpoint: no fit changes it
        return _unsolved(prepared, settings, trained, solves)
    settings = _unsolved_steps(settings, solves)
    known = known_directions(trained, variables, exact, train)
    warm = carry.setdefault("alignment_fits", {})  # (site, origin, variable, positions, dim, d) -> basis
    # k = 1..max_dim, and the variable's own dimension where it needs more (classes - 1, a count vector)
    needs = variable_dims(variables, base_cells + extra, trained, train, trained.d_model)
    # and a known direction's width (a self-diff: a task variable that names a one-hot group whose rare values
    # the training words lack still gets k = the group's size)
    dims_of = {cell: sorted(set(range(1, max_dim + 1)) | {need, *([known[cell[0]].shape[1]] if cell[0] in known
                                                                    else [])}) for cell, need in needs.items()}
    rows: list[dict[str, Any]] = []
    finished = 0
    site_bar = bar(total=len(sites), desc="DAS sites", unit="site")
    # a timeline's models start from their own sites' subspaces: no site shares its twin's fits there
    twins = twin_sites(trained, sites) if settings.warm_steps is None and SHARE_TWINS else {}
    for group in site_groups(trained, sites, train + val + test):
        caches: dict[str, dict] = {site: {} for site in group}  # per site: its activations of every pair set
        plans, jobs = {}, []
        for site in group:
            twin = twins.get(site) if twins.get(site) in group else None  # fitted in this batch: its results
            cells = base_cells + (extra if site.endswith(COMPONENT_SITES) else [])
            fits = [Fit(i, k, pos) for i, pos in cells for k in dims_of[(i, pos)]]
            keys = [(site, variables[f.variable].origin, variables[f.variable].name, f.positions, f.dim,
                     trained.d_model) for f in fits]
            start = [warm.get(key) for key in keys]
            all_warm = all(b is not None for b in start)
            steps = _fit_steps(settings, all_warm)
            starts = plans[twin]["starts"] if twin is not None else \
                _starts(trained, site, fits, train, variables, caches[site], known, all_warm)
            plans[site] = {"cells": cells, "fits": fits, "keys": keys, "steps": steps, "starts": starts, "twin": twin}
            jobs.append(FitJob(site, fits, starts, (start, steps), twin))
        fitted = fit_sites(task, trained, jobs, train, val, settings, gen, caches, staged=settings.warm_steps is None)
        for job, result in zip(jobs, fitted, strict=True):
            if settings.warm_steps is not None and solves["solves"]:  # a timeline's later model starts here
                warm.update((key, basis) for key, basis, how in zip(plans[job.site]["keys"], bases(result[0], job.fits),
                                                                     result[1], strict=True) if how != "skipped")
            _pick_and_score(task, trained, job, result, plans, (train, test), gen, caches[job.site])
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
    return {"rows": rows, "skipped": skipped, "sites": sites,
            "variables": _describe(variables, determined, prepared.token_functions),
            "settings": _settings(settings, trained), "split": split_notes, "solves": solves,
            "verdicts": _with_searches(verdicts.variable_verdicts(
                rows, sites, readout, token_functions=prepared.token_functions), prepared, variables),
            "pairs": settings.design, **summarize(rows, variables, sites)}


def _pick_and_score(task: tasks.Task, trained: Side, job: FitJob, fitted: tuple, plans: dict[str, dict],
                    pairs: tuple[list[PairSet], list[PairSet]], gen: torch.Generator, cache: dict) -> None:
    """A site's fits after :func:`.fit.fit_sites` (``fitted``: projectors, starts, validation scores): per cell the
    k chosen, and the picked fits' test, training and random-baseline scores, into ``plans[job.site]`` (a twin
    site's scores are its twin's, with the random draws they took)."""
    projector, started, val_scores = fitted
    plan, site, (train, test) = plans[job.site], job.site, pairs
    chosen = []
    for i, pos in plan["cells"]:
        index = {f.dim: j for j, f in enumerate(job.fits) if (f.variable, f.positions) == (i, pos)}
        index = {k: j for k, j in index.items() if "skipped" not in val_scores[j]}
        by_dim = {k: val_scores[j]["iia"] for k, j in index.items()}
        training = {k: val_scores[j].get("training_iia") for k, j in index.items()}
        chosen.append((choose_dim(by_dim, training), by_dim, index))
    picked_index = [c[2][c[0]] for c in chosen]
    picked = [job.fits[j] for j in picked_index]
    proj = projector[picked_index]
    plan.update(chosen=chosen, picked=picked, proj=proj, started=started, val_scores=val_scores)
    if plan["twin"] is not None:  # the same intervention: its twin's scores (and the draws they took)
        random_draws(picked, trained.d_model, gen, proj.dtype)
        plan.update({key: [dict(score) for score in plans[plan["twin"]][key]]
                     for key in ("test_scores", "train_scores", "rand_scores")})
        return
    plan.update(test_scores=score_group(task, trained, site, picked, test, proj, cache),
                train_scores=score_group(task, trained, site, picked, train, proj, cache),
                rand_scores=random_scores(task, trained, site, picked, test, gen, proj.dtype, cache))


SHARE_TWINS = True  # False: a twin site (.patch.twin_sites) is fitted and scored itself (the same rows, more work)


def _starts(trained: Side, site: str, fits: list[Fit], train: list[PairSet], variables: list[HighLevel],
            cache: dict, known: dict[int, torch.Tensor], all_warm: bool) -> dict[str, list[torch.Tensor | None]]:
    """The fits' starts besides the random one (:func:`.fit.probe_starts`): none where every fit starts warm; an
    exact label's own dimension replaces its probe starts (a probe finds it)."""
    starts = {} if all_warm else probe_starts(trained, site, fits, train, variables, cache)
    if known and not all_warm:
        for kind in ("probe", "probe (pooled)"):
            starts[kind] = [None if f.variable in known else p for f, p in zip(fits, starts[kind], strict=True)]
        starts["known direction"] = [known[f.variable] if f.variable in known else None for f in fits]
    return starts


def _with_searches(lines: dict[str, dict[str, Any]], prepared: Prepared, variables: list[HighLevel]
                   ) -> dict[str, dict[str, Any]]:
    """The verdict lines with each variable's pair design and search (``pairs``, ``pool``, ``effective_share``,
    ``untestable_reason``), and a line "untestable" for each variable no pair can test."""
    names = [(v.origin, v.name) for v in variables] + [(v.origin, v.name) for v, _, _ in prepared.untestable]
    design = prepared.design

    def key(origin: str, name: str) -> str:
        return name if origin == "task" or ("task", name) not in names else f"exact:{name}"

    for v, search in zip(variables, prepared.pools, strict=True):
        line = lines.get(key(v.origin, v.name))
        if line is not None:
            line.update(_search_fields(design, search), untestable_reason=None)
    for v, reason, search in prepared.untestable:
        lines[key(v.origin, v.name)] = {
            "verdict": "untestable", "site": None, "position": None, "position_index": v.position_index, "dim": None,
            "iia": None, "iia_ci": None,
            "changed_pairs": 0, "lift": None, "random_iia_p95": None, "origin": v.origin, "position_name": None,
            "pairs_needed": None, **_search_fields(design, search), "untestable_reason": reason}
    return lines


def _search_fields(design: str, search: dict[str, Any] | None) -> dict[str, Any]:
    return {"pairs": design, "pool": None if search is None else search["searched"],
            "effective_share": None if search is None else search["effective_share"],
            "search": search}


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
            "position": "at" if position_index(pos) is not None else pos,
            "position_index": position_index(pos),
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
        # a position-resolved variable is patched at its own position, never the readout's: its counterfactual
        # being the answer does not let every site that carries the answer realize it
        answer = row["test"] == "interchange" and row["position_index"] is None
        row["verdict"] = verdicts.row_verdict(row, determined[i] if answer else 0.0, solves["solves"], DETERMINED)
    return site_rows


def _unsolved(prepared: Prepared, settings: Settings, trained: Side, solves: dict[str, Any]) -> dict[str, Any]:
    """A timeline's checkpoint that does not solve the task: every variable's verdict is "model does not solve
    the task" whatever a fit would find (verdicts.row_verdict), so none is fitted; the lines say so."""
    variables = prepared.variables
    names = [(v.origin, v.name) for v in variables]
    lines = {}
    for v in variables:
        origin, name = v.origin, v.name
        key = name if origin == "task" or ("task", name) not in names else f"exact:{name}"
        lines[key] = {"verdict": "model does not solve the task", "site": None, "position": None,
                      "position_index": v.position_index, "dim": None,
                      "iia": None, "iia_ci": None, "changed_pairs": 0, "lift": None, "random_iia_p95": None,
                      "origin": origin, "position_name": None, "not_fitted": "the model does not solve the task"}
    return {"rows": [], "skipped": prepared.skipped + [{"variable": None, "reason": "not fitted: the model does "
                                                        "not solve the task (accuracy below the threshold in solves)"}],
            "sites": [], "settings": _settings(settings, trained), "split": prepared.notes, "solves": solves,
            "verdicts": _with_searches(lines, prepared, variables), **summarize([], variables)}


def _unsolved_steps(settings: Settings, solves: dict[str, Any]) -> Settings:
    """The settings of one diff's fits: ``settings.unsolved_steps`` Adam steps instead of ``settings.steps`` where
    the trained model does not solve the task (every verdict is then "model does not solve the task" whatever the
    fits find: verdicts.row_verdict; the report's diffs of models that do not solve their task), else as given."""
    if solves["solves"] or settings.unsolved_steps is None:
        return settings
    return replace(settings, steps=settings.unsolved_steps)


def _fit_steps(settings: Settings, all_warm: bool) -> int | None:
    """A site's Adam steps in a timeline (``settings.warm_steps`` set; None: ``settings.steps``): the short
    count where every fit starts from an earlier solving model's subspace, else the full count."""
    return settings.warm_steps if settings.warm_steps is not None and all_warm else None


def _describe(variables: list[HighLevel], determined: list[float] | None = None,
              token_functions: frozenset = frozenset()) -> list[dict[str, Any]]:
    """Each variable as the JSON lists it; ``token_function``: its value at each position is a function of the
    token there (and the position) on every word of the diff, so "in the input" is its line's verdict where the
    input realizes it (verdicts.variable_verdicts)."""
    return [{"variable": v.name, "origin": v.origin, "scope": v.scope,
             "source_determined": None if determined is None else determined[i],
             "token_function": (v.origin, v.name) in token_functions, **v.detail}
            for i, v in enumerate(variables)]


def _settings(settings: Settings, side: Side) -> dict[str, Any]:
    designed = settings.design == "designed"
    return {"max_dim": min(settings.max_dim, side.d_model), "steps": settings.steps, "lr": settings.lr,
            "batch": settings.batch, "pairs": settings.design,
            "pairs_per_length": None if designed else settings.pairs,
            "changed_test_pairs_per_variable": settings.pairs if designed else None, "split": list(SPLIT),
            "untrained_baseline": settings.untrained, "unsolved_steps": settings.unsolved_steps}


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
        "best": [{k: r.get(k) for k in ("variable", "origin", "site", "position", "position_index", "dim",
                                       "iia_changed", "random_iia_changed", "untrained_iia_changed", "iia_ci",
                                       "changed_pairs", "lift", "random_iia_p95", "verdict")} for r in best.values()],
        "mean_das_iia_changed": mean([r["iia_changed"] for r in best.values()]),
        "mean_random_iia_changed": mean([r["random_iia_changed"] for r in best.values()]),
        "mean_untrained_iia_changed": mean([r["untrained_iia_changed"] for r in best.values()]),
        "mean_das_iia_changed_task": mean([r["iia_changed"] for r in task_best]),
    }


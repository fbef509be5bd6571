"""Interchange-intervention accuracy of fitted subspaces: the scored units and the random baseline."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from exactlens import tasks
from exactlens.analysis.diff.alignment import verdicts
from exactlens.analysis.diff.alignment.pairs import PairSet
from exactlens.analysis.diff.alignment.patch import Fit, Patcher, patch_masks, site_acts, span_projectors
from exactlens.analysis.diff.alignment.variables import TIED
from exactlens.analysis.diff.runs import Side
from exactlens.tasks import kinds


def units(task: tasks.Task, decisions: torch.Tensor, cf: torch.Tensor, base: torch.Tensor,
          n_positions: torch.Tensor, base_is_decision: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """(right, changed) over the scored units: one per pair, or one per target position of a pair
    for per-position tasks. ``base``: what the counterfactual is compared with to call a unit changed
    (the model's own unpatched decision, or an answer). Regression decisions (and a base that is a
    decision) are decoded to the nearest answer of the batch, answers closer than rounding being one
    (:func:`regression_answers`)."""
    if task.kind in ("classification", "membership"):  # an exact label's tied counterfactual (TIED) is no unit
        keep = cf.long() != TIED
        cf, base = cf[keep].long(), base[keep].long()
        return decisions[keep].long() == cf, cf != base
    width = cf.shape[1]
    valid = task.target_mask(n_positions - task.n_specials, width, cf)  # cf's undefined answers are no units
    if task.kind == "prediction":
        valid = valid & (cf.long() != TIED)
    decisions, base = decisions[:, :width], base[:, :width]
    if task.kind == "regression":
        decode, tol = regression_answers(cf[valid])
        answers = decode(cf)
        right = decode(decisions) == answers
        changed = answers != decode(base) if base_is_decision else (cf.double() - base.double()).abs() > tol
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


SKIP_UNMOVED = True  # False: every copy runs, those whose patch moves nothing too (the same scores, more work)


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
        base, source = site_acts(patcher, pset, cache)
        n_pos = pset.run.n_positions[pset.base]
        masks = patch_masks(side, pset.run, stacked)
        # a copy whose patch moves nothing (its positions' source activations equal the base's on every pair of
        # the set: a component that writes zero) decides as the unpatched copy, which runs last: not run itself
        moves = (masks.bool() & (base["site"] != source).flatten(2).any(2).any(0).cpu()).any(1)
        run = torch.nonzero(moves | (torch.arange(len(stacked)) == len(stacked) - 1)).flatten() if SKIP_UNMOVED \
            else torch.arange(len(stacked))
        outputs = patcher.outputs(base, source, projector[run], masks[run], n_pos)
        ran = side.reader.decide(outputs, n_pos.repeat(len(run)))
        ran = ran.reshape(len(run), len(pset.base), *ran.shape[1:])
        own = ran[-1]
        decisions = own.unsqueeze(0).repeat(len(stacked), *([1] * own.ndim))
        decisions[run] = ran
        scored: dict[tuple[int, int], tuple[torch.Tensor, ...]] = {}  # fits of one variable (and projector) alike
        for f, fit in enumerate(fits):
            cf = pset.cf[fit.variable]
            if (fit.variable, -1) not in scored:
                nothing, _ = units(task, own, cf, own, n_pos)
                _, task_changed = units(task, own, cf, pset.base_answers[fit.variable], n_pos, base_is_decision=False)
                scored[fit.variable, -1] = nothing, task_changed
            if (fit.variable, rows[f]) not in scored:
                scored[fit.variable, rows[f]] = units(task, decisions[rows[f]], cf, own, n_pos)
            for k, v in zip(keys, (*scored[fit.variable, rows[f]], *scored[fit.variable, -1]), strict=True):
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


def random_projectors(dims: list[int], d: int, generator: torch.Generator, dtype: torch.dtype) -> torch.Tensor:
    weights = torch.randn(len(dims), d, max(dims), generator=generator, dtype=dtype)
    return span_projectors(weights, torch.tensor(dims))


def random_scores(task: tasks.Task, side: Side, site: str, fits: list[Fit], psets: list[PairSet],
                  generator: torch.Generator, dtype: torch.dtype, cache: dict) -> list[dict[str, Any]]:
    """The random-subspace baseline: RANDOM_DRAWS random subspaces of each fit's dimension, scored for
    its variable (fit n's draws are scores n * RANDOM_DRAWS ...). Fits of one dimension and positions
    share their draws: a random subspace does not depend on the variable, only the comparison does."""
    shapes, projector = random_draws(fits, side.d_model, generator, dtype)
    draws = [f for f in fits for _ in range(verdicts.RANDOM_DRAWS)]
    rows = [shapes.index((f.dim, f.positions)) * verdicts.RANDOM_DRAWS + j
            for f in fits for j in range(verdicts.RANDOM_DRAWS)]
    return score_group(task, side, site, draws, psets, projector, cache, rows)


def random_draws(fits: list[Fit], d: int, generator: torch.Generator, dtype: torch.dtype
                 ) -> tuple[list[tuple[int, str]], torch.Tensor]:
    """The shapes (dimension, positions) of ``fits`` in order and RANDOM_DRAWS random projectors of each: what
    :func:`random_scores` scores (a twin site, whose scores are its twin's, draws them all the same)."""
    shapes = sorted({(f.dim, f.positions) for f in fits})
    return shapes, random_projectors([dim for dim, _ in shapes for _ in range(verdicts.RANDOM_DRAWS)], d,
                                     generator, dtype)


def bases(projector: torch.Tensor, fits: list[Fit]) -> list[torch.Tensor]:
    """Per fit, an orthonormal basis [d, dim] of its projector's range (its top eigenvectors)."""
    _, vectors = torch.linalg.eigh(projector.double())  # ascending eigenvalues: the range is the last columns
    return [vectors[f, :, vectors.shape[-1] - fit.dim:].flip(-1) for f, fit in enumerate(fits)]


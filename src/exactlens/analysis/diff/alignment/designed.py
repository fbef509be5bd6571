"""Counterfactual pairs designed from the exact circuit (``--pairs designed``, the default).

Pairs drawn at random mostly cannot move the variable under test: swapping it leaves the answer as
it was (FIRST's first symbol moves the answer only where the two words start differently; a one-hot
member's swap mostly moves nothing), so a verdict rests on the few pairs that happen to change it.
The exact circuit knows which pairs do: for each (base, source) candidate the exact model is run
with the variable alone swapped (:class:`~.variables.HighLevel`'s counterfactual), and the pair is
*effective* for the variable where that changes the exact output (a unit, per target position for
per-position tasks, whose counterfactual differs from the base's answer; tied counterfactuals are no
units). This is how causal-variable benchmarks build counterfactual datasets from a causal model.

Per split (train / validation / test, disjoint words as in :mod:`.pairs`), candidates are drawn per
length (every ordered pair of distinct words where they are few, else a sample whose bases take every
answer equally often), evaluated in rounds that interleave the lengths, and a candidate is kept when it
is effective for a variable that still has fewer than its target of changed units: the test split's
target is ``wanted`` (``--alignment-pairs``), the others' in the ratio of SPLIT. Nothing ineffective is
added to fill a target: where the pool holds fewer effective pairs than asked, the statistics say how
many exist. The search stops when every target is met or after POOL_FACTOR candidates per wanted unit
(GROWN_POOL_FACTOR in the search repeated on more words where effective pairs were scarce, :mod:`.grow`).

The share of units whose counterfactual is the source's own answer (``source_determined``) is a
property of the variable, not of the design: it is measured on every candidate evaluated for the
training split (a random sample), not on the kept pairs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from exactlens import tasks
from exactlens.analysis.diff.alignment.pairs import SPLIT, PairSet, draw_pairs, split_words
from exactlens.analysis.diff.alignment.score import regression_answers
from exactlens.analysis.diff.alignment.variables import TIED, HighLevel, counterfactuals
from exactlens.analysis.diff.runs import LengthRun

POOL_FACTOR = 32  # at most this many candidate pairs searched per wanted changed unit (per split)
GROWN_POOL_FACTOR = 1024  # the same where effective pairs were scarce and the search runs again on more words
MIN_CHUNK, MAX_CHUNK = 16, 512  # candidates evaluated per length per round
SPLIT_NAMES = ("train", "validation", "test")


@dataclass
class Pool:
    """One split's search for one variable: candidates searched, those effective, the changed units they
    hold, whether every ordered pair of the split's distinct words was evaluated for it, and the changed units
    kept."""

    searched: int = 0
    effective: int = 0
    effective_units: int = 0
    exhaustive: bool = True
    kept_units: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {"searched": self.searched, "effective": self.effective, "effective_units": self.effective_units,
                "effective_share": self.effective / self.searched if self.searched else None,
                "exhaustive": self.exhaustive, "kept_units": self.kept_units}


@dataclass
class Design:
    """The designed splits, each split's per-variable search, and the evaluated training candidates."""

    splits: tuple[list[PairSet], list[PairSet], list[PairSet]]
    pools: list[list[Pool]]  # per split, per variable
    sampled: list[PairSet] = field(default_factory=list)  # every candidate evaluated for training
    notes: dict[str, Any] = field(default_factory=dict)


def changed_units(task: tasks.Task, cf: torch.Tensor, base: torch.Tensor, n_positions: torch.Tensor) -> torch.Tensor:
    """[P] per pair, its units whose counterfactual ``cf`` differs from the base's answer ``base`` (the
    per-pair count of :func:`.score.units`' ``changed``, against an answer)."""
    if task.kind == "classification":
        return ((cf.long() != base.long()) & (cf.long() != TIED)).long()
    if task.kind == "membership":  # an exact label's answer decided by rounding (TIED) is no unit
        return ((cf.double() != base.double()) & (cf.long() != TIED)).long()
    width = cf.shape[1]
    valid = task.target_mask(n_positions - task.n_specials, width, cf)  # cf's undefined answers are no units
    if task.kind == "prediction":
        valid = valid & (cf.long() != TIED)
        changed = cf.long() != base[:, :width].long()
    else:
        _, tol = regression_answers(cf[valid])
        changed = (cf.double() - base[:, :width].double()).abs() > tol
    return (changed & valid).sum(1)


def design_pairs(task: tasks.Task, runs: list[LengthRun], variables: list[HighLevel], wanted: int, seed: int,
                 pool_factor: int = POOL_FACTOR) -> Design:
    """Designed (train, validation, test) pair sets (module docstring); ``wanted``: changed test units per
    variable (the other splits' targets in the ratio of SPLIT)."""
    rng = np.random.default_rng(seed + 7)
    targets = split_targets(wanted)
    words = [(run, split_words(run, rng)) for run in runs if len(run.ids)]
    if any(split is not None for _, split in words):
        pools_of = [[(run, split[k]) if split is not None else (run, _all_words(run) if k == 0 else None)
                     for run, split in words] for k in range(3)]
        found = [_search(task, [p for p in pools_of[k] if p[1] is not None], variables, targets[k], rng, pool_factor)
                 for k in range(3)]
        splits = tuple(f[0] for f in found)
        notes = {"word_disjoint": True,
                 "training_only_lengths": [run.length for run, split in words if split is None]}
        return Design(splits, [f[1] for f in found], found[0][2], notes)  # type: ignore[arg-type]
    # no length has words to spare: one search over all words, its pairs dealt 3:1:1 (words then recur)
    chosen, pools, sampled = _search(task, [(run, _all_words(run)) for run, _ in words], variables, sum(targets), rng,
                                     pool_factor)
    return Design(_deal(chosen), [pools] * 3, sampled,
                  {"word_disjoint": False, "training_only_lengths": [],
                   "note": "no length has enough distinct words: designed pairs are dealt 3:1:1 to the splits "
                           "and test pairs may share words with training pairs"})


def split_targets(wanted: int) -> list[int]:
    """The changed units a designed search keeps per variable in each split: ``wanted`` in the test split,
    the others in the ratio of SPLIT."""
    return [max(1, int(round(wanted * share / SPLIT[2]))) for share in SPLIT]


def _all_words(run: LengthRun) -> np.ndarray:
    _, first = np.unique(run.ids.numpy(), axis=0, return_index=True)
    return np.sort(first)


def _candidates(run: LengthRun, words: np.ndarray, cap: int, rng: np.random.Generator
                ) -> tuple[np.ndarray, np.ndarray, bool]:
    """(base, source) word indices of a run to search, in random order, and whether they are every ordered
    pair of distinct words (else up to ``cap`` distinct pairs with bases balanced over the answers,
    :func:`.pairs.draw_pairs`). Unlike random pairs, which repeat a pair where a split has few words, no
    pair is searched (or kept) twice."""
    n = len(words)
    if n < 2:
        return np.zeros(0, np.int64), np.zeros(0, np.int64), True
    if n * (n - 1) <= cap:
        b, s = np.divmod(np.flatnonzero(~np.eye(n, dtype=bool)), n)
        order = rng.permutation(len(b))
        return words[b[order]], words[s[order]], True
    b, s = draw_pairs(run.truth[torch.as_tensor(words)], cap, rng)
    _, first = np.unique(b * n + s, return_index=True)  # each pair once: an interval counts distinct pairs
    keep = np.sort(first)
    return words[b[keep]], words[s[keep]], False


def _search(task: tasks.Task, pools: list[tuple[LengthRun, np.ndarray]], variables: list[HighLevel], target: int,
            rng: np.random.Generator, pool_factor: int = POOL_FACTOR
            ) -> tuple[list[PairSet], list[Pool], list[PairSet]]:
    """One split's search: per run its kept pairs (one PairSet), per variable its Pool, and every evaluated
    candidate chunk (PairSets)."""
    n_var = len(variables)
    stats = [Pool() for _ in variables]
    if not pools or not n_var:
        return [], stats, []
    cap = max(MIN_CHUNK, math.ceil(pool_factor * target / len(pools)))
    full = max(MIN_CHUNK, math.ceil(POOL_FACTOR * target / len(pools)))  # candidates evaluated for every variable
    cands = [_candidates(run, words, cap, rng) for run, words in pools]
    for _, _, exhaustive in cands:
        for pool in stats:
            pool.exhaustive &= exhaustive
    chunk = min(MAX_CHUNK, max(MIN_CHUNK, math.ceil(4 * target / len(pools))))
    got = np.zeros(n_var, np.int64)
    kept: list[list[PairSet]] = [[] for _ in pools]
    evaluated: list[PairSet] = []
    at = 0
    while (got < target).any() and any(at < len(c[0]) for c in cands):
        # past the first POOL_FACTOR candidates per wanted unit, only the variables still short are evaluated
        live = np.arange(n_var) if at < full else np.flatnonzero(got < target)
        size = chunk if at < full else MAX_CHUNK
        rounds = []
        for r, ((run, _), (base, source, _)) in enumerate(zip(pools, cands, strict=True)):
            if at < len(base):
                pset = _evaluate(run, base[at:at + size], source[at:at + size], [variables[v] for v in live])
                eff = np.zeros((n_var, len(pset.base)), np.int64)
                eff[live] = torch.stack([changed_units(task, pset.cf[j], pset.base_answers[j],
                                                       run.n_positions[pset.base]) for j in range(len(live))]).numpy()
                rounds.append((r, pset, eff))
                if len(live) == n_var:
                    evaluated.append(pset)
                for v in live:
                    stats[v].searched += eff.shape[1]
                    stats[v].effective += int((eff[v] > 0).sum())
                    stats[v].effective_units += int(eff[v].sum())
        picks: dict[int, list[int]] = {r: [] for r, _, _ in rounds}
        for p in range(size):  # the lengths interleaved
            for r, _, eff in rounds:
                if p < eff.shape[1] and ((eff[:, p] > 0) & (got < target)).any():
                    picks[r].append(p)
                    got += eff[:, p]
        for r, pset, _ in rounds:
            if picks[r] and len(live) == n_var:
                kept[r].append(_subset(pset, picks[r]))
            elif picks[r]:  # the kept pairs' counterfactuals of every variable, and what they add to the others
                whole = _evaluate(pset.run, pset.base[picks[r]].numpy(), pset.source[picks[r]].numpy(), variables)
                kept[r].append(whole)
                for v in np.setdiff1d(np.arange(n_var), live):
                    got[v] += int(changed_units(task, whole.cf[v], whole.base_answers[v],
                                                pset.run.n_positions[whole.base]).sum())
        at += size
    for v, pool in enumerate(stats):
        pool.kept_units = int(got[v])
        pool.exhaustive &= pool.searched == sum(len(c[0]) for c in cands)  # every candidate evaluated for it
    return [_join(k) for k in kept if k], stats, evaluated


def _evaluate(run: LengthRun, base: np.ndarray, source: np.ndarray, variables: list[HighLevel]) -> PairSet:
    b, s = torch.as_tensor(base), torch.as_tensor(source)
    return PairSet(run, b, s, counterfactuals(variables, run, b, s),
                   [v.base_answer(run, b) for v in variables])


def _subset(pset: PairSet, keep: list[int]) -> PairSet:
    index = torch.as_tensor(keep)
    return PairSet(pset.run, pset.base[index], pset.source[index], [cf[index] for cf in pset.cf],
                   [a[index] for a in pset.base_answers])


def _join(psets: list[PairSet]) -> PairSet:
    return PairSet(psets[0].run, torch.cat([p.base for p in psets]), torch.cat([p.source for p in psets]),
                   [torch.cat([p.cf[v] for p in psets]) for v in range(len(psets[0].cf))],
                   [torch.cat([p.base_answers[v] for p in psets]) for v in range(len(psets[0].cf))])


def _deal(chosen: list[PairSet]) -> tuple[list[PairSet], list[PairSet], list[PairSet]]:
    """Each run's pairs dealt to train / validation / test in turn 3:1:1 (the ratio of SPLIT)."""
    pattern = np.array([0, 0, 0, 1, 2])
    out: tuple[list[PairSet], list[PairSet], list[PairSet]] = ([], [], [])
    for pset in chosen:
        which = pattern[np.arange(len(pset.base)) % len(pattern)]
        for k in range(3):
            if (which == k).any():
                out[k].append(_subset(pset, np.flatnonzero(which == k).tolist()))
    return out


def with_variables(pset: PairSet, variables: list[HighLevel], after: bool = True) -> PairSet:
    """The pair set with the counterfactuals and base answers of ``variables`` added after (or before) its own."""
    cf = counterfactuals(variables, pset.run, pset.base, pset.source)
    base = [v.base_answer(pset.run, pset.base) for v in variables]
    if after:
        return PairSet(pset.run, pset.base, pset.source, pset.cf + cf, pset.base_answers + base)
    return PairSet(pset.run, pset.base, pset.source, cf + pset.cf, base + pset.base_answers)


def constant_within_length(variable: HighLevel, runs: list[LengthRun]) -> bool:
    """True where the variable takes one value on every word of each length (at every position):
    no same-length interchange can change it (parity's 1/n, Dyck-1's 1/(i+1))."""
    if variable.values is None:
        return False
    for run in runs:
        if len(run.ids) < 2:
            continue
        values = variable.values(run, torch.arange(len(run.ids)))
        same = (values == values[:1]) | (torch.isnan(values) & torch.isnan(values[:1]))
        if not bool(same.all()):
            return False
    return True


def token_function(variable: HighLevel, runs: list[LengthRun]) -> bool:
    """True for a position-level variable whose value at each position is a function of the token there (and
    the position and length) on every word of ``runs``: what the embedding can carry without computing."""
    if variable.scope != "position" or variable.values is None:
        return False
    for run in runs:
        if len(run.ids) < 2:
            continue
        values = variable.values(run, torch.arange(len(run.ids))).nan_to_num(nan=float("inf"))
        for j in range(min(values.shape[1], run.tokens.shape[1])):
            tokens = run.tokens[:, j]
            for token in torch.unique(tokens):
                group = values[tokens == token, j]
                if not bool((group == group[:1]).all()):
                    return False
    return True


def untestable_reason(variable: HighLevel, pools: list[Pool], runs: list[LengthRun]) -> str | None:
    """Why no pair can test the variable (None where some pair of the search changes the exact output
    through it)."""
    if constant_within_length(variable, runs):
        return "constant within a length: no same-length interchange changes it"
    if any(pool.effective for pool in pools):
        return None
    searched = sum(pool.searched for pool in pools)
    if variable.unread:  # a position-resolved variable nothing carries on (:func:`.variables.unread_after`)
        return f"{variable.unread} (none of the {searched} pairs searched does)"
    if all(pool.exhaustive for pool in pools):
        return (f"no (base, source) pair of these words changes the exact output through it (all {searched} "
                "ordered pairs of distinct words of one length searched)")
    return f"none of the {searched} (base, source) pairs searched changes the exact output through it"


def pool_summary(design: Design, v: int) -> dict[str, Any]:
    """The JSON of one variable's search: per split its Pool, and the test split's headline numbers."""
    test = design.pools[2][v]
    return {"splits": {name: design.pools[k][v].to_dict() for k, name in enumerate(SPLIT_NAMES)},
            "searched": test.searched, "effective": test.effective,
            "effective_share": test.effective / test.searched if test.searched else None,
            "available": test.effective_units if test.exhaustive else None}

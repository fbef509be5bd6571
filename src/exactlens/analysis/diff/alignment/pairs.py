"""(base, source) pairs of words per length, split train / validation / test with disjoint words."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from exactlens.analysis.diff.alignment.variables import HighLevel, counterfactuals
from exactlens.analysis.diff.runs import LengthRun
from exactlens.tasks.base import UNDEFINED, defined_targets

SPLIT = (0.6, 0.2, 0.2)  # train / validation (chooses k) / test (reported) pairs


@dataclass
class PairSet:
    """Base and source word indices of one length, and the answers of every variable on them."""

    run: LengthRun
    base: torch.Tensor
    source: torch.Tensor
    cf: list[torch.Tensor]  # per variable: counterfactual answers
    base_answers: list[torch.Tensor]

    def __post_init__(self) -> None:
        """A position where the base word's answer is undefined (a compiled program's RASP None: dedup's repeats,
        trend's last position) is no target, so no unit either, whatever the counterfactual there: each per-position
        counterfactual is made undefined (UNDEFINED, NaN) where the base word's is. Otherwise such a position counted
        as changed in the designed search (an answer against no answer), and against a model's own decision, which
        an exact compiled model takes there from its attention's leak: tracr-dedup's code, repeats and slot were
        searched as effective on 89 test units and scored on 9."""
        truth = self.run.truth
        if truth.ndim != 2 or not len(self.base):
            return
        defined = defined_targets(truth[self.base], truth.shape[1])
        for v, cf in enumerate(self.cf):
            if cf.ndim == 2 and cf.shape[0] == len(self.base) and cf.shape[1] <= defined.shape[1]:
                keep = defined[:, :cf.shape[1]]
                self.cf[v] = torch.where(keep, cf, torch.full_like(cf, math.nan if cf.is_floating_point()
                                                                    else UNDEFINED))


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
            part.append(PairSet(run, b, s, counterfactuals(variables, run, b, s),
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
                part.append(PairSet(run, b, s, counterfactuals(variables, run, b, s),
                                    [v.base_answer(run, b) for v in variables]))
    return splits


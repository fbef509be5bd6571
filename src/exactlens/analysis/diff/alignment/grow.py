"""More words where the designed search finds too few effective pairs (issue 41: every variable decided).

The diff runs both models on ``strings`` words per length (64 by default), and the designed search
(:mod:`.designed`) can only pair words it has. Where a variable's effective pairs are rare among them,
its test split holds fewer changed pairs than asked even when every pair of its words was searched:
dyck1-depth2's depth-2 automaton (``L2_active``: 2 changed test pairs at 64 words per length, as the
sampler's 38 and 46 distinct words at lengths 8 and 10 leave few test words), parity-ln-eta's ``k/n@1``
(a source with exactly one 1 moves it: 25 changed test pairs). The language has more words of those
lengths, and more words give more effective pairs.

:func:`scarce` names the variables whose search fell short in some split although it found effective
pairs (a variable with none anywhere is "untestable", and more words of the same law rarely change that);
:func:`grow_runs` then runs both models once more on more words of each length that does not already hold
every word of the language: every word where there are at most ALL_WORDS (or GROW_FACTOR times the run's distinct
words, if more), else the run's words plus a new sample of the task's law up to GROW_FACTOR times them, in both
cases within GROW_MEMORY_SHARE of the memory limit. The designed search is then repeated on the grown runs as a
whole (up to GROWN_POOL_FACTOR candidates per wanted unit), so the split of words into train / validation / test
(:func:`.pairs.split_words`) stays one split, disjoint as before. What the grown runs still lack, the search
reports as before ("available"); nothing ineffective is added.
"""

from __future__ import annotations

from typing import Any

import torch

from exactlens import tasks
from exactlens.analysis.diff.alignment.designed import SPLIT_NAMES, split_targets
from exactlens.analysis.diff.runs import LengthRun, Side, run_exact_words, with_trained
from exactlens.resources import memory_limit
from exactlens.tasks.base import EXHAUSTIVE_LIMIT

GROW_FACTOR = 16  # a length's words are multiplied by at most this where effective pairs are scarce
GROW_MEMORY_SHARE = 0.25  # the grown runs' activations take at most this share of the memory limit
ALL_WORDS = 4096  # every word of a length where it has at most this many (and they fit), else a sample
GROW_SEED = 1009  # added to the diff's seed for the new words' sample


def scarce(pools: list[dict[str, Any] | None], reasons: list[str | None], wanted: int, word_disjoint: bool
           ) -> list[int]:
    """The variables (indices) whose designed search kept fewer changed units than its target in some split
    although it found effective pairs (``pools``: :func:`.designed.pool_summary` per variable; ``reasons``: why
    a variable is untestable, None where it is not)."""
    targets = split_targets(wanted)
    if not word_disjoint:  # one search for all splits, dealt 3:1:1
        targets = [sum(targets)] * 3
    out = []
    for i, (pool, reason) in enumerate(zip(pools, reasons, strict=True)):
        if pool is None or reason is not None:
            continue
        splits = [pool["splits"][name] for name in SPLIT_NAMES]
        if any(s["effective"] for s in splits) and any(
                s["kept_units"] < target for s, target in zip(splits, targets, strict=True)):
            out.append(i)
    return out


def _bytes_per_word(run: LengthRun) -> float:
    arrays = [*run.exact_acts.values(), *(run.trained_acts or {}).values()]
    return sum(a.nbytes for a in arrays) / max(len(run.ids), 1)


def grow_runs(task: tasks.Task, runs: list[LengthRun], trained: Side, exact: Side, seed: int
              ) -> tuple[list[LengthRun], list[dict[str, Any]]] | None:
    """Runs with more words (module docstring) and, per grown length, its distinct words before and after
    and whether they are every word of the length; None where no length can grow."""
    budget = GROW_MEMORY_SHARE * memory_limit() - sum(_bytes_per_word(r) * len(r.ids) for r in runs)
    k = len(task.alphabet)
    out, notes = [], []
    for run in runs:
        distinct = len(torch.unique(run.ids, dim=0)) if len(run.ids) else 0
        per_word = _bytes_per_word(run)
        room = int(budget // per_word) if per_word > 0 else 0
        total = k**run.length  # a Python int: no overflow
        count = min(GROW_FACTOR * distinct, room)
        if run.exhaustive or not distinct or distinct >= total or count <= len(run.ids):
            out.append(run)
            continue
        if total <= min(max(count, ALL_WORDS), room, EXHAUSTIVE_LIMIT):
            ids, every = task.all_words(run.length), True
        else:
            gen = torch.Generator().manual_seed(int(seed) + GROW_SEED + run.length)
            ids, every = torch.cat([run.ids, task.sample(run.length, count - len(run.ids), gen)]), False
        grown = with_trained([run_exact_words(task, run.length, ids, every, exact)], trained)[0] \
            if run.trained_outputs is not None else run_exact_words(task, run.length, ids, every, exact)
        budget -= per_word * (len(ids) - len(run.ids))
        after = len(torch.unique(ids, dim=0))
        notes.append({"length": run.length, "words": distinct, "grown_to": after, "every_word": every})
        out.append(grown)
    return (out, notes) if notes else None

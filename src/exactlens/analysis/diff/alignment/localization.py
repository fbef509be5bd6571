"""Where a variable is patched, whether its counterfactual is the answer itself, and the illusion check."""

from __future__ import annotations

from typing import Any

import torch

from exactlens import tasks
from exactlens.analysis.diff import illusion
from exactlens.analysis.diff.alignment import verdicts
from exactlens.analysis.diff.alignment.pairs import PairSet
from exactlens.analysis.diff.alignment.patch import Fit, Patcher, patch_masks, site_acts
from exactlens.analysis.diff.alignment.score import score_group
from exactlens.analysis.diff.alignment.variables import TIED, HighLevel
from exactlens.analysis.diff.runs import Side

DETERMINED = 0.99  # a variable whose counterfactual is the source's own answer on this share of pairs


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
                mask = patch_masks(side, pset.run, [Fit(-1, 0, positions)])[0].bool()
                acts.append(site_acts(patcher, pset, cache)[0]["site"][:, mask].double())
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


COMPONENT_SITES = verdicts.COMPONENT_SITES


def localizable(variable: HighLevel) -> bool:
    """An answer-determined variable can be localized apart from the answer where the exact circuit
    computes it at every position (or it is a task variable, which the circuit computes before it
    reaches the readout): patched at every position of a component's output. A label only the
    readout position holds (e.g. FIRST's s) is the answer itself there."""
    return variable.position_index is None and (variable.origin == "task"
                                                or variable.detail.get("exact_positions") == "all")


def positions_of(variable: HighLevel, determined: float, per_position: bool) -> str:
    """Where a variable is patched. Swapping a subspace at every position that holds the tokens
    themselves swaps the input, which realizes any variable that decides the answer alone: such
    (source-determined) and word-level variables are patched at the readout position, where the
    answer has to be gathered; position-level ones at every position (each from its own position
    of the source). Per-position readouts have no single readout position: every position. A position-resolved
    variable at its own position p: "@p"."""
    if variable.position_index is not None:
        return f"@{variable.position_index}"
    if per_position:
        return "all"
    if variable.scope == "word" or determined >= DETERMINED:
        return "readout"
    return "all"


"""The high-level variables DAS aligns: the task's causal variables and the exact circuit's residual labels."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from exactlens import tasks
from exactlens.analysis.diff.interventions import copies_per_pass, stacked_patched_outputs
from exactlens.analysis.diff.runs import LengthRun, Side, normalizes_rounding, writer_site, zero_eps_norms
from exactlens.model.labels import is_negated_copy, label_direction
from exactlens.tasks import kinds


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
    # a position-resolved variable (:func:`position_variables`): the token position it is held, tested and patched at
    position_index: int | None = None
    # an exact variable held at every position: its position-resolved variable at a position
    at_position: Callable[[int], HighLevel] | None = None
    # a position-resolved variable that nothing after its site carries to the readout: why no swap can test it
    unread: str | None = None
    # an exact variable: its swap on a run (None: it swaps nothing there, the counterfactual is the base answer);
    # counterfactuals() runs the swaps of many variables in one forward pass
    swap: Callable[[LengthRun], Swap | None] | None = None


@dataclass(frozen=True)
class Swap:
    """How an exact variable's counterfactual is made on a run's words: the exact model with the variable's
    direction(s) [d, r] at ``site`` set to the source words' (at ``positions``; None: every position)."""

    exact: Side
    site: str
    direction: np.ndarray
    positions: np.ndarray | None


def counterfactuals(variables: list[HighLevel], run: LengthRun, b: torch.Tensor, s: torch.Tensor
                    ) -> list[torch.Tensor]:
    """Each variable's counterfactual answers on the pairs (b, s) of a run, as ``variable.counterfactual`` gives
    them: the exact variables' swaps run stacked, as many in one forward pass as fit (:func:`swapped_answers`;
    the per-call cost of a forward of a few words is most of a designed-pair search), the others one by one."""
    out: list[torch.Tensor | None] = [None] * len(variables)
    stacks: dict[int, list[tuple[int, Swap]]] = {}
    for i, v in enumerate(variables):
        swap = v.swap(run) if v.swap is not None else None
        if v.swap is None:
            out[i] = v.counterfactual(run, b, s)
        elif swap is None:
            out[i] = v.base_answer(run, b)
        else:
            stacks.setdefault(id(swap.exact), []).append((i, swap))
    for stack in stacks.values():
        for (i, _), answers in zip(stack, swapped_answers(run, b, s, [swap for _, swap in stack]), strict=True):
            out[i] = answers
    return out  # type: ignore[return-value]


def swapped_answers(run: LengthRun, b: torch.Tensor, s: torch.Tensor, swaps: list[Swap]) -> list[torch.Tensor]:
    """The exact model's answers on words b of a run with each swap's direction(s) set to words s's: copies of the
    words, one per swap, in forward passes of at most :func:`copies_per_pass` copies, whose last layer runs at the
    readout position only where that gives a full pass's outputs (:func:`.interventions.readout_only_for`); per
    swap, ties, leak and norms of rounding noise read as no answer (:func:`no_answer_where_tied`,
    :class:`NormWatch`)."""
    exact = swaps[0].exact
    n_pos, words = run.n_positions[b], run.tokens[b]
    rows = exact.model.readout_rows(run.n_positions)
    step = copies_per_pass(exact, len(b), int(run.tokens.shape[1]), hooked=True)  # as the model's own check
    out = []
    for lo in range(0, len(swaps), step):
        part = swaps[lo:lo + step]
        patches = [(w.site, w.direction, run.exact_acts[w.site][s.numpy()], w.positions) for w in part]
        with NormWatch(exact) as watch:
            outputs = stacked_patched_outputs(exact, words, patches, n_pos, readout_only=True)
        undecided = watch.undecided(None if rows is None else rows[b].repeat(len(part)))
        for k in range(len(part)):
            here = outputs[k * len(b):(k + 1) * len(b)]
            out.append(no_answer_where_tied(exact, here, exact.reader.decide(here, n_pos),
                                            None if undecided is None else undecided[k * len(b):(k + 1) * len(b)],
                                            reference=run.exact_outputs[b]))
    return out


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
            remembered(lambda run, b, v=var: _task_values(task, v, run, b)),
        ))
    return out


def remembered(values: Callable[[LengthRun, torch.Tensor], torch.Tensor]
               ) -> Callable[[LengthRun, torch.Tensor], torch.Tensor]:
    """``values`` computed once per run and words: the probe starts and dimensions of every site ask for the
    same training words' values, and a task variable's values may be costly (a tracr program's are the RASP
    program evaluated in Python on each word: 22 of the 163 CPU seconds of tracr-sort's default self-diff
    were these repeats). Callers must not change the tensor returned."""
    memo: dict[tuple[int, str, bytes], tuple[LengthRun, torch.Tensor]] = {}

    def cached(run: LengthRun, b: torch.Tensor) -> torch.Tensor:
        index = torch.as_tensor(b)
        key = (id(run), str(index.dtype), index.numpy().tobytes())
        hit = memo.get(key)
        if hit is None or hit[0] is not run:  # the run is kept with its values, so its id is not reused
            hit = memo[key] = (run, values(run, b))
        return hit[1]

    return cached


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


def exact_variables(exact: Side, features: list[dict[str, Any]], runs: list[LengthRun] | None = None
                    ) -> tuple[list[HighLevel], list[dict[str, Any]]]:
    """The exact circuit's computed, non-constant residual labels (from the probe table's features); the
    members of a one-hot group (:func:`one_hot_groups`, on ``runs``' words) as one variable."""
    out, skipped = [], []
    labels = [feat["label"] for feat in sorted(features, key=lambda f: f["index"])]
    kept = []
    for feat in features:
        if feat["constant"]:
            skipped.append({"variable": feat["label"], "reason": "constant on these words"})
        elif feat["exact_site"] == exact.sites[0]:
            skipped.append({"variable": feat["label"], "reason": "input feature (set by the embedding)"})
        elif is_negated_copy(labels, feat["label"]):
            skipped.append({"variable": feat["label"], "reason": "negated copy in a doubled residual [x; -x]: tested "
                            f"with {feat['label'][2:-1]} as the one direction e_L - e_-(L)"})
        else:
            kept.append(feat)
    groups = one_hot_groups(exact, kept, runs or [])
    grouped = {m["label"] for members in groups.values() for m in members}
    for name, members in groups.items():
        out.append(_exact_variable(exact, name, members, labels))
    out += [_exact_variable(exact, feat["label"], [feat], labels) for feat in kept if feat["label"] not in grouped]
    return out, skipped


def _exact_variable(exact: Side, name: str, members: list[dict[str, Any]], labels: list[str],
                    at: int | None = None) -> HighLevel:
    """One exact variable: a label, or a one-hot group swapped whole (its members' dimensions together); ``at``:
    its value at that token position alone (swapped there only, NaN elsewhere)."""
    site, scope = members[0]["exact_site"], members[0]["positions"]
    index = [m["index"] for m in members]
    if len(labels) == exact.d_model:
        direction = torch.stack([label_direction(labels, m["label"]) for m in members], 1).numpy()
    else:
        direction = np.eye(exact.d_model)[:, index]

    def swap(run: LengthRun) -> Swap | None:
        rows = exact.model.readout_rows(run.n_positions)
        positions = np.array([int(rows[0])]) if scope == "readout" and rows is not None else None
        if at is not None:
            if at >= run.tokens.shape[1] or (rows is not None and int(rows[0]) == at):
                return None  # a length without that position, or whose readout it is: no swap
            positions = np.array([at])
        return Swap(exact, writer_site(exact, site), direction, positions)

    def counterfactual(run: LengthRun, b: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        here = swap(run)
        return base_answer(run, b) if here is None else swapped_answers(run, b, s, [here])[0]

    def base_answer(run: LengthRun, b: torch.Tensor) -> torch.Tensor:
        return exact.reader.decide(run.exact_outputs[b], run.n_positions[b])

    def values(run: LengthRun, b: torch.Tensor) -> torch.Tensor:
        held = torch.as_tensor(run.exact_acts[site][b.numpy()][:, :, index], dtype=torch.float64)
        if at is None:
            return held
        out = torch.full_like(held, float("nan"))
        rows = exact.model.readout_rows(run.n_positions)
        if rows is None or int(rows[0]) != at:  # its value at its own position, where that is not the readout
            out[:, at:at + 1] = held[:, at:at + 1]
        return out

    detail: dict[str, Any] = {"exact_site": site, "exact_positions": scope}
    if len(members) > 1:
        detail["members"] = [m["label"] for m in members]
    if at is not None:
        detail.update(position_index=at, resolves=name)
        return HighLevel(f"{name}@{at}", "exact", "position", counterfactual, base_answer, detail, values, at,
                         unread=unread_after(exact, site, at), swap=swap)
    return HighLevel(name, "exact", "position" if scope == "all" else "word", counterfactual, base_answer, detail,
                     values, at_position=(lambda p: _exact_variable(exact, name, members, labels, p))
                     if scope == "all" else None, swap=swap)


def unread_after(exact: Side, site: str, at: int) -> str | None:
    """Why a value at position ``at`` after ``site`` cannot reach the readout of the exact model: no attention
    layer after the site moves anything between positions (its value or output weights are zero), and every
    other component works position by position. None where one may. parity-ln-eta's s and its confidence
    layer's s̄ at position 1: the confidence layer's attention does nothing, and only [CLS] is read."""
    parts = site.split(".")
    if len(parts) != 3 or not parts[1].isdigit() or not hasattr(exact.model, "blocks"):
        return None
    first = int(parts[1]) + (0 if parts[2] == "hook_resid_pre" else 1)
    for block in list(exact.model.blocks)[first:]:
        attn = getattr(block, "attn", None)
        if attn is None or not all(hasattr(attn, w) for w in ("W_V", "W_O")):
            return None
        if bool(attn.W_V.detach().any()) and bool(attn.W_O.detach().any()):
            return None
    return (f"no attention layer after {site} moves position {at} to the readout (each has zero value or output "
            "weights) and every other component works position by position: no swap there changes the output")


def varying_positions(variable: HighLevel, runs: list[LengthRun], readout: Callable[[torch.Tensor], Any]
                      ) -> list[int]:
    """The token positions, other than the readout position, at which the variable's value differs between two
    words of one length (in ``runs``), in order. ``readout``: the exact model's readout rows of n_positions."""
    found: set[int] = set()
    for run in runs:
        if len(run.ids) < 2 or variable.values is None:
            continue
        values = variable.values(run, torch.arange(len(run.ids))).nan_to_num(nan=float("inf"))
        varies = (values != values[:1]).flatten(2).any(2).any(0)  # [n]
        rows = readout(run.n_positions)
        if rows is not None:
            varies[int(rows[0])] = False
        found |= {int(j) for j in torch.nonzero(varies).flatten()}
    return sorted(found)


def position_variables(exact: Side, variables: list[HighLevel], determined: list[float], threshold: float,
                       cap: int, runs: list[LengthRun]) -> list[HighLevel]:
    """Position-resolved variables (issue 41, item 3): for each exact variable held at every position whose
    counterfactual is the answer itself (``determined`` >= ``threshold``: at the readout it cannot be told from
    the answer), its value at each of the first ``cap`` positions other than the readout where it varies
    between words (:func:`varying_positions`), named ``LABEL@p``. FIRST's AND label I[w_i=1 & i=1] is the first
    symbol at position 1, before [CLS] reads it: ``I[w_i=1 & i=1]@1``. Each is tested at its position: the
    exact counterfactual swaps the label at that position only, the trained model is patched there only, and
    base and source differ there (the designed pairs are the ones whose swap there changes the exact output)."""
    if cap <= 0:
        return []
    out = []
    for v, share in zip(variables, determined, strict=True):
        if v.at_position is None or share < threshold:
            continue
        out += [v.at_position(p) for p in varying_positions(v, runs, exact.model.readout_rows)[:cap]]
    return out


_GROUP_NAME = re.compile(r"(?P<prefix>.+?)(?P<sep>[:_])(?P<value>[A-Za-z0-9.+-]+)$")


def group_key(label: str) -> tuple[str, str] | None:
    """(prefix, separator) of a label that names one value of a categorical variable: tracr's
    ``name:value`` (the last ':'), or ``name_value`` with a plain value (``next_a``); None otherwise."""
    if ":" in label:
        prefix, value = label.rsplit(":", 1)
        return (prefix, ":") if prefix and value else None
    match = _GROUP_NAME.match(label)
    return (match["prefix"], "_") if match and match["sep"] == "_" else None


def one_hot_groups(exact: Side, feats: list[dict[str, Any]], runs: list[LengthRun]) -> dict[str, list[dict]]:
    """Labels that are one categorical variable coded one-hot: two or more labels of one name (``hist_2:0``,
    ``hist_2:1``...; ``next_a``, ``next_b``...), settled at one site and patched at the same positions, of
    which at most one is non-zero (:func:`_set`) at every position of every word in ``runs``. Swapping one member alone
    leaves two classes set (or none), whose logits tie (:func:`no_answer_where_tied`): such a label has no
    counterfactual of its own, the group has. Named ``prefix:*`` or ``prefix_*``."""
    by_key: dict[tuple[str, str, str, str], list[dict[str, Any]]] = {}
    for feat in feats:
        key = group_key(feat["label"])
        if key is not None:
            by_key.setdefault((*key, feat["exact_site"], feat["positions"]), []).append(feat)
    out = {}
    for (prefix, sep, site, _), members in by_key.items():
        members = sorted(members, key=lambda f: f["index"])
        if len(members) < 2 or not runs:
            continue
        index = [m["index"] for m in members]
        acts = [np.asarray(run.exact_acts[site])[..., index].reshape(-1, len(index)) for run in runs
                if site in run.exact_acts and len(run.ids)]
        if acts and all(int(_set(a).sum(1).max(initial=0)) <= 1 for a in acts):
            out[f"{prefix}{sep}*"] = members
    return out


ONE_HOT_TOLERANCE = 1e-3  # a one-hot member counts as set above this share of the group's largest value


def _set(acts: np.ndarray) -> np.ndarray:
    """Where a one-hot group's members are set: above ONE_HOT_TOLERANCE of the largest magnitude (a compiled
    softmax attention leaks ~1e-6 to the other members: tracr-reverse's reverse_6:a/b/c, measured 2.7e-6)."""
    top = float(np.abs(acts).max(initial=0.0))
    return np.abs(acts) > ONE_HOT_TOLERANCE * top


TIED = -100  # a counterfactual class with no answer (cross-entropy's ignore_index; units() leaves it out)


class NormWatch:
    """Watches, in one forward pass of an exact model, its post layer norms with eps = 0 at the readout row:
    ``undecided`` marks the rows where one of them normalized an input that is zero to within rounding
    (:func:`~exactlens.analysis.diff.runs.normalizes_rounding`, the criterion :func:`.runs.degenerate_rows` applies
    to every row of the runs). Such a norm scales rounding noise to unit size, so the answer after it is decided
    by rounding, not by the circuit. parity-ln-eta: its confidence layer (Chiang & Cholak Prop. 2) writes
    [s, -s, 0...] and normalizes it; where a swap leaves no position with i = k, s is 0, and the answer was the
    sign of a residue ~1e-17 (58 of the 96 changed training pairs of k/n@1 at lengths 4, 6; a patch in the same
    direction computed another way took the other sign on 6 of them). In a pass whose last layer runs at the
    readout position only, that layer's activations after its attention are that row alone ([B, 1, ...])."""

    def __init__(self, exact: Side):
        self.watched = zero_eps_norms(exact)  # (scale hook, residual hook, component hook)
        self.model, self.acts, self.handles = exact.model, {}, []

    def __enter__(self) -> NormWatch:
        for name in dict.fromkeys(h for hooks in self.watched for h in hooks):
            self.handles.append(self.model.hook_dict[name].register_forward_hook(
                lambda module, args, out, name=name: self.acts.__setitem__(name, out.detach())))
        return self

    def __exit__(self, *exc: object) -> None:
        for handle in self.handles:
            handle.remove()

    def undecided(self, rows: torch.Tensor | None) -> torch.Tensor | None:
        """[B] bool: the rows whose readout position went through a norm of rounding noise; None where nothing
        is watched or the readout is per position."""
        if rows is None or not self.watched or not self.acts:
            return None
        index = rows.long().to(next(iter(self.acts.values())).device)
        out = None
        for scale_name, residual, component in self.watched:
            def at(name: str) -> torch.Tensor:  # one position per word: the readout row of a readout-only pass
                act = self.acts[name]
                if act.shape[1] == 1:
                    return act[:, 0]
                return act[torch.arange(act.shape[0], device=act.device), index[:act.shape[0]]]
            here = normalizes_rounding(at(scale_name), at(residual), at(component), self.acts[scale_name].dtype)
            out = here if out is None else out | here
        return None if out is None else out.cpu()


def no_answer_where_tied(exact: Side, outputs: torch.Tensor, decisions: torch.Tensor,
                         undecided: torch.Tensor | None = None, reference: torch.Tensor | None = None) -> torch.Tensor:
    """Argmax decisions of an exact label's patched model, TIED where its two largest logits are equal
    (within 16 rounding units of its dtype): the exact model's answer there is its argmax's tie-break
    (the first class), which a copy in another basis breaks by rounding. tracr-hist: patching one
    dimension of its one-hot count hist_2:0..5 leaves two counts set, whose logits tie; its rotated
    copy took the other class on 2 of 28 changed test pairs (hist_2:1, 0.93). A membership bit is TIED where
    its logit is 0 within 16 rounding units (:func:`_membership_tied`). ``undecided`` ([B] bool,
    :class:`NormWatch`): rows whose answer a norm of rounding noise decided, TIED too (as class indices:
    a membership bit becomes 0 / 1 / TIED). An exact model's output that is zero but for leak (UNDEFINED_OUTPUT)
    is TIED too: a compiled program's undefined answer. Leak is measured against the largest output of
    ``reference`` (the unpatched model's outputs on the same words) where given, so that a batch whose every
    output is leak is still found, and against the batch's own largest otherwise."""
    task = exact.reader.task
    if undecided is not None and bool(undecided.any()) and decisions.shape[:1] == undecided.shape:
        return torch.where(undecided.reshape(-1, *([1] * (decisions.ndim - 1))), torch.full_like(
            decisions.long(), TIED), no_answer_where_tied(exact, outputs, decisions, reference=reference).long())
    if task.kind == "membership":
        return _membership_tied(exact, outputs, decisions)
    if task.kind not in ("classification", "prediction"):
        return decisions
    logits = _answer_logits(task, outputs)
    if logits.shape[-1] < 2 or logits.shape[:-1] != decisions.shape or not torch.equal(logits.argmax(-1), decisions):
        return decisions  # not an argmax decision
    top = logits.topk(2, -1).values
    tol = kinds.regression_tolerance(exact.model.cfg.torch_dtype, top) if exact.exact else 0.0
    tied = top[..., 0] - top[..., 1] <= tol
    if exact.exact:  # an output that is zero but for an attention's leak is no answer (see UNDEFINED_OUTPUT)
        size = logits.abs().amax(-1)
        largest = [float(size.max())] if size.numel() else [0.0]
        if reference is not None and reference.numel():
            largest.append(float(_answer_logits(task, reference).abs().max()))
        tied = tied | (size <= UNDEFINED_OUTPUT * max(largest))
    return torch.where(tied, torch.full_like(decisions, TIED), decisions)


def _answer_logits(task: tasks.Task, outputs: torch.Tensor) -> torch.Tensor:
    """The logits an argmax decision of ``task`` is taken over, in float64."""
    return outputs.double() if task.kind == "classification" else kinds.symbol_outputs(task, outputs).double()


# An exact model's output vector at most this share of the batch's largest is no answer: a compiled program's
# undefined output (RASP None) is the zero vector but for its attention's leak (measured on every word of length 4:
# at most 2.2e-5 for tracr-dedup, 2.5e-8 for tracr-trend, tracr-neighbour_sum and tracr-pair_lookup, against 1 where
# defined), whose argmax a patched model would otherwise count as a changed answer
UNDEFINED_OUTPUT = 1e-3



def _membership_tied(exact: Side, outputs: torch.Tensor, decisions: torch.Tensor) -> torch.Tensor:
    """Membership bits of an exact label's patched model as 0 / 1, TIED where the accept logit is 0 within 16
    rounding units of the model's dtype (at the size of the batch's largest logit): the bit is then its sign's
    rounding, which a copy in another basis draws otherwise. parity-ln (no confidence layer): swapping k/n at
    position 1 from a word with k = 1 to one with another k leaves no position with i = k, so the logit is
    s = 0 up to rounding: all 348 such pairs of length 6 had |logit| 1e-17 to 6e-17 (the unpatched words' smallest
    is 0.047), and each was "changed" to reject by the residue's sign. Decisions of a decision rule other than
    the kind's standard one are left as they are."""
    if exact.reader.rule is not None or not exact.exact:
        return decisions
    margin = kinds.margin(exact.reader.task, outputs, torch.zeros(0))
    if margin is None or margin.shape != decisions.shape:
        return decisions
    tol = kinds.regression_tolerance(exact.model.cfg.torch_dtype, margin)
    return torch.where(margin.double() <= tol, torch.full_like(decisions.long(), TIED), decisions.long())

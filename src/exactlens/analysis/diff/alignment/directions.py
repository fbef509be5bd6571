"""Known directions of exact labels in the trained side's basis (a self-diff: the label's own dimension, or
carried into a rotated copy's basis)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from exactlens.analysis.diff.alignment.pairs import PairSet
from exactlens.analysis.diff.alignment.variables import HighLevel
from exactlens.analysis.diff.runs import Side
from exactlens.model import ExactTransformer
from exactlens.model.basis import residual_rows
from exactlens.model.labels import label_direction

TRANSPORT_RTOL = 1e-10  # singular values below this (relative) do not count in transported_directions
TRANSPORT_EXACT = 1e-6  # relative misfit above which the trained side is no linear copy of the exact one (float64)
# ... and where either side computes in float32, 100 of its rounding units: a float32 rotated copy against the float64
# exact model misses by 2.9e-6 to 4.1e-6 (tracr-shuffle_dyck, tracr-hist, tracr-sort); a trained model by far more
TRANSPORT_EXACT_FLOAT32 = 100 * torch.finfo(torch.float32).eps


def known_directions(side: Side, variables: list[HighLevel], exact: Side | None = None,
                     train: list[PairSet] | None = None) -> dict[int, torch.Tensor]:
    """Where the trained side is itself an exact construction that names its residual dimensions (a
    self-diff), each exact label's own direction (its dimension; e_L - e_-(L) in a doubled residual,
    :mod:`exactlens.model.labels`): the fit of that label starts from it. An exact construction that names
    none (a copy in a rotated residual basis) gets the exact side's label directions carried into its basis
    (:func:`transported_directions`)."""
    labels = getattr(side.model.cfg, "residual_labels", None) if side.exact else None
    if not labels:
        return transported_directions(variables, exact, train or [], side.model) \
            if side.exact and exact is not None else {}
    return own_directions(variables, list(labels))


def own_directions(variables: list[HighLevel], labels: list[str]) -> dict[int, torch.Tensor]:
    """Per exact variable named by ``labels`` (a label, or a one-hot group whose members all are, or either at one
    position: the label it ``resolves``), its directions [d, r] in that basis: the label's (r = 1) or the
    members' span (r = the group's size, ordered by :func:`group_directions`). A task variable whose name is a label
    (or the name of labels ``name:value``) gets that label's directions too: a compiled program's SOp is both
    (tracr-pair_balance's ``opens_3``: fraction of '(' so far, which words tie to ``closes_6`` (they sum to 1), so
    neither a probe nor a random start told them apart and its fits were illusions where the label's is not)."""
    out = {}
    for i, v in enumerate(variables):
        detail = getattr(v, "detail", {})
        names = detail.get("members", [detail.get("resolves", v.name)])
        if v.origin == "task" and getattr(v, "position_index", None) is None:
            # a task variable the exact model names (a compiled program's SOp: its label, or its one-hot group
            # name:value): the same direction
            grouped = [name for name in labels if name.startswith(f"{v.name}:")]
            names = [v.name] if v.name in labels else grouped
            if not names:
                continue
        elif v.origin != "exact":
            continue
        if all(labels.count(name) == 1 for name in names):
            own = torch.stack([label_direction(labels, name) for name in names], 1)
            out[i] = group_directions(own) if len(names) > 1 else own
    return out


def group_directions(members: torch.Tensor) -> torch.Tensor:
    """[d, m] member directions of a one-hot group -> [d, m] directions of the same span whose first m - 1 span
    the members' differences and whose last is their mean. A DAS fit of k dimensions starts from the first k
    columns: k = m - 1 then swaps the whole value wherever base and source each set one member (their
    difference lies in that span), where the first m - 1 members themselves would miss every pair that involves
    the last (tracr-count_less_freq's hist_2:1..4 at k = 3: 0.81 on 64 changed test units, 1.00 with these)."""
    m = members.shape[1]
    mean = members.mean(1, keepdim=True)
    centred = torch.linalg.svd(members - mean, full_matrices=False)[0][:, :m - 1]
    return torch.cat([centred, mean / mean.norm()], 1) if float(mean.norm()) > 0 else centred


def transported_directions(variables: list[HighLevel], exact: Side, train: list[PairSet], trained: Any = None
                           ) -> dict[int, torch.Tensor]:
    """Each exact label's dimension e_i carried into the trained side's basis by the least-squares
    linear map M from the exact model's vectors to the trained side's (minimum norm): e_i M. The vectors are
    the activations (training base words, every position, the rows of all their common residual sites
    stacked) and, where ``trained`` is an ExactTransformer of the same shapes, both models' weights in the
    residual space (:func:`exactlens.model.basis.residual_rows`: each writer's rows, each reader's columns),
    every vector scaled to unit length on the exact side. For a copy in a rotated basis (x -> x Q) M = Q on
    the span of these vectors, so e_i M = e_i Q wherever e_i lies in it. The activations of a sample alone
    may span less than the labels the model writes: tracr-shuffle_dyck's words of lengths 4 and 6 leave
    'token is (' plus 'token is )' tied to other labels, and e_i M missed e_i Q by 30 degrees there (its fits
    then started off the label and stayed at IIA 0); the weights span every direction the model writes or
    reads. The rows are not centred and the sites are stacked: labels that sum to a constant at a site
    (tracr-hist's one-hot count hist_2:0..5) are told apart by the rows of the site before they are
    written; a probe, which centres, finds only e_i minus their mean, a different patch. Only where M maps
    the exact vectors onto the trained side's exactly (relative misfit <= TRANSPORT_EXACT, or
    TRANSPORT_EXACT_FLOAT32 where a side computes in float32; else the activations alone, under the same
    test): a trained model is no linear image of the exact one, and its fits keep their probe starts."""
    labels = list(getattr(exact.model.cfg, "residual_labels", None) or [])
    wanted = own_directions(variables, labels)
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
    tolerance = TRANSPORT_EXACT if _float64(exact.model, trained) else TRANSPORT_EXACT_FLOAT32
    x, y = _unit_rows(torch.as_tensor(np.concatenate(xs)), torch.as_tensor(np.concatenate(ys)))
    carry = None
    weights = _weight_rows(exact.model, trained)
    if weights is not None:
        carry = _carry(torch.cat([x, weights[0]]), torch.cat([y, weights[1]]), tolerance)
    if carry is None:
        carry = _carry(x, y, tolerance)
    if carry is None:  # not a copy of the exact model in another basis (e.g. a trained model)
        return {}
    out = {}
    for i, own in wanted.items():
        carried = carry.T @ own.to(carry.dtype)  # [d_trained, r]
        if float(carried.norm()) > TRANSPORT_RTOL * max(float(carry.norm()), 1e-300):
            out[i] = torch.linalg.qr(carried)[0] if carried.shape[1] > 1 else carried / carried.norm()
    return out


def _carry(x: torch.Tensor, y: torch.Tensor, tolerance: float) -> torch.Tensor | None:
    """The minimum-norm least-squares M with x M = y (finite rows), or None where it misses (relative misfit above
    ``tolerance``)."""
    keep = torch.isfinite(x).all(1) & torch.isfinite(y).all(1)
    carry = torch.linalg.pinv(x[keep], rtol=TRANSPORT_RTOL) @ y[keep]  # [d_exact, d_trained]
    misfit = float((x[keep] @ carry - y[keep]).norm()) / max(float(y[keep].norm()), 1e-300)
    return carry if misfit <= tolerance else None


def _float64(*models: Any) -> bool:
    """Whether every one of the models that has parameters computes in float64."""
    return all(next(m.parameters()).dtype == torch.float64 for m in models if isinstance(m, torch.nn.Module))


def _unit_rows(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Both divided by the norms of x's rows (rows of x that are zero stay as they are): x M = y is unchanged, and a
    large row no longer hides a small one's misfit."""
    x, y = x.double(), y.double()
    norms = x.norm(dim=1, keepdim=True)
    scale = torch.where(norms > 0, norms, torch.ones_like(norms))
    return x / scale, y / scale


def _weight_rows(exact: Any, trained: Any) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Both models' weights in the residual space, matched by name (:func:`exactlens.model.basis.residual_rows`),
    scaled as :func:`_unit_rows`; None unless both are ExactTransformers whose such weights have the same shapes."""
    if not (isinstance(exact, ExactTransformer) and isinstance(trained, ExactTransformer)):
        return None
    mine, theirs = residual_rows(exact), residual_rows(trained)
    if mine.keys() != theirs.keys() or any(mine[n].shape != theirs[n].shape for n in mine):
        return None
    return _unit_rows(torch.cat(list(mine.values())), torch.cat(list(theirs.values())))

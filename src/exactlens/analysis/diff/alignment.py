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

Fits that share a site and a position set are trained together: the fits (variables x dims) are
stacked along the batch, each row patched with its own Q, so one forward from the site's layer on
serves them all.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from exactlens import tasks
from exactlens.analysis.diff.interventions import _patched_outputs
from exactlens.analysis.diff.runs import LengthRun, Side
from exactlens.devices import device_of
from exactlens.errors import ExactLensError
from exactlens.model import ExactConfig, ExactTransformer
from exactlens.progress import bar
from exactlens.tasks import kinds

DETERMINED = 0.99  # a variable whose counterfactual is the source's own answer on this share of pairs
SITE_KINDS = ("hook_resid_pre", "hook_attn_out", "hook_resid_mid", "hook_mlp_out", "hook_resid_post")
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


@dataclass
class HighLevel:
    """One high-level variable: its name, where it comes from, and its counterfactual answers."""

    name: str
    origin: str  # "task" or "exact"
    scope: str  # "word" or "position"
    counterfactual: Callable[[LengthRun, torch.Tensor, torch.Tensor], torch.Tensor]
    base_answer: Callable[[LengthRun, torch.Tensor], torch.Tensor]
    detail: dict[str, Any] = field(default_factory=dict)


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
        ))
    return out


def exact_variables(exact: Side, features: list[dict[str, Any]]) -> tuple[list[HighLevel], list[dict[str, Any]]]:
    """The exact circuit's computed, non-constant residual labels (from the probe table's features)."""
    out, skipped = [], []
    for feat in features:
        if feat["constant"]:
            skipped.append({"variable": feat["label"], "reason": "constant on these words"})
            continue
        if feat["exact_site"] == exact.sites[0]:
            skipped.append({"variable": feat["label"], "reason": "input feature (set by the embedding)"})
            continue
        index, site, scope = feat["index"], feat["exact_site"], feat["positions"]
        direction = np.zeros(exact.d_model)
        direction[index] = 1.0

        def counterfactual(run: LengthRun, b: torch.Tensor, s: torch.Tensor, site=site, direction=direction,
                           scope=scope) -> torch.Tensor:
            rows = exact.model.readout_rows(run.n_positions)
            positions = np.array([int(rows[0])]) if scope == "readout" and rows is not None else None
            n_pos = run.n_positions[b]
            outputs = _patched_outputs(exact, run.tokens[b], site, direction, run.exact_acts[site][s.numpy()],
                                       positions, n_pos)
            return exact.reader.decide(outputs, n_pos)

        def base_answer(run: LengthRun, b: torch.Tensor) -> torch.Tensor:
            return exact.reader.decide(run.exact_outputs[b], run.n_positions[b])

        out.append(HighLevel(feat["label"], "exact", "position" if scope == "all" else "word", counterfactual,
                             base_answer, {"exact_site": site, "exact_positions": scope}))
    return out, skipped


# ----------------------------------------------------------------------------- pairs and scoring


def make_pairs(runs: list[LengthRun], variables: list[HighLevel], pairs: int, seed: int
               ) -> tuple[list[PairSet], list[PairSet], list[PairSet]]:
    """Per length: ``pairs`` (base, source) pairs of distinct words, split train / validation / test."""
    rng = np.random.default_rng(seed + 7)
    splits: tuple[list[PairSet], list[PairSet], list[PairSet]] = ([], [], [])
    for run in runs:
        count = run.tokens.shape[0]
        if count < 2:
            continue
        base = rng.integers(0, count, size=pairs)
        source = (base + rng.integers(1, count, size=pairs)) % count  # never the base word itself
        cuts = np.cumsum([int(round(f * pairs)) for f in SPLIT[:-1]])
        for part, (lo, hi) in zip(splits, ((0, cuts[0]), (cuts[0], cuts[1]), (cuts[1], pairs)), strict=True):
            if hi <= lo:
                continue
            b, s = torch.as_tensor(base[lo:hi]), torch.as_tensor(source[lo:hi])
            part.append(PairSet(run, b, s, [v.counterfactual(run, b, s) for v in variables],
                                [v.base_answer(run, b) for v in variables]))
    return splits


def units(task: tasks.Task, decisions: torch.Tensor, cf: torch.Tensor, base: torch.Tensor,
          n_positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(right, changed) over the scored units: one per pair, or one per target position of a pair
    for per-position tasks. Regression decisions are decoded to the nearest answer of the batch."""
    if task.kind in ("membership", "classification"):
        return decisions == cf.to(decisions.dtype), cf.to(decisions.dtype) != base.to(decisions.dtype)
    width = cf.shape[1]
    valid = task.target_mask(n_positions - task.n_specials, width)
    decisions = decisions[:, :width]
    if task.kind == "regression":
        values = torch.unique(torch.cat([cf[valid], base[valid]]).double())
        nearest = (decisions.double().unsqueeze(-1) - values).abs().argmin(-1)
        right = values[nearest] == cf.double()
        changed = cf.double() != base.double()
    else:
        right = decisions == cf.long()
        changed = cf.long() != base.long()
    return right[valid], changed[valid]


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

    def outputs(self, base: dict[str, torch.Tensor], source_site: torch.Tensor, projector: torch.Tensor,
                mask: torch.Tensor, n_positions: torch.Tensor) -> torch.Tensor:
        """Task outputs of F stacked copies of the base rows, copy f patched with projector[f]
        ([F, d, d]) towards ``source_site`` at the positions of mask[f] ([F, pos])."""
        repeats, rows = projector.shape[0], source_site.shape[0]
        device = device_of(self.model)  # the patch is computed where the model runs (gradients flow back)
        src = source_site.to(device=device, dtype=self.dtype)
        mask = mask.to(device=device, dtype=self.dtype)
        projector_here = projector.to(device)

        def hook(act: torch.Tensor, hook: Any = None) -> torch.Tensor:
            shaped = act.reshape(repeats, rows, *act.shape[1:])
            delta = (src.unsqueeze(0) - shaped) @ projector_here.unsqueeze(1)
            return (shaped + delta * mask[:, None, :, None]).reshape(act.shape)

        inputs = base["input"].repeat(repeats, *([1] * (base["input"].ndim - 1)))
        n_pos = n_positions.repeat(repeats)
        with self.model.hooks(fwd_hooks=[(self.site, hook)]):
            if not self.side.exact:
                return self.side.outputs(self.model(inputs).cpu(), n_pos)
            # The last layer at the readout position only, unless the site is inside that layer (its
            # activations there would cover the readout row only).
            inside_last = _layer_of(self.site) == self.side.n_layers - 1 and not self.site.endswith("resid_pre")
            fast = self.model.cfg.readout != "per_position" and not inside_last
            logits = self.model(inputs, n_pos, start_at_layer=self.start or None, readout_only=fast)
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


def _group_loss(task: tasks.Task, patcher: Patcher, pset: PairSet, fits: list[Fit], projector: torch.Tensor,
                pick: torch.Tensor, cache: dict) -> torch.Tensor:
    base, source = _acts(patcher, pset, cache)
    base = {k: v[pick] for k, v in base.items()}
    masks = _masks(patcher.side, pset.run, fits)
    outputs = patcher.outputs(base, source[pick], projector, masks, pset.run.n_positions[pset.base[pick]])
    targets = torch.cat([pset.cf[f.variable][pick] for f in fits])
    n_pos = pset.run.n_positions[pset.base[pick]].repeat(len(fits))
    return kinds.loss(task, patcher.side.reader.evidence(outputs, n_pos), targets, n_pos).sum() / len(pick)


def _acts(patcher: Patcher, pset: PairSet, cache: dict) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    key = id(pset)
    if key not in cache:
        cache[key] = (patcher.prepare(pset.run, pset.base), patcher.prepare(pset.run, pset.source)["site"])
    return cache[key]


def fit_group(task: tasks.Task, side: Side, site: str, fits: list[Fit], train: list[PairSet],
              settings: Settings, generator: torch.Generator) -> torch.Tensor:
    """Fit one subspace per fit (all at one site, trained together); returns the projectors [F, d, d]."""
    patcher = Patcher(side, site)
    d = side.d_model
    dtype = patcher.dtype
    kmax = max(f.dim for f in fits)
    dims = torch.tensor([f.dim for f in fits])
    weights = torch.randn(len(fits), d, kmax, generator=generator, dtype=dtype).requires_grad_(True)
    optimizer = torch.optim.Adam([weights], lr=settings.lr)
    cache: dict = {}
    frozen = [p for p in side.model.parameters() if p.requires_grad]
    for p in frozen:
        p.requires_grad_(False)
    usable = [p for p in train if len(p.base)]
    try:
        with torch.enable_grad():
            for step in range(settings.steps):
                pset = usable[step % len(usable)]
                pick = torch.randperm(len(pset.base), generator=generator)[: settings.batch]
                loss = _group_loss(task, patcher, pset, fits, _orthonormal(weights, dims), pick, cache)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
    finally:
        for p in frozen:
            p.requires_grad_(True)
    with torch.no_grad():
        return _orthonormal(weights.detach(), dims)


@torch.no_grad()
def score_group(task: tasks.Task, side: Side, site: str, fits: list[Fit], psets: list[PairSet],
                projector: torch.Tensor) -> list[dict[str, Any]]:
    """IIA of each fit's projector on pair sets: iia, iia_changed, units, changed units."""
    patcher = Patcher(side, site)
    right = [[] for _ in fits]
    changed = [[] for _ in fits]
    cache: dict = {}
    for pset in psets:
        if not len(pset.base):
            continue
        base, source = _acts(patcher, pset, cache)
        n_pos = pset.run.n_positions[pset.base]
        outputs = patcher.outputs(base, source, projector.to(patcher.dtype), _masks(side, pset.run, fits), n_pos)
        decisions = side.reader.decide(outputs, n_pos.repeat(len(fits)))
        decisions = decisions.reshape(len(fits), len(pset.base), *decisions.shape[1:])
        for f, fit in enumerate(fits):
            r, c = units(task, decisions[f], pset.cf[fit.variable], pset.base_answers[fit.variable], n_pos)
            right[f].append(r)
            changed[f].append(c)
    out = []
    for f in range(len(fits)):
        r, c = torch.cat(right[f]), torch.cat(changed[f])
        out.append({
            "units": int(r.numel()),
            "changed_units": int(c.sum()),
            "iia": float(r.double().mean()) if r.numel() else None,
            "iia_changed": float(r[c].double().mean()) if int(c.sum()) else None,
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
) -> dict[str, Any]:
    """The ``alignment`` rows of the diff JSON and their summary (see the module docstring)."""
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
    train, val, test = make_pairs(runs, variables, settings.pairs, settings.seed)
    if not variables or not train:
        return {"rows": [], "skipped": skipped, "sites": [], "settings": _settings(settings, trained)}
    sites = alignment_sites(trained)
    per_position = task.readout == "per_position"
    gen = torch.Generator().manual_seed(settings.seed)
    max_dim = min(settings.max_dim, trained.d_model)
    determined = [source_determined(task, train, i) for i in range(len(variables))]
    cells = [(i, positions_of(v, determined[i], per_position)) for i, v in enumerate(variables)]
    rows: list[dict[str, Any]] = []
    for g, site in enumerate(bar(sites, desc="DAS sites", unit="site")):
        fits = [Fit(i, k, pos) for i, pos in cells for k in range(1, max_dim + 1)]
        projector = fit_group(task, trained, site, fits, train, settings, gen)
        val_scores = score_group(task, trained, site, fits, val, projector)
        chosen = []
        for i, pos in cells:
            index = {f.dim: j for j, f in enumerate(fits) if (f.variable, f.positions) == (i, pos)}
            by_dim = {k: val_scores[j]["iia"] for k, j in index.items()}
            chosen.append((choose_dim(by_dim), by_dim, index))
        picked_index = [c[2][c[0]] for c in chosen]
        picked = [fits[j] for j in picked_index]
        proj = projector[picked_index]
        test_scores = score_group(task, trained, site, picked, test, proj)
        rand = random_projectors([f.dim for f in picked], trained.d_model, gen, proj.dtype)
        rand_scores = score_group(task, trained, site, picked, test, rand)
        if untrained is not None:
            u_proj = fit_group(task, untrained, site, picked, train, settings, gen)
            u_scores = score_group(task, untrained, site, picked, test, u_proj)
        for n, ((i, pos), (dim, by_dim, _)) in enumerate(zip(cells, chosen, strict=True)):
            v = variables[i]
            scores = test_scores[n]
            rows.append({
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
                "random_iia_changed": rand_scores[n]["iia_changed"],
                "untrained_iia_changed": u_scores[n]["iia_changed"] if untrained is not None else None,
                "validation_iia_by_dim": {str(k): val for k, val in by_dim.items()},
            })
        if progress is not None:
            progress(g + 1, len(sites))
    return {"rows": rows, "skipped": skipped, "sites": sites, "variables": _describe(variables, determined),
            "settings": _settings(settings, trained), **summarize(rows, variables)}


def source_determined(task: tasks.Task, train: list[PairSet], i: int) -> float:
    """Share of units whose counterfactual answer is the source word's own answer."""
    same = []
    for pset in train:
        if not len(pset.base):
            continue
        cf = pset.cf[i]
        own = pset.run.truth[pset.source]
        if task.kind in ("membership", "classification"):
            same.append((cf.long() == own.long()).reshape(-1))
        else:
            valid = task.target_mask(pset.run.n_positions[pset.base] - task.n_specials, cf.shape[1])
            same.append((cf.double() == own.double())[valid])
    joined = torch.cat(same) if same else torch.zeros(0, dtype=torch.bool)
    return float(joined.double().mean()) if joined.numel() else 0.0


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


def summarize(rows: list[dict[str, Any]], variables: list[HighLevel]) -> dict[str, Any]:
    """Per variable, its best row (highest iia_changed); the means over variables."""
    best: dict[str, dict[str, Any]] = {}
    for row in rows:
        if row["iia_changed"] is None:
            continue
        key = f"{row['origin']}:{row['variable']}"
        if key not in best or row["iia_changed"] > best[key]["iia_changed"]:
            best[key] = row

    def mean(values: list[float | None]) -> float | None:
        kept = [v for v in values if v is not None]
        return float(np.mean(kept)) if kept else None

    task_best = [r for r in best.values() if r["origin"] == "task"]
    return {
        "best": [{k: r[k] for k in ("variable", "origin", "site", "position", "dim", "iia_changed",
                                   "random_iia_changed", "untrained_iia_changed")} for r in best.values()],
        "mean_das_iia_changed": mean([r["iia_changed"] for r in best.values()]),
        "mean_random_iia_changed": mean([r["random_iia_changed"] for r in best.values()]),
        "mean_untrained_iia_changed": mean([r["untrained_iia_changed"] for r in best.values()]),
        "mean_das_iia_changed_task": mean([r["iia_changed"] for r in task_best]),
    }

"""Strict interchange intervention training (``exactlens train NAME --siit``; ``train(..., siit=True)``).

IIT (Geiger et al. 2022, "Inducing causal structure for interpretable neural networks") trains a network
so that an interchange intervention on the site aligned with a high-level variable changes its output
as the same intervention changes the high-level model's. SIIT (Gupta et al. 2024, InterpBench) adds
strictness: resampling any component *not* aligned with a variable must leave the output unchanged.
Here the high-level model is the exact construction the trained model is shaped like, its variables
are the diff's (exactlens.analysis.diff.alignment.variables.exact_variables, provided from the layer above:
exactlens.analysis.diff.siit_side) and the alignment is
exactlens.train.siit_map's. Each training step adds, through the preset's ``penalty`` hook of the one
training loop (exactlens.train.loop), on a batch of (base, source) pairs of words of one length:

* IIT loss (weight ``siit_iit_weight``): the step's pairs are spread over the mapped variables
  (``siit_iit_variables`` of them drawn per step, default 1; 0: all), each pair swapping its own: the
  trained model runs on the base with that variable's subspace at its hook replaced by the source's
  activations there (one forward pass for all of them, each hook patched on its variables' rows), and is
  trained (the task kind's loss) to give the exact model's counterfactual answer (``HighLevel.
  counterfactual``: the exact model with the variable's residual coordinates swapped). One variable per
  step trains majority's 21 variables about 29 steps each in 600; all of them per step trained FIRST's seed 0
  with its last FFN carrying the answer (resampling it moved 57 % of the decisions; seed 1 and one variable
  per step: 0 %), so the default stays one. ``siit_effective`` (default 0) draws that share of each variable's
  rows from its effective pairs (``effective_pairs``: the swap changes the exact answer), without which
  majority's swaps of one fraction of 20 mostly teach nothing (docs/siit.md "Effective pairs");
* strictness loss (weight ``siit_strict_weight``): every unmapped component output (a whole
  ``hook_attn_out``/``hook_mlp_out``, or the part of a mapped one outside its variables' subspaces and
  positions) is resample-ablated with probability 1/2 (at least one per step) and the output is trained
  to stay the base word's task answer. A component of the exact circuit (exactlens.analysis.circuit.truth)
  to which no variable is mapped is left alone: it computes something the circuit needs that is no
  variable of the program (tracr's selector-width attention, whose output its MLP reads and then
  overwrites: an inside of the compiled primitive, not mapped; mapped, tracr-hist's reached interchange
  accuracy 0.08 in 300 epochs), so resampling it would forbid the task; run.json lists such components
  (``in_circuit_unmapped``). So is the last layer's FFN where
  the construction reads its outputs with its own decision rule (Dyck's "b = 0 and E = 0"): the trained
  model's standard linear readout has no such rule, and that FFN is where it can compute it.

The task loss is the loop's own (weight 1, the reference of the two weights). Source activations come
from the same forward pass (base and source words stacked in one batch), detached, so a step costs two
extra passes of 2x the pair batch. All runs of ``train_many`` share the pairs of a step. Pairs are
drawn once per fit (exactlens.analysis.diff.alignment.pairs.make_pairs: word-disjoint train and held-out
test pairs); the held-out pairs give the run's measured interchange accuracy and strictness (run.json
``siit``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from exactlens import tasks
from exactlens.constructions import registry as constructions
from exactlens.errors import ExactLensError
from exactlens.lazy import provided
from exactlens.tasks import kinds
from exactlens.train.siit_map import check_map, component_hooks, derive_map, read_map

WORDS_PER_LENGTH = 256  # words per length the pairs are drawn from (every word where there are fewer)
PAIRS_PER_LENGTH = 600  # (base, source) pairs per length, split 60/20/20 train / validation / test
PAIR_SEED = 12345  # the pairs are fixed per construction and lengths, not per training seed
OVERWRITTEN = ("read and then overwritten by a later component (the inside of a compiled primitive, e.g. tracr's "
               "selector width): not mapped, its component left alone")
STRICT_P = 0.5  # chance that each unmapped component is resampled in a step
REGRESSION_TOLERANCE = 0.1  # regression: answers within 0.1 x the answers' RMS count as the same (measure)


def construction_of(spec: Any) -> tuple[str, dict[str, Any]]:
    """The exact construction a spec's model is shaped like (shaped presets record it; a paper preset
    of a construction's name is shaped like it)."""
    shape = spec.config.metadata.get("shape") or {}
    if shape.get("construction"):
        return shape["construction"], dict(shape.get("construction_params") or {})
    if spec.name in constructions.names():
        return spec.name, {}
    raise ExactLensError(f"siit: {spec.name!r} is not shaped like an exact construction; SIIT trains against one "
                         f"(exactlens list)")


@dataclass
class Circuit:
    """The high-level side of SIIT: the exact model, its mapped variables, the mapping and the pairs."""

    construction: str
    params: dict[str, Any]
    task: tasks.Task
    exact: Any  # exactlens.analysis.diff.runs.Side
    variables: list[Any]  # HighLevel, in the mapping's order
    mapping: dict[str, dict[str, Any]]
    train_pairs: list[Any]  # PairSet
    test_pairs: list[Any]
    components: list[str]  # every component output of the trained model
    skipped: list[dict[str, Any]]
    held_out: bool = True  # the test pairs share no word with the training pairs (too few words: False)
    edges: dict[str, Any] = dataclasses.field(default_factory=dict)  # the exact circuit (exactlens circuit)
    # components of the exact circuit to which no variable is mapped: neither trained by IIT nor resampled
    kept: list[str] = dataclasses.field(default_factory=list)


def high_level(spec: Any, user_map: Any = None) -> Circuit:
    """The exact side, its variables (checked against the user's mapping, else mapped by siit_map's rule),
    and the pairs of the training lengths."""
    side = provided("siit_side")  # the analysis layer's pieces, provided from above (exactlens.analysis.diff.siit_side)
    make_pairs, exact_variables, feature_scopes, probe_table = (side.make_pairs, side.exact_variables,
                                                                side.feature_scopes, side.probe_table)
    make_side, run_exact, with_trained = side.make_side, side.run_exact, side.with_trained

    name, params = construction_of(spec)
    construction = constructions.get(name)
    model = construction.make(dtype="float64", **params).eval()
    task = tasks.of_model(model)
    if task != spec.task:
        raise ExactLensError(f"siit: the construction {name!r} answers {task.name}, the run trains {spec.task.name}")
    exact = make_side(model, {"name": name}, tasks.reader(model), model.cfg.readout_position, True)
    lo, hi = spec.options["train_length"]
    lengths = []
    for length in range(lo, hi + 1):
        try:
            construction.check_length(length, model)
        except ExactLensError:
            continue
        lengths.append(length)
    if not lengths:
        raise ExactLensError(f"siit: no training length in {lo}..{hi} is one the construction {name!r} answers")
    runs = with_trained(run_exact(task, lengths, WORDS_PER_LENGTH, PAIR_SEED, exact), exact)
    labels = [model.residual_label(i) for i in range(exact.d_model)]
    table, _ = probe_table(runs, exact, exact, labels, feature_scopes(model, labels), 0.2, PAIR_SEED)
    features = [f for f in table["features"] if not f.get("overwritten")]
    variables, skipped = exact_variables(exact, features, runs)
    skipped += [{"variable": f["label"], "reason": OVERWRITTEN} for f in table["features"] if f.get("overwritten")]
    if not variables:
        raise ExactLensError(f"siit: the construction {name!r} computes no variable to map on lengths {lengths}")
    cfg = spec.config
    has_mlp = cfg.d_mlp > 0
    dims = {v.name: len(v.detail.get("members", [v.name])) for v in variables}
    sites = {v.name: v.detail["exact_site"] for v in variables}
    if user_map is None and cfg.n_layers != model.cfg.n_layers:
        raise ExactLensError(f"siit: the trained model has {cfg.n_layers} layers, the construction {name!r} "
                             f"{model.cfg.n_layers}; the mapping is derived for the construction's layers: give "
                             "siit_map")
    if user_map is None:
        mapping = derive_map([(v.name, sites[v.name], v.detail["exact_positions"], dims[v.name]) for v in variables],
                             cfg.d_model, has_mlp)
    else:
        mapping = read_map(user_map)
    mapping = check_map(mapping, dims, cfg.n_layers, has_mlp, cfg.d_model, sites)
    mapped = [v for v in variables if v.name in mapping]
    notes: dict[str, Any] = {}
    train, _, test = make_pairs(runs, mapped, PAIRS_PER_LENGTH, PAIR_SEED, notes)
    edges = _exact_circuit(model)
    components = component_hooks(cfg.n_layers, has_mlp)
    hooks = {site["hook"] for site in mapping.values()}
    kept = [c for c in components if c not in hooks and _node_of(c, edges.get("circuit_nodes", []))]
    last_mlp = f"blocks.{cfg.n_layers - 1}.hook_mlp_out"
    if model.cfg.decision_rule and has_mlp and last_mlp not in hooks and last_mlp not in kept:
        kept.append(last_mlp)  # it computes the construction's decision rule (module docstring)
    return Circuit(name, params, task, exact, mapped, mapping, train, test or train, components, skipped,
                   held_out=bool(test) and notes["word_disjoint"], edges=edges, kept=kept)


def _exact_circuit(model: Any) -> dict[str, Any]:
    """The construction's ground-truth circuit at head granularity, as ``exactlens circuit --out`` writes it."""
    try:
        return provided("siit_side").derive_circuit(model, "head").to_dict()
    except ExactLensError as err:  # a model the circuit reader does not take: say so, keep the sites
        return {"error": str(err)}


def _node_of(hook: str, nodes: list[str]) -> bool:
    """Whether component output ``hook`` (blocks.L.hook_attn_out / hook_mlp_out) is a node of the circuit
    (its nodes: L{l}.H{h}, L{l}.MLP)."""
    layer, _, component = hook.removeprefix("blocks.").partition(".")
    prefix = f"L{layer}.H" if component == "hook_attn_out" else f"L{layer}.MLP"
    return any(n == prefix or (n.startswith(prefix) and prefix.endswith(".H")) for n in nodes)


def ground_truth(circuit: Circuit) -> dict[str, Any]:
    """What the run records (run.json ``siit``; the checkpoint's config metadata): the construction, the
    variable sites and the exact circuit's edges (node names are the trained model's too, since it has the
    construction's layers and heads), the components strictness resamples and those it leaves alone."""
    hooks = {site["hook"] for site in circuit.mapping.values()}
    return {"construction": circuit.construction, "construction_params": circuit.params,
            "mapping": circuit.mapping, "circuit": circuit.edges,
            "unmapped_components": [c for c in circuit.components if c not in hooks and c not in circuit.kept],
            "in_circuit_unmapped": circuit.kept}


# ---- the trained model's forward with interventions -------------------------------------------------------


class _Forward:
    """The trained model's readout on stacked parameters (name -> [R, ...]) with forward hooks, the same
    computation as the loop's (exactlens.model.stacked), on a template model of the spec's config."""

    def __init__(self, spec: Any):
        from exactlens.model import ExactConfig, ExactTransformer
        from exactlens.model.stacked import _Run

        self.model = ExactTransformer(ExactConfig.from_dict(spec.config.to_dict()))
        if spec.prepare is not None:  # the buffers a preset sets (functional_call replaces parameters only)
            spec.prepare(self.model, spec.options)
        self.run = _Run(self.model)

    def __call__(self, params: dict[str, torch.Tensor], tokens: torch.Tensor, n_positions: torch.Tensor,
                 hooks: list[tuple[str, Any]]) -> torch.Tensor:
        first = next(iter(params.values()))
        if next(self.model.parameters()).device != first.device:
            self.model.to(first.device)
        n_positions, padded = self.model._check_input(tokens, n_positions)
        weights = {f"m.{name}": value for name, value in params.items()}

        def one(p: dict[str, torch.Tensor]) -> torch.Tensor:
            return torch.func.functional_call(self.run, p, (tokens, n_positions, padded, False))

        with self.model.hooks(fwd_hooks=hooks):
            if first.shape[0] == 1:
                return one({k: v[0] for k, v in weights.items()})[None]
            return torch.vmap(one)(weights)


def _resample(mask: torch.Tensor) -> Any:
    """A hook: the base rows' activations replaced by the source rows' where ``mask`` [B, pos, d] is set
    (bases are the first B rows of the batch, their sources the next B)."""
    def hook(x: torch.Tensor, hook: Any) -> torch.Tensor:
        n = mask.shape[0]
        return torch.cat([torch.where(mask, x[n:].detach(), x[:n]), x[n:]])

    return hook


def _position_mask(model: Any, positions: str, n_positions: torch.Tensor, width: int) -> torch.Tensor:
    """[B, pos] bool: every position, or each word's readout position."""
    rows = model.readout_rows(n_positions) if positions == "readout" else None
    if rows is None:
        return torch.ones(len(n_positions), width, dtype=torch.bool)
    return torch.arange(width)[None] == rows[:, None]


def site_mask(model: Any, site: dict[str, Any], n_positions: torch.Tensor, width: int, d_model: int) -> torch.Tensor:
    """[B, pos, d_model] bool: a mapped variable's coordinates at its positions."""
    dims = torch.zeros(d_model, dtype=torch.bool)
    dims[site["dims"]] = True
    return _position_mask(model, site["positions"], n_positions, width)[:, :, None] & dims


def unmapped_masks(circuit: Circuit, model: Any, n_positions: torch.Tensor, width: int, d_model: int
                   ) -> dict[str, torch.Tensor]:
    """Per component output, the part no variable is mapped to (the whole output where none is); components
    wholly mapped, and those of the exact circuit that no variable is mapped to (``Circuit.kept``), are left
    out."""
    out = {}
    for hook in circuit.components:
        if hook in circuit.kept:
            continue
        mapped = torch.zeros(len(n_positions), width, d_model, dtype=torch.bool)
        for site in circuit.mapping.values():
            if site["hook"] == hook:
                mapped |= site_mask(model, site, n_positions, width, d_model)
        if not bool(mapped.all()):
            out[hook] = ~mapped
    return out


def assign_variables(rng: np.random.Generator, count: int, n: int, per_step: int) -> torch.Tensor:
    """[n]: the variable (an index below ``count``) each of a step's n pairs swaps: ``per_step`` variables drawn
    (0: all), spread evenly over the pairs in a random order (each gets n / per_step of them, within one; with
    fewer pairs than variables, n of them)."""
    chosen = rng.permutation(count)[:per_step or count]
    return torch.as_tensor(rng.permutation(np.resize(chosen, n)))


def iit_masks(circuit: Circuit, model: Any, assign: torch.Tensor, n_positions: torch.Tensor, width: int,
              d_model: int) -> dict[str, torch.Tensor]:
    """Per hook, [B, pos, d_model] bool: the coordinates each base row swaps, its own variable's
    (``assign[r]``, an index into ``circuit.variables``) at that variable's hook; one forward pass then
    trains several variables, each on its rows."""
    out: dict[str, torch.Tensor] = {}
    for v in sorted(set(assign.tolist())):
        site = circuit.mapping[circuit.variables[v].name]
        mask = site_mask(model, site, n_positions, width, d_model) & (assign == v)[:, None, None]
        out[site["hook"]] = out[site["hook"]] | mask if site["hook"] in out else mask
    return out


def _targets_kept(task: tasks.Task, cf: torch.Tensor, n_positions: torch.Tensor) -> torch.Tensor:
    """Rows with an answer: one answer per word, where the exact model's counterfactual is no tie
    (variables.TIED); per position, where at least one target position has a counterfactual answer. A
    position without one (a tie, or a compiled program's RASP None: undefined where the base word's answer
    is, ``PairSet``, or made undefined by the swap) is no target of the row; the losses and ``measure`` leave
    it out (``task.target_mask`` given ``cf``). Before, such a position dropped the whole row, so the
    programs undefined at one position of every word (tracr-trend's last, tracr-neighbour_sum's first) had
    no pair at all."""
    if task.kind in ("membership", "classification"):
        return cf != provided("siit_side").TIED
    return kinds.valid_targets(task, n_positions.to(cf.device), cf.shape[1], cf).any(1)


def _run_loss(task: tasks.Task, outputs: torch.Tensor, targets: torch.Tensor, n_positions: torch.Tensor
              ) -> torch.Tensor:
    """Per-run mean loss [R] of outputs [R, B, ...] against the same targets for every run."""
    runs = outputs.shape[0]
    repeat = (runs,) + (1,) * (targets.ndim - 1)
    losses = kinds.loss(task, outputs.flatten(0, 1), targets.repeat(repeat), n_positions.repeat(runs))
    return losses.view(runs, -1).mean(1)


@dataclass
class _Batch:
    tokens: torch.Tensor  # [2B, pos]: bases then sources
    n_positions: torch.Tensor  # [2B]
    pairs: Any  # the PairSet
    rows: torch.Tensor  # the pairs' indices in it

    @property
    def size(self) -> int:
        return len(self.rows)


def _batch(pairs: Any, rows: torch.Tensor, device: Any) -> _Batch:
    run = pairs.run
    b, s = pairs.base[rows], pairs.source[rows]
    tokens = torch.cat([run.tokens[b], run.tokens[s]]).to(device)
    return _Batch(tokens, torch.cat([run.n_positions[b], run.n_positions[s]]).to(device), pairs, rows)


def effective_pairs(task: tasks.Task, pairs: Any, pair_sets: list[Any]) -> list[torch.Tensor]:
    """Per variable, the indices of ``pairs`` whose swap changes the exact model's answer (the counterfactual
    differs from the base answer, ties left out): the diff's effective pairs (exactlens.analysis.diff.alignment.
    designed), found among the drawn pairs."""
    same = provided("siit_side").same_decisions
    tol = regression_tolerance(task, pair_sets)
    n_base = pairs.run.n_positions[pairs.base]
    return [torch.nonzero(~same(task, cf, base, n_base, tol, truth=cf) & _targets_kept(task, cf, n_base)).flatten()
            for cf, base in zip(pairs.cf, pairs.base_answers, strict=True)]


def effective_rows(rng: np.random.Generator, rows: torch.Tensor, assign: torch.Tensor,
                   effective: list[torch.Tensor], share: float) -> torch.Tensor:
    """``rows`` with about ``share`` of each variable's rows (``assign``) replaced by pairs drawn at random from
    that variable's effective ones (``effective``; a variable with none keeps its rows)."""
    rows = rows.clone()
    swap = torch.as_tensor(rng.random(len(rows)) < share)
    for v in sorted(set(assign[swap].tolist())):
        pool = effective[v]
        if len(pool):
            at = torch.nonzero(swap & (assign == v)).flatten()
            rows[at] = pool[torch.as_tensor(rng.integers(len(pool), size=len(at)))]
    return rows


class SIITLoss:
    """The IIT and strictness losses of one fit (module docstring), as a ``penalty(params, opts) -> [R]``."""

    def __init__(self, spec: Any, circuit: Circuit, previous: Any = None):
        self.spec, self.circuit, self.previous = spec, circuit, previous
        self.forward = _Forward(spec)
        self.rng = np.random.default_rng(PAIR_SEED)
        # each set drawn as often as it has base words with a target: a set of words that have none (tracr-trend's
        # length 1, whose one position is undefined) has no loss to give, and drawing it made a step train nothing
        sizes = np.array([float(_targets_kept(circuit.task, p.run.truth[p.base], p.run.n_positions[p.base]).sum())
                          for p in circuit.train_pairs])
        if not sizes.sum():
            raise ExactLensError(f"siit: {spec.name!r} has no training pair whose base word has a target (every "
                                 "position undefined at these lengths); train at longer lengths")
        self.weights = sizes / sizes.sum()
        self.effective = [effective_pairs(circuit.task, p, circuit.train_pairs) for p in circuit.train_pairs]

    def __call__(self, params: dict[str, torch.Tensor], opts: dict[str, Any]) -> torch.Tensor:
        total = self.previous(params, opts) if self.previous is not None else 0.0
        circuit, task = self.circuit, self.circuit.task
        device = next(iter(params.values())).device
        which = int(self.rng.choice(len(circuit.train_pairs), p=self.weights))
        pairs = circuit.train_pairs[which]
        rows = torch.as_tensor(self.rng.choice(len(pairs.base), size=min(opts["siit_pairs"], len(pairs.base)),
                                               replace=False))
        assign = None
        if opts["siit_iit_weight"]:
            assign = assign_variables(self.rng, len(circuit.variables), len(rows), opts["siit_iit_variables"])
            if opts["siit_effective"]:
                rows = effective_rows(self.rng, rows, assign, self.effective[which], opts["siit_effective"])
        batch = _batch(pairs, rows, device)
        n_base = batch.n_positions[:batch.size]
        width, d_model = batch.tokens.shape[1], self.spec.config.d_model
        # IIT: the step's variables, each swapped from the source on its own share of the pairs; the exact
        # model's counterfactual answer of that swap
        if assign is not None:
            every = torch.stack([pairs.cf[v][rows] for v in range(len(circuit.variables))])
            cf = every[assign, torch.arange(batch.size)]  # each pair's own variable's counterfactual
            keep = _targets_kept(task, cf, n_base.cpu())
            if bool(keep.any()):
                hooks = [(hook, _resample(mask.to(device)))
                         for hook, mask in iit_masks(circuit, self.forward.model, assign, n_base.cpu(), width,
                                                     d_model).items()]
                out = self.forward(params, batch.tokens, batch.n_positions, hooks)
                keep = keep.to(device)
                total = total + opts["siit_iit_weight"] * _run_loss(task, out[:, :batch.size][:, keep],
                                                                    cf.to(device)[keep], n_base[keep])
        # strictness: a random set of the unmapped parts resampled; the answer stays the base word's
        if opts["siit_strict_weight"]:
            masks = unmapped_masks(circuit, self.forward.model, n_base.cpu(), width, d_model)
            chosen = [h for h in masks if self.rng.random() < STRICT_P]
            if masks and not chosen:
                chosen = [list(masks)[int(self.rng.integers(len(masks)))]]
            hooks = [(h, _resample(masks[h].to(device))) for h in chosen]
            if hooks:
                out = self.forward(params, batch.tokens, batch.n_positions, hooks)
                truth = pairs.run.truth[pairs.base[rows]]
                has = _targets_kept(task, truth, n_base.cpu()).to(device)  # a word without a target: no loss
                if bool(has.any()):
                    total = total + opts["siit_strict_weight"] * _run_loss(task, out[:, :batch.size][:, has],
                                                                           truth.to(device)[has], n_base[has])
        return total


def with_siit(spec: Any) -> Any:
    """The spec with SIIT's losses added to its preset's penalty and the mapping recorded in its config's
    metadata (so the checkpoint carries it)."""
    if spec.options["optimizer"] != "adam":
        raise ExactLensError("siit draws fresh pairs at every step, which LBFGS's line search cannot take; use "
                             "optimizer 'adam'")
    circuit = high_level(spec, spec.options["siit_map"])
    loss = SIITLoss(spec, circuit, spec.preset.penalty)
    preset = dataclasses.replace(spec.preset, penalty=loss)
    spec.config.metadata["siit"] = ground_truth(circuit)
    return dataclasses.replace(spec, preset=preset)


def siit_loss_of(spec: Any) -> SIITLoss | None:
    penalty = spec.preset.penalty
    return penalty if isinstance(penalty, SIITLoss) else None


# ---- measured on held-out pairs ----------------------------------------------------------------------------


@torch.no_grad()
def measure(loss: SIITLoss, model: Any) -> dict[str, Any]:
    """On the held-out pairs: each mapped variable's interchange accuracy (all pairs; pairs whose
    counterfactual differs from the base answer) and, per unmapped part of each component output, the
    share of words whose decision changes when it alone is resampled (strictness: 0 is strict)."""
    same_decisions = provided("siit_side").same_decisions
    circuit, task = loss.circuit, loss.circuit.task
    device = next(model.parameters()).device
    params = {name: p.detach()[None] for name, p in model.named_parameters()}
    right = {v.name: [0, 0, 0, 0] for v in circuit.variables}  # right, counted, right changed, changed
    tol = regression_tolerance(task, circuit.test_pairs)
    changed: dict[str, list[int]] = {}
    for pairs in circuit.test_pairs:
        batch = _batch(pairs, torch.arange(len(pairs.base)), device)
        n, n_base = batch.size, batch.n_positions[:batch.size]
        width, d_model = batch.tokens.shape[1], model.cfg.d_model

        def outputs(hooks: list[tuple[str, Any]], batch: _Batch = batch) -> torch.Tensor:
            return loss.forward(params, batch.tokens, batch.n_positions, hooks)[0, :batch.size]

        def decide(hooks: list[tuple[str, Any]], batch: _Batch = batch) -> torch.Tensor:
            return kinds.decide(task, outputs(hooks), batch.n_positions[:batch.size]).cpu()

        plain_out = outputs([])
        truth = pairs.run.truth[pairs.base]  # the base words' targets: an undefined position is no decision
        defined = _targets_kept(task, truth, n_base.cpu())  # and a word without any target is no word measured
        plain = kinds.decide(task, plain_out, n_base).cpu()
        for v, variable in enumerate(circuit.variables):
            mask = site_mask(loss.forward.model, circuit.mapping[variable.name], n_base.cpu(), width, d_model)
            got = decide([(circuit.mapping[variable.name]["hook"], _resample(mask.to(device)))])
            cf, keep = pairs.cf[v], _targets_kept(task, pairs.cf[v], n_base.cpu())
            ok = same_decisions(task, got, cf, n_base.cpu(), tol, truth=cf) & keep
            moved = ~same_decisions(task, cf, pairs.base_answers[v], n_base.cpu(), tol, truth=cf) & keep
            counts = right[variable.name]
            counts[0] += int(ok.sum())
            counts[1] += int(keep.sum())
            counts[2] += int((ok & moved).sum())
            counts[3] += int(moved.sum())
        masks = unmapped_masks(circuit, loss.forward.model, n_base.cpu(), width, d_model)
        masks.update({hook: torch.ones(n, width, d_model, dtype=torch.bool) for hook in circuit.kept})
        for hook, mask in masks.items():
            got_out = outputs([(hook, _resample(mask.to(device)))])
            got = kinds.decide(task, got_out, n_base).cpu()
            count = changed.setdefault(hook, [0, 0, 0.0])
            count[0] += int((~same_decisions(task, got, plain, n_base.cpu(), tol, truth=truth) & defined).sum())
            count[1] += int(defined.sum())
            count[2] += float(output_change(task, plain_out, got_out, n_base, truth=truth)[defined].sum())
    iia = {name: {"iia": c[0] / c[1] if c[1] else None, "iia_changed": c[2] / c[3] if c[3] else None,
                  "pairs": c[1], "changed_pairs": c[3]} for name, c in right.items()}
    measured = {hook: c for hook, c in changed.items() if c[1]}  # none where no held-out word has a target
    strict = {hook: c[0] / c[1] for hook, c in measured.items() if hook not in circuit.kept}
    output = {hook: c[2] / c[1] for hook, c in measured.items() if hook not in circuit.kept}
    kept = {hook: {"decision_change": c[0] / c[1], "output_change": c[2] / c[1]}
            for hook, c in measured.items() if hook in circuit.kept}
    return {"held_out_pairs": sum(len(p.base) for p in circuit.test_pairs), "word_disjoint": circuit.held_out,
            "regression_tolerance": tol if task.kind == "regression" else None, "interchange": iia,
            "resample_decision_change": strict,
            "max_resample_decision_change": max(strict.values(), default=None),
            "resample_output_change": output,
            "max_resample_output_change": max(output.values(), default=None),
            "in_circuit_unmapped_resampled": kept}


def regression_tolerance(task: tasks.Task, pair_sets: list[Any]) -> float:
    """How close two answers of a regression task must be to count as the same (0 for discrete answers):
    REGRESSION_TOLERANCE times the root mean square of the held-out base words' answers."""
    if task.kind != "regression":
        return 0.0
    values = torch.cat([p.run.truth[p.base].double().flatten() for p in pair_sets])
    values = values[values.isfinite()]
    return REGRESSION_TOLERANCE * float(values.pow(2).mean().sqrt()) if values.numel() else 0.0


def output_change(task: tasks.Task, a: torch.Tensor, b: torch.Tensor, n_positions: torch.Tensor,
                  truth: torch.Tensor | None = None) -> torch.Tensor:
    """[B]: how far each word's answer distribution moves from outputs ``a`` to ``b``: the total variation
    distance (membership: |sigmoid(a) - sigmoid(b)|; classes: half the L1 distance of the softmaxes; per
    position: its mean over the word's target positions, those ``truth`` leaves undefined left out;
    regression: the mean absolute difference)."""
    kind = task.kind
    if kind == "membership":
        def p(x: torch.Tensor) -> torch.Tensor:  # sigmoid of the signed logit (margin |logit|, sign: decision)
            return torch.sigmoid(kinds.margin(task, x, n_positions) * (2.0 * kinds.decide(task, x, n_positions) - 1))

        return (p(a) - p(b)).abs().cpu()
    if kind == "classification":
        return 0.5 * (a.softmax(-1) - b.softmax(-1)).abs().sum(-1).cpu()
    pa, pb = kinds.symbol_outputs(task, a), kinds.symbol_outputs(task, b)
    valid = kinds.valid_targets(task, n_positions, pa.shape[1], None if truth is None else truth.to(pa.device))
    each = (0.5 * (pa.softmax(-1) - pb.softmax(-1)).abs().sum(-1) if kind == "prediction"
            else (pa - pb).abs().reshape(pa.shape[0], pa.shape[1], -1).mean(-1))
    return ((each * valid).sum(1) / valid.sum(1).clamp(min=1)).cpu()


def record(spec: Any, model: Any) -> dict[str, Any] | None:
    """run.json's ``siit``: the weights, the mapping and circuit, and the held-out measurements."""
    loss = siit_loss_of(spec)
    if loss is None:
        return None
    opts = spec.options
    return {**spec.config.metadata["siit"],
            "weights": {"task": 1.0, "iit": opts["siit_iit_weight"], "strict": opts["siit_strict_weight"]},
            "skipped_variables": loss.circuit.skipped, "measured": measure(loss, model)}

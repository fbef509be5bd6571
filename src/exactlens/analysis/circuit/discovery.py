"""Circuit discovery on the edge graph, methods of the literature written for exactlens's hooks:

* ``patching`` — activation patching at node level: each sender's output is replaced, on all its
  edges at once, by the source activation (another word's, or the mean); the node's score is the
  divergence of the outputs from the clean ones. Scores nodes; an edge gets its sender's score.
* ``eap`` — edge attribution patching (Syed et al. 2023): one clean forward and backward pass, and
  the first-order estimate |(a_source - a_clean) . dM/d(receiver input)| of every edge at once, with
  M the clean decision's logit difference (linear in the logits, so it does not vanish when the
  outputs saturate, as exact constructions' do). Scores edges.
* ``eap-ig-inputs`` / ``eap-ig-activations`` — EAP with integrated gradients (Hanna et al. 2024, as
  MIB runs them): the gradient averaged over ``ig_steps`` points between the ablated and the clean
  embeddings (inputs) or between every node's ablated and clean activation (activations).
* ``edge-patching`` — exact activation patching of each edge alone (what EAP approximates).
* ``acdc`` — ACDC-style pruning (Conmy et al. 2023): from the full graph, visit receivers from the
  output backwards and remove each incoming edge whose removal (patching it with its source
  activation, on top of the edges removed so far) raises the divergence by less than ``threshold``.
  An edge's score is the rise it caused when visited; the kept edges are the method's circuit.

The divergence compares the readout's evidence (the task kind's standard outputs) with the clean
run's: KL divergence of the predicted distributions (sigmoid for membership, softmax for classes,
per symbol position for per-position tasks, averaged over words and positions) or the mean squared
difference (regression).
"""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from exactlens.analysis.circuit.ablation import Batch, model_reader, small_tensor_threads
from exactlens.analysis.circuit.batched import variant_runs, variants_per_pass
from exactlens.analysis.circuit.forward import run_graph
from exactlens.analysis.circuit.graph import Edge, ModelGraph
from exactlens.errors import ExactLensError
from exactlens.progress import bar as progress_bar
from exactlens.tasks import kinds

METHODS = ("patching", "eap", "acdc", "eap-ig-inputs", "eap-ig-activations", "edge-patching")
DEFAULT_THRESHOLD = {"patching": 1e-3, "eap": 1e-2, "acdc": 1e-3, "eap-ig-inputs": 1e-2, "eap-ig-activations": 1e-2,
                     "edge-patching": 1e-3}
"""Each method's own cut: divergence (patching, edge-patching, acdc) or score relative to the largest
(eap and EAP-IG)."""
RELATIVE_CUT = ("eap", "eap-ig-inputs", "eap-ig-activations")
"""The methods whose cut is relative to the largest score."""
DEFAULT_IG_STEPS = 5  # MIB's EAP-IG default


def evidence(model, logits: torch.Tensor, n_positions: torch.Tensor) -> torch.Tensor:
    """The reader's outputs in the kind's standard form (differentiable)."""
    reader = model_reader(model)
    out = reader.evidence(model.select_readout(logits, n_positions), n_positions)
    if out is None:
        raise ExactLensError(
            f"{model.cfg.model_name}: its decision rule gives no differentiable evidence, so no divergence "
            "can compare runs; circuit discovery needs one"
        )
    return out


def _per_position(model, out: torch.Tensor, n_positions: torch.Tensor,
                  truth: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    task = model_reader(model).task
    symbol = kinds.symbol_outputs(task, out)
    return symbol, kinds.valid_targets(task, n_positions, symbol.shape[1], truth)


def divergence(model, clean: torch.Tensor, patched: torch.Tensor, n_positions: torch.Tensor,
               truth: torch.Tensor | None = None) -> torch.Tensor:
    """Mean divergence of patched evidence from clean evidence (module docstring)."""
    kind = model_reader(model).task.kind
    if kind == "membership":
        c, p = clean.reshape(len(clean), -1)[:, -1], patched.reshape(len(patched), -1)[:, -1]
        pc = torch.sigmoid(c)
        kl = pc * (F.logsigmoid(c) - F.logsigmoid(p)) + (1 - pc) * (F.logsigmoid(-c) - F.logsigmoid(-p))
        return kl.mean()
    if kind == "classification":
        return F.kl_div(F.log_softmax(patched, -1), F.log_softmax(clean, -1), log_target=True,
                        reduction="none").sum(-1).mean()
    c, valid = _per_position(model, clean, n_positions, truth)
    p, _ = _per_position(model, patched, n_positions)
    if kind == "prediction":
        each = F.kl_div(F.log_softmax(p, -1), F.log_softmax(c, -1), log_target=True, reduction="none").sum(-1)
    else:
        each = (p - c).reshape(p.shape[0], p.shape[1], -1).pow(2).sum(-1)
    return (each * valid).sum() / valid.sum().clamp(min=1)


def logit_difference(model, clean: torch.Tensor, out: torch.Tensor, n_positions: torch.Tensor,
                     truth: torch.Tensor | None = None) -> torch.Tensor:
    """Evidence for the clean decisions, linear in the outputs: the signed logit (membership), the
    decided class's logit minus the mean of the others (classes), or the value (regression)."""
    kind = model_reader(model).task.kind
    if kind == "membership":
        c, o = clean.reshape(len(clean), -1)[:, -1], out.reshape(len(out), -1)[:, -1]
        return (torch.sign(c) * o).sum()
    if kind == "classification":
        return _class_difference(clean, out).sum()
    c, valid = _per_position(model, clean, n_positions, truth)
    o, _ = _per_position(model, out, n_positions)
    each = _class_difference(c, o) if kind == "prediction" else o.reshape(o.shape[0], o.shape[1], -1).sum(-1)
    return (each * valid).sum()


def _class_difference(clean: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    chosen = F.one_hot(clean.argmax(-1), clean.shape[-1]).to(out.dtype)
    others = max(clean.shape[-1] - 1, 1)
    return (out * chosen).sum(-1) - (out * (1 - chosen)).sum(-1) / others


@dataclass
class Discovery:
    """A method's scores on a model: per edge and per node, and the edges it selects at its own threshold."""

    method: str
    granularity: str
    edge_scores: dict[Edge, float]
    node_scores: dict[str, float]
    selected: set[Edge]
    threshold: float
    seconds: float = 0.0
    details: dict = field(default_factory=dict)


def _clean_evidence(model, batch: Batch) -> torch.Tensor:
    return evidence(model, batch.clean.logits, batch.n_positions)


def patched_divergence(model, graph: ModelGraph, batch: Batch, edges, clean_before: int = 0) -> float:
    """``clean_before``: no patched edge reaches the first ``clean_before`` steps, whose clean outputs
    are reused rather than computed again."""
    reuse = {s.node: batch.clean.outputs[s.node] for s in graph.steps[:clean_before]}
    with torch.no_grad():
        run = run_graph(model, graph, batch.tokens, batch.n_positions, patched=edges, source=batch.source,
                        reuse=reuse)
        return float(divergence(model, _clean_evidence(model, batch), evidence(model, run.logits, batch.n_positions),
                                batch.n_positions, batch.truth))


def stacked_divergences(model, graph: ModelGraph, batch: Batch, variants: Sequence[Collection[Edge]],
                        clean_before: int = 0) -> list[float]:
    """``patched_divergence`` of each variant (a set of patched edges), many variants per forward pass
    (exactlens.analysis.circuit.batched)."""
    clean = _clean_evidence(model, batch)
    words = batch.tokens.shape[0]
    out: list[float] = []
    for k, logits, n_positions in variant_runs(model, graph, batch, variants, clean_before):
        with torch.no_grad():
            patched = evidence(model, logits, n_positions)
            out += [float(divergence(model, clean, patched[i * words:(i + 1) * words], batch.n_positions,
                                     batch.truth)) for i in range(k)]
    return out


def mean_divergences(model, graph: ModelGraph, batches: list[Batch], variants: Sequence[Collection[Edge]],
                     clean_before: int = 0) -> list[float]:
    """Each variant's divergence averaged over the batches (summed in batch order)."""
    each = [stacked_divergences(model, graph, b, variants, clean_before) for b in batches]
    return [sum(values) / len(values) for values in zip(*each, strict=True)]


def activation_patching(model, graph: ModelGraph, batches: list[Batch], threshold: float) -> Discovery:
    senders = graph.senders
    variants = [[e for e in graph.edges if e.sender == node] for node in senders]
    node_scores = dict(zip(senders, mean_divergences(model, graph, batches, variants), strict=True))
    edge_scores = {e: node_scores[e.sender] for e in graph.edges}
    selected = {e for e in graph.edges if node_scores[e.sender] > threshold}
    return Discovery("patching", graph.granularity, edge_scores, node_scores, selected, threshold)


def _interpolated(batch: Batch, node: str, alpha: float) -> torch.Tensor:
    """The sender's activation a fraction ``alpha`` of the way from its source (ablated) value to its
    clean one; exactly the clean one at alpha = 1 (so EAP-IG with one step is EAP, bit for bit)."""
    clean = batch.clean.outputs[node].detach()  # a cached position table may carry a graph
    if alpha == 1.0:
        return clean
    source = batch.source[node].detach()
    return source + alpha * (clean - source)


def _attribution_run(model, graph: ModelGraph, batch: Batch, method: str, alpha: float):
    """One forward and backward pass of an attribution method at one interpolation step: EAP at the
    clean input; EAP-IG on inputs with the embeddings interpolated and everything after them computed;
    EAP-IG on activations with every sender held at its interpolated activation (gradients through
    each node's own computation)."""
    reuse = pin = None
    if method == "eap-ig-inputs" and alpha != 1.0:
        reuse = {s.node: _interpolated(batch, s.node, alpha) for s in graph.steps if s.kind in ("embed", "pos")}
    elif method == "eap-ig-activations" and alpha != 1.0:
        pin = {node: _interpolated(batch, node, alpha) for node in graph.senders}
    with torch.enable_grad():  # callers may run under no_grad (the diff does)
        run = run_graph(model, graph, batch.tokens, batch.n_positions, input_grads=True, reuse=reuse, pin=pin)
        clean = _clean_evidence(model, batch).detach()
        logit_difference(model, clean, evidence(model, run.logits, batch.n_positions), batch.n_positions,
                         batch.truth).backward()
    return run


def edge_attribution(model, graph: ModelGraph, batches: list[Batch], threshold: float, method: str = "eap",
                     steps: int = 1) -> Discovery:
    """EAP (``steps`` = 1) and EAP-IG (Hanna et al. 2024; MIB's eap-ig-inputs / eap-ig-activations):
    the gradient at each receiver's input averaged over ``steps`` points alpha = k / steps (k = 1 ..
    steps, a right Riemann sum of the path from the ablated to the clean activations), times the
    edge's activation difference."""
    totals = {e: 0.0 for e in graph.edges}
    non_finite = seen = 0
    for batch in progress_bar(batches, desc=f"{method} batches", unit="batch"):
        grads: dict[str, torch.Tensor] = {}
        for k in range(1, steps + 1):
            run = _attribution_run(model, graph, batch, method, k / steps)
            for target, x in run.inputs.items():
                if x.grad is not None:
                    grads[target] = x.grad / steps + grads[target] if target in grads else x.grad / steps
        per_position: dict[tuple, torch.Tensor] = {}
        for e in graph.edges:
            grad = grads.get(e.target)
            if grad is None:  # the receiver's input does not reach the output (e.g. a dead branch)
                continue
            if e.position is not None:  # position granularity: the product summed once per input, then split
                key = (e.sender, e.target)
                if key not in per_position:
                    seen += grad.numel()
                    non_finite += int((~grad.isfinite()).sum())
                    delta = (batch.source[e.sender] - batch.clean.outputs[e.sender]).expand_as(grad)
                    per_position[key] = (delta * grad).detach().nansum(dim=(0, 2))
                totals[e] += abs(float(per_position[key][e.position])) / len(batch.tokens)
                continue
            seen += grad.numel()
            non_finite += int((~grad.isfinite()).sum())
            delta = (batch.source[e.sender] - batch.clean.outputs[e.sender]).expand_as(grad)
            # nansum: eps = 0 layer norms give NaN (0/0) at positions no output reads
            totals[e] += abs(float((delta * grad).detach().nansum())) / len(batch.tokens)
    edge_scores = {e: v / len(batches) for e, v in totals.items()}
    top = max(edge_scores.values(), default=0.0)
    selected = {e for e, v in edge_scores.items() if top > 0 and v > threshold * top}
    # eps = 0 layer norms: 0/0 at positions no output reads gives NaN gradients, which attention then
    # spreads; their share is reported (Chiang & Cholak's Prop. 2 layer: EAP's ranking fails there)
    details = {"non_finite_gradient_fraction": non_finite / seen if seen else 0.0}
    if method != "eap":
        details["ig_steps"] = steps
    return Discovery(method, graph.granularity, edge_scores, node_scores(graph, edge_scores), selected, threshold,
                     details=details)


def edge_patching(model, graph: ModelGraph, batches: list[Batch], threshold: float) -> Discovery:
    """Exact activation patching of each edge alone (MIB's ``exact``, what EAP approximates): an edge's
    score is the divergence when it alone reads its source activation."""
    order = {s.node: i for i, s in enumerate(graph.steps)}
    edge_scores = {}
    for step in progress_bar(graph.steps, desc="edge patching", unit="receiver"):  # one receiver's edges a pass
        edges = graph.edges_into(step.node)
        if edges:
            edge_scores.update(zip(edges, mean_divergences(model, graph, batches, [{e} for e in edges],
                                                           order[step.node]), strict=True))
    edge_scores = {e: edge_scores[e] for e in graph.edges}  # the graph's order
    selected = {e for e, v in edge_scores.items() if v > threshold}
    return Discovery("edge-patching", graph.granularity, edge_scores, node_scores(graph, edge_scores), selected,
                     threshold)


def acdc(model, graph: ModelGraph, batches: list[Batch], threshold: float) -> Discovery:
    """ACDC, one receiver's incoming edges in order. A receiver's trials run stacked in passes that
    speculate each edge is removed (trial j: the edges removed so far plus the receiver's pending edges
    up to j); the walk takes trials in order while edges are removed, and at the first edge kept the
    speculation after it is void and those edges are tried again. The speculation window doubles after
    a pass without a kept edge and halves after one with (a kept edge wastes the rest of its pass), up
    to what one pass holds. Each trial is the edge set of the one-by-one walk."""
    removed: set[Edge] = set()
    current = mean_divergences(model, graph, batches, [removed])[0]
    edge_scores: dict[Edge, float] = {}
    order = {s.node: i for i, s in enumerate(graph.steps)}
    receivers = [s for s in reversed(graph.steps) if graph.edges_into(s.node)]
    largest = min(variants_per_pass(model, graph, b) for b in batches)
    window = min(4, largest)
    bar = progress_bar(total=len(graph.edges), desc="acdc edges", unit="edge")
    for step in receivers:
        # every removed edge enters this receiver or a later one: the nodes before it run clean
        pending = sorted(graph.edges_into(step.node), reverse=True)
        while pending:
            trials = mean_divergences(model, graph, batches, [removed | set(pending[:j + 1])
                                                              for j in range(min(window, len(pending)))],
                                      order[step.node])
            done = len(trials)
            for j, (edge, trial) in enumerate(zip(pending[:done], trials, strict=True)):
                edge_scores[edge] = max(trial - current, 0.0)
                bar.update(1)
                if trial - current < threshold:
                    removed.add(edge)
                    current = trial
                else:  # kept: the trials after it assumed it removed
                    done = j + 1
                    break
            window = min(largest, window * 2) if done == len(trials) else max(1, window // 2)
            pending = pending[done:]
    bar.close()
    selected = set(graph.edges) - removed
    return Discovery("acdc", graph.granularity, edge_scores, node_scores(graph, edge_scores), selected, threshold,
                     details={"final_divergence": current})


def node_scores(graph: ModelGraph, edge_scores: dict[Edge, float]) -> dict[str, float]:
    """A node's score: the largest score of an edge it sends (its relevance to what reads it)."""
    return {n: max((v for e, v in edge_scores.items() if e.sender == n), default=0.0) for n in graph.senders}


_RUN = {"patching": activation_patching, "acdc": acdc, "edge-patching": edge_patching}


def check_threshold(threshold: Any) -> None:
    """A discovery threshold: a finite number >= 0 (None: the method's own). inf would select nothing
    (patching, eap) or everything's removal (acdc) and say so nowhere."""
    if threshold is not None and not (isinstance(threshold, (int, float)) and not isinstance(threshold, bool)
                                      and math.isfinite(threshold) and threshold >= 0):
        raise ExactLensError(f"threshold must be a finite number >= 0, got {threshold!r}")


def discover(model, graph: ModelGraph, batches: list[Batch], method: str, threshold: float | None = None,
             ig_steps: int = DEFAULT_IG_STEPS) -> Discovery:
    """Run one method (``METHODS``) on these batches; ``threshold`` defaults to the method's own;
    ``ig_steps``: EAP-IG's interpolation steps (1 gives EAP's scores)."""
    import time

    if method not in METHODS:
        raise ExactLensError(f"discovery method {method!r} is unknown; choose one of {', '.join(METHODS)}")
    check_threshold(threshold)
    threshold = DEFAULT_THRESHOLD[method] if threshold is None else threshold
    if isinstance(ig_steps, bool) or not isinstance(ig_steps, int) or ig_steps < 1:
        raise ExactLensError(f"ig_steps must be an integer >= 1, got {ig_steps!r}")
    start = time.perf_counter()
    with small_tensor_threads(model):
        if method in ("eap", "eap-ig-inputs", "eap-ig-activations"):
            steps = 1 if method == "eap" else ig_steps
            result = edge_attribution(model, graph, batches, float(threshold), method, steps)
        else:
            result = _RUN[method](model, graph, batches, float(threshold))
    result.seconds = time.perf_counter() - start
    return result

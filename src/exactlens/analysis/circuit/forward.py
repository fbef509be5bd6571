"""The forward pass edge by edge: every receiver reads the sum of its senders' outputs, and any edge
may be *patched* so that its receiver reads another activation of the sender (from a run on other
words, or a mean) instead. With nothing patched it is the model's own forward pass (tests check it
equals ``model(tokens)``), computed with the model's own sublayers.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass

import torch

from exactlens.analysis.circuit.graph import Edge, ModelGraph, Step, slots_of
from exactlens.errors import ExactLensError
from exactlens.model.components import visible_keys


@dataclass
class GraphRun:
    """A run's sender outputs {node: [b, pos, d_model]}, the inputs its receivers read
    {target: [b, pos, d_model]} (the sum before a pre-LN), and the logits [b, pos, d_vocab_out]."""

    outputs: dict[str, torch.Tensor]
    inputs: dict[str, torch.Tensor]
    logits: torch.Tensor


def run_graph(
    model,
    graph: ModelGraph,
    tokens: torch.Tensor,
    n_positions: torch.Tensor | None = None,
    *,
    patched: Collection[Edge] = (),
    source: Mapping[str, torch.Tensor] | None = None,
    input_grads: bool = False,
    reuse: Mapping[str, torch.Tensor] | None = None,
    pin: Mapping[str, torch.Tensor] | None = None,
    patch_masks: Mapping[tuple, torch.Tensor] | None = None,
) -> GraphRun:
    """Run the model edge by edge. Edges in ``patched`` read ``source[sender]`` (same shape as the
    sender's output, or broadcastable to it: a mean [1, pos, d_model]). ``input_grads``: the
    receivers' inputs keep their gradients (edge attribution patching reads them). ``reuse``: outputs
    of nodes taken as given instead of computed (the caller vouches that no patch reaches them, e.g.
    a clean run's outputs of every node before the first patched receiver; their inputs are not
    recorded). ``pin``: nodes whose output takes this value (broadcastable) while gradients still
    flow through the node's own computation (EAP-IG on activations: every node at an interpolated
    activation, the gradient that of the path through it). ``patch_masks``: instead of ``patched``,
    {(sender, receiver, slot): bool mask broadcastable to [b, pos, 1]}, the rows and positions where
    that edge reads the source (many ablations stacked on the batch dimension:
    exactlens.analysis.circuit.batched)."""
    patched = set(patched)
    if (patched or patch_masks) and source is None:
        raise ValueError("patched edges need source activations")
    for edge in patched:
        graph.check_edge(edge)
    cfg = model.cfg
    n_positions, padded = model._check_input(tokens, n_positions)
    n_pos = tokens.shape[1]
    if graph.n_positions is not None and graph.n_positions != n_pos:
        raise ExactLensError(f"this graph's edges are resolved over {graph.n_positions} token positions; the words "
                             f"have {n_pos}")
    at = _patched_positions(patched, n_pos, tokens.device) if graph.n_positions is not None else None
    if patch_masks is not None:
        if patched:
            raise ValueError("give patched edges or patch masks, not both")
        at = patch_masks
    allowed = {mask: visible_keys(mask, n_pos, n_positions, padded) for mask in set(cfg.per_layer("attention_mask"))}
    outputs: dict[str, torch.Tensor] = {}
    inputs: dict[str, torch.Tensor] = {}
    bias = torch.zeros(cfg.d_model, dtype=cfg.torch_dtype, device=tokens.device)  # b_O of this stream segment
    logits = None

    def part(sender: str, step: Step, slot: str | None) -> torch.Tensor:
        if at is None:
            return source[sender] if Edge(sender, step.node, slot) in patched else outputs[sender]
        mask = at.get((sender, step.node, slot))
        if mask is None or mask is True:  # True: every row reads the source (exactlens.analysis.circuit.batched)
            return outputs[sender] if mask is None else source[sender]
        return torch.where(mask, source[sender], outputs[sender])

    def read(step: Step, slot: str | None) -> torch.Tensor:
        parts = [part(s, step, slot) for s in step.reads]
        x = torch.stack(torch.broadcast_tensors(*parts)).sum(0) + bias
        if x.shape[0] != tokens.shape[0]:  # every part a mean or zero [1, pos, d]: one row per word still
            x = x.expand(tokens.shape[0], *x.shape[1:]).clone()
        if input_grads:
            x.retain_grad() if x.requires_grad else x.requires_grad_(True)
        inputs[Edge(step.reads[0], step.node, slot).target] = x
        return x

    reuse = reuse or {}
    for step in graph.steps:
        block = model.blocks[step.layer] if step.layer is not None else None
        given = reuse.get(step.node)
        if given is not None:
            outputs[step.node] = given
        elif step.kind == "embed":
            outputs["embed"] = model.embed(tokens)
        elif step.kind == "pos":
            outputs["pos"] = model.pos_embed(n_pos, n_positions, padded)
        elif step.kind == "head":
            slots = slots_of(step, graph.granularity)
            xs = [read(step, slot) for slot in slots]
            if block.norm == "pre":
                xs = [block.ln1(x) for x in xs]
            x_q, x_k, x_v = xs if len(xs) == 3 else xs * 3
            attn = block.attn
            outputs[step.node] = attn.head_result(step.head, x_q, x_k, x_v, allowed[attn.mask], n_positions)
        elif step.kind == "norm":
            outputs[step.node] = getattr(block, step.which)(read(step, None))
        elif step.kind == "mlp":
            x = read(step, None)
            outputs[step.node] = block.mlp(block.ln2(x) if block.norm == "pre" else x)
        else:  # output
            x = read(step, None)
            logits = model.unembed(model.ln_final(x) if cfg.final_ln else x)
        if pin and step.node in pin and given is None:
            out = outputs[step.node]
            outputs[step.node] = out + (pin[step.node] - out).detach()
        # the stream's constant: b_O once a layer's heads are done; a norm (or an FFN without
        # residual) starts a new segment
        if step.kind == "head" and step.head == cfg.n_heads - 1:
            bias = bias + block.attn.b_O
        elif step.kind == "norm" or (step.kind == "mlp" and not cfg.mlp_residual):
            bias = torch.zeros_like(bias)
    return GraphRun(outputs, inputs, logits)


def _patched_positions(patched: Collection[Edge], n_pos: int, device) -> dict[tuple, torch.Tensor]:
    """Position-resolved patches: {(sender, receiver, slot): bool [pos, 1]}, the positions that read
    the source."""
    masks: dict[tuple, torch.Tensor] = {}
    for e in patched:
        key = (e.sender, e.receiver, e.slot)
        if key not in masks:
            masks[key] = torch.zeros(n_pos, 1, dtype=torch.bool, device=device)
        masks[key][e.position] = True
    return masks


def mean_outputs(run: GraphRun) -> dict[str, torch.Tensor]:
    """Each sender's mean output over the batch [1, pos, d_model] (mean ablation's source)."""
    return {node: out.mean(0, keepdim=True) for node, out in run.outputs.items()}

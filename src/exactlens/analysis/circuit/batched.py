"""Many ablations in one forward pass. The edge-by-edge methods (node patching, edge patching, ACDC,
the faithfulness curves) each run the model once per set of ablated edges, on models whose forward
pass is thousands of small tensor operations: Python and dispatch, not arithmetic, set their pace.
Here K such sets (*variants*) run as one pass: the words are stacked K times on the batch dimension
and variant k's patched edges read the source activation in its rows only (a boolean mask per
(sender, receiver, slot), exactlens.analysis.circuit.forward's ``patch_masks``). Rows never mix
(attention, layer norm and the readout are per word), so each variant's divergence is the one its own
pass gives, up to the rounding of matrix products over more rows (tests compare both paths).

Variants per pass are bounded by a memory budget (every node's output is kept for the whole pass).
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Sequence

import torch

from exactlens.analysis.circuit.ablation import Batch
from exactlens.analysis.circuit.forward import run_graph
from exactlens.analysis.circuit.graph import Edge, ModelGraph

PASS_BYTES = 96 * 2**20
"""Activations one stacked pass may hold (about: every node's output, plus the widest intermediate)."""
MAX_VARIANTS = 256
"""Variants per pass at most (beyond a few hundred rows a pass is arithmetic-bound already)."""


def variants_per_pass(model, graph: ModelGraph, batch: Batch) -> int:
    """How many variants of this batch one pass holds within ``PASS_BYTES``."""
    cfg = model.cfg
    words, positions = batch.tokens.shape[0], batch.tokens.shape[1]
    width = max(cfg.d_model, getattr(cfg, "d_mlp", 0) or 0, positions * cfg.n_heads)
    per_variant = (len(graph.steps) + 4) * words * positions * width * torch.finfo(cfg.torch_dtype).bits // 8
    return max(1, min(MAX_VARIANTS, PASS_BYTES // max(per_variant, 1)))


def _masks(graph: ModelGraph, variants: Sequence[Collection[Edge]], words: int, n_pos: int,
           device) -> dict[tuple, torch.Tensor | bool]:
    """{(sender, receiver, slot): bool [K * words, pos or 1, 1]}: the rows (and positions, for
    position-resolved edges) where that edge reads its source; ``True`` for an edge every variant
    patches (ACDC's edges removed so far: they read the source in every row, as in a single run)."""
    sets = [set(v) for v in variants]
    for e in set().union(*sets):
        graph.check_edge(e)
    masks: dict[tuple, torch.Tensor | bool] = {}
    common: set[Edge] = set()
    if graph.n_positions is None and sets:
        common = set.intersection(*sets)
        masks.update(((e.sender, e.receiver, e.slot), True) for e in common)
    positions = n_pos if graph.n_positions is not None else 1
    hits: dict[tuple, tuple[list[int], list[int]]] = {}
    for k, edges in enumerate(sets):
        for e in edges - common if common else edges:
            rows, at = hits.setdefault((e.sender, e.receiver, e.slot), ([], []))
            rows.append(k)
            at.append(0 if e.position is None else e.position)
    for key, (rows, at) in hits.items():  # one indexing per (sender, receiver, slot)
        mask = torch.zeros(len(variants), positions, 1, dtype=torch.bool)
        mask[rows, at] = True
        masks[key] = mask.repeat_interleave(words, 0).to(device)
    return masks


def _rows(batch: Batch, which: str, node: str, times: int) -> torch.Tensor:
    """The node's clean or source activation repeated ``times`` on the batch dimension: a view of one
    copy kept on the batch, grown as needed (a broadcast [1, ...] one as is)."""
    value = (batch.clean.outputs if which == "clean" else batch.source)[node]
    if value.shape[0] == 1:
        return value
    kept = batch.stacked.get((which, node))
    if kept is None or kept.shape[0] < times * value.shape[0]:
        kept = batch.stacked[(which, node)] = value.repeat(times, *([1] * (value.ndim - 1)))
    return kept[:times * value.shape[0]]


class _Sources(dict):
    """The batch's source activations repeated ``times``, each when a patched edge first reads it."""

    def __init__(self, batch: Batch, times: int):
        super().__init__()
        self.batch, self.times = batch, times

    def __missing__(self, node: str) -> torch.Tensor:
        self[node] = _rows(self.batch, "source", node, self.times)
        return self[node]


def variant_runs(model, graph: ModelGraph, batch: Batch, variants: Sequence[Collection[Edge]],
                 clean_before: int = 0) -> Iterator[tuple[int, torch.Tensor, torch.Tensor]]:
    """The batch run once per variant, ``variants_per_pass`` variants a pass: yields (variants in the
    pass, their stacked logits [K * words, ...], the stacked n_positions). ``clean_before``: no variant
    patches an edge into the first ``clean_before`` steps, whose clean outputs are reused."""
    size = variants_per_pass(model, graph, batch)
    words, n_pos = batch.tokens.shape[0], batch.tokens.shape[1]
    for start in range(0, len(variants), size):
        chunk = variants[start:start + size]
        k = len(chunk)
        masks = _masks(graph, chunk, words, n_pos, batch.tokens.device)
        reuse = {s.node: _rows(batch, "clean", s.node, k) for s in graph.steps[:clean_before]}
        source = _Sources(batch, k)
        n_positions = batch.n_positions.repeat(k)
        with torch.no_grad():
            run = run_graph(model, graph, batch.tokens.repeat(k, 1), n_positions, patch_masks=masks,
                            source=source, reuse=reuse)
        yield k, run.logits, n_positions

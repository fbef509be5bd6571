"""Attention part of the circuit diff: per-head pattern distances, an optimal head matching, and
the attention from the readout position (CLS) to the first symbol.

The distance between a trained head and an exact head is the total variation distance
TV(p, q) = 1/2 sum_j |p_j - q_j| between the two heads' attention distributions of the same query
on the same word, averaged over every query position of every word (0: identical patterns, 1:
disjoint supports). Heads are matched one to one by the assignment that minimizes the summed
distance (Hungarian algorithm, ``scipy.optimize.linear_sum_assignment``); with unequal head
counts the extra heads stay unmatched.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from scipy.optimize import linear_sum_assignment

Heads = list[tuple[int, int]]


def heads_of(patterns: dict[int, np.ndarray]) -> Heads:
    """(layer, head) pairs of per-layer patterns {layer: [batch, head, query, key]}."""
    return [(layer, h) for layer in sorted(patterns) for h in range(patterns[layer].shape[1])]


def distance_matrix(
    trained: list[dict[int, np.ndarray]], exact: list[dict[int, np.ndarray]]
) -> tuple[np.ndarray, Heads, Heads]:
    """Mean TV distance [trained heads, exact heads] over batches (one per length) of patterns."""
    t_heads, e_heads = heads_of(trained[0]), heads_of(exact[0])
    total = np.zeros((len(t_heads), len(e_heads)))
    count = 0
    for t_pat, e_pat in zip(trained, exact, strict=True):
        t = np.stack([t_pat[layer][:, h] for layer, h in t_heads], 1)  # [b, T, q, k]
        e = np.stack([e_pat[layer][:, h] for layer, h in e_heads], 1)  # [b, E, q, k]
        tv = 0.5 * np.abs(t[:, :, None] - e[:, None, :]).sum(-1)  # [b, T, E, q]
        total += tv.sum((0, 3))
        count += tv.shape[0] * tv.shape[3]
    return total / max(count, 1), t_heads, e_heads


TIE_BREAK = 1e-9
"""Added per unit of |layer difference| + |head difference| to the matching cost only, so that
heads with equal patterns (e.g. two uniform heads) are matched to the same (layer, head)."""


def match_heads(dist: np.ndarray, t_heads: Heads, e_heads: Heads) -> list[dict[str, Any]]:
    offset = np.array([[abs(t[0] - e[0]) + abs(t[1] - e[1]) for e in e_heads] for t in t_heads], dtype=float)
    rows, cols = linear_sum_assignment(dist + TIE_BREAK * offset)
    return [
        {
            "trained_layer": t_heads[r][0],
            "trained_head": t_heads[r][1],
            "exact_layer": e_heads[c][0],
            "exact_head": e_heads[c][1],
            "distance": float(dist[r, c]),
        }
        for r, c in zip(rows, cols, strict=True)
    ]


def readout_to_first(patterns: dict[int, np.ndarray], query: int, key: int) -> dict[str, Any]:
    """Mean attention weight (over words) from position ``query`` to position ``key``, per layer and
    head, and summed over layers of the mean over each layer's heads (Chiang & Cholak Fig. 4 sums the
    weight on the first position over layers)."""
    per_head = [
        [float(patterns[layer][:, h, query, key].mean()) for h in range(patterns[layer].shape[1])]
        for layer in sorted(patterns)
    ]
    return {"per_head": per_head, "summed_over_layers": float(sum(sum(row) / len(row) for row in per_head))}


def attention_diff(
    trained: list[dict[int, np.ndarray]],
    exact: list[dict[int, np.ndarray]],
    lengths: list[int],
    query: int,
    key: int | None,
) -> dict[str, Any]:
    """The ``attention`` part of the diff JSON (see :func:`exactlens.analysis.diff.diff`)."""
    dist, t_heads, e_heads = distance_matrix(trained, exact)
    out: dict[str, Any] = {
        "distance": "mean total variation distance between attention distributions, over queries and words",
        "trained_heads": [list(h) for h in t_heads],
        "exact_heads": [list(h) for h in e_heads],
        "distances": dist.tolist(),
        "matching": match_heads(dist, t_heads, e_heads),
    }
    if key is not None:
        rows = []
        for length, t_pat, e_pat in zip(lengths, trained, exact, strict=True):
            if max(query, key) >= t_pat[0].shape[-1]:
                continue
            t, e = readout_to_first(t_pat, query, key), readout_to_first(e_pat, query, key)
            rows.append(
                {
                    "length": length,
                    "trained": t["per_head"],
                    "exact": e["per_head"],
                    "trained_summed": t["summed_over_layers"],
                    "exact_summed": e["summed_over_layers"],
                }
            )
        out["cls_to_first"] = {"query_position": query, "key_position": key, "rows": rows}
    else:
        out["cls_to_first"] = None
    return out

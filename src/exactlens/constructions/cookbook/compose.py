"""Assembly of layer stacks (the Cookbook's §8): :func:`serial` and :func:`parallel` composition and
:func:`rename` (disjoint copies). Overview: :mod:`exactlens.constructions.cookbook.program`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

from exactlens.constructions.cookbook.layers import Layer
from exactlens.errors import ExactLensError


def serial(*stacks: Layer | Sequence[Layer]) -> tuple[Layer, ...]:
    """Serial composition (Lemma 8.2): the layers of each operand, in order."""
    out: list[Layer] = []
    for stack in stacks:
        out += [stack] if isinstance(stack, Layer) else list(stack)
    return tuple(out)


def parallel(*stacks: Layer | Sequence[Layer]) -> tuple[Layer, ...]:
    """Parallel composition (Lemma 8.3): layer i of every operand merged into one layer.

    Operands should write disjoint labels (use ``rename``); labels they share are
    read by both and written additively. Shorter operands are padded with empty
    layers (identity through the residual).
    """
    lists = [[s] if isinstance(s, Layer) else list(s) for s in stacks]
    depth = max((len(s) for s in lists), default=0)
    merged: list[Layer] = []
    for i in range(depth):
        parts = [s[i] for s in lists if i < len(s)]
        selective = [p for p in parts if p.pre_ln]
        if selective and len([p for p in parts if p.heads or p.ffns or p.pre_ln]) > 1:
            raise ExactLensError(
                f"parallel composition: layer {i} merges a selective pre-LN layer (ln1/ln2) with other pieces; "
                "one LN normalizes all its slots together — compose these serially instead"
            )
        if selective:
            merged.append(selective[0])
            continue
        with_heads = [p for p in parts if p.heads]
        settings = {p.attention for p in with_heads}
        if len(settings) > 1:
            raise ExactLensError(
                f"parallel composition: layer {i} needs different attention settings "
                f"(mask, weighting, length scale) {sorted(settings)}; one layer has one setting — "
                "compose these serially instead"
            )
        mask, weighting, length = settings.pop() if settings else ("none", "softmax", "none")
        merged.append(
            Layer(
                heads=tuple(h for p in parts for h in p.heads),
                ffns=tuple(f for p in parts for f in p.ffns),
                mask=mask,
                weighting=weighting,
                length_scale=length,
            )
        )
        merged[-1].activation  # noqa: B018 - raises if the FFN activations clash
    return tuple(merged)


def rename(stack: Layer | Sequence[Layer], mapping: Mapping[str, str] | str) -> tuple[Layer, ...]:
    """Relabel every piece of a stack; a string is a prefix added to every label."""
    layers = [stack] if isinstance(stack, Layer) else list(stack)
    if isinstance(mapping, str):
        prefix = mapping
        all_labels = {x for layer in layers for x in layer.labels()}
        mapping = {x: prefix + x for x in all_labels}
    return tuple(
        replace(
            layer,
            heads=tuple(h.relabel(mapping) for h in layer.heads),
            ffns=tuple(f.relabel(mapping) for f in layer.ffns),
            ln1=layer.ln1.relabel(mapping) if layer.ln1 is not None else None,
            ln2=layer.ln2.relabel(mapping) if layer.ln2 is not None else None,
        )
        for layer in layers
    )

"""The Cookbook compiler's last pass: :func:`compile` writes a :class:`~.layers.Program`'s pieces into the
weights of an ExactTransformer (the configuration read off the layers, then embeddings, each layer's
heads, FFN units and layer-norm selectors, the readout). Overview:
:mod:`exactlens.constructions.cookbook.program`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch

from exactlens.constructions.cookbook.layers import Layer, Program
from exactlens.constructions.cookbook.pieces import F64, FFN, Selector
from exactlens.dtypes import dtype_name
from exactlens.errors import ExactLensError
from exactlens.model import ExactConfig, ExactTransformer


def _layer_switch(layers: Sequence[Layer], used: Sequence[bool], values: Sequence[str | None], name: str) -> Any:
    """One string if all layers that use the switch agree, else a per-layer tuple."""
    relevant = {v for v, u in zip(values, used, strict=True) if u and v is not None}
    if len(relevant) <= 1:
        return relevant.pop() if relevant else None
    if not hasattr(ExactConfig, "per_layer"):
        raise ExactLensError(
            f"layers need different {name} values {sorted(relevant)}, but this ExactConfig has no per-layer "
            "switches (cfg.per_layer); give all layers one value"
        )
    fill = next(v for v, u in zip(values, used, strict=True) if u and v is not None)
    return tuple(v if (u and v is not None) else fill for v, u in zip(values, used, strict=True))


def _normalization(program: Program) -> str | tuple[str, ...]:
    """program.normalization for every layer, or, with selective pre-LN layers (§5.3.3),
    "pre" for those and "none" for the others."""
    pre = [layer.pre_ln for layer in program.layers]
    if not any(pre):
        return program.normalization
    if program.normalization != "none":
        raise ExactLensError(
            f"layers with layer-norm selectors (ln1/ln2) need Program.normalization='none' (the other layers stay "
            f"LN-free), got {program.normalization!r}"
        )
    if program.ln_eps != 0:
        raise ExactLensError(f"selective layer norm is defined with eps = 0 (§5.3.3), got ln_eps={program.ln_eps!r}")
    return tuple("pre" if p else "none" for p in pre)


def _set_selector(ln: Any, selector: Selector, rows: Any) -> None:
    """W_select = S with the slots centered (C = I - 11^T/m), gain sqrt(m/D) on the slots:
    for the centered slot vector u (zero elsewhere) the model's LN gives u sqrt(D)/|u|, so
    the slots get u sqrt(m)/|u| = the m-vector LN of §5.3.3, whatever d_model D is."""
    m, d = len(selector.slots), ln.w.shape[0]
    center = torch.eye(m, dtype=F64) - 1.0 / m
    matrix = torch.zeros(d, d, dtype=F64)
    cols = torch.tensor(rows(selector.slots))
    for k, row in enumerate(rows(selector.inputs)):
        matrix[row, cols] = (selector.W @ center)[k]
    ln.W_select.copy_(matrix.to(ln.W_select.dtype))
    ln.w.fill_(1.0)
    ln.w[cols] = math.sqrt(m / d)
    ln.b.zero_()


def _config(program: Program, labels: tuple[str, ...], ffns_per_layer: Sequence[Sequence[FFN]],
            dtype: str) -> ExactConfig:
    """The model's shape and switches, read off the layers: n_heads / d_head / d_mlp are the maxima over
    layers; a mask, weighting, length scale or activation that differs between layers is per layer."""
    layers = program.layers
    has_heads = [bool(layer.heads) for layer in layers]
    mask = _layer_switch(layers, has_heads, [x.mask for x in layers], "attention_mask") or "none"
    weighting = _layer_switch(layers, has_heads, [x.weighting for x in layers], "attention_weighting") or "softmax"
    length = _layer_switch(layers, has_heads, [x.length_scale for x in layers], "attn_length_scale") or "none"
    act_fn = _layer_switch(layers, [bool(layer.ffns) for layer in layers], [layer.activation for layer in layers],
                           "act_fn") or "relu"
    readout = program.readout
    return ExactConfig(
        d_model=len(labels),
        n_layers=len(layers),
        d_vocab=len(program.vocab),
        n_heads=max(1, max(len(layer.heads) for layer in layers)),
        d_head=max([1] + [max(h.d_qk, len(h.outputs)) for layer in layers for h in layer.heads]),
        d_mlp=max(sum(f.d_hidden for f in fs) for fs in ffns_per_layer),
        d_vocab_out=len(readout.weights),
        attention_mask=mask,
        attention_weighting=weighting,
        attn_scale=1.0,
        attn_length_scale=length,
        hard_tie_tolerance=program.hard_tie_tolerance,
        normalization=_normalization(program),
        ln_final=False if any(layer.pre_ln for layer in layers) else None,  # selective LN normalizes slots only
        ln_select=any(layer.pre_ln for layer in layers),
        ln_eps=program.ln_eps,
        ln_affine=False,
        act_fn=act_fn,
        positional_features=tuple(program.positions),
        readout=readout.kind,
        readout_position=readout.position,
        residual_labels=labels,
        vocab=program.vocab,
        dtype=dtype,
        model_name=program.name,
    )


def _write_layer(block: Any, layer: Layer, ffns: Sequence[FFN], rows: Callable[[Sequence[str]], list[int]],
                 dt: torch.dtype) -> dict[str, Any]:
    """One layer's heads, FFN units and layer-norm selectors into ``block``; returns where each piece went."""
    att = block.attn
    entry: dict[str, Any] = {"heads": {}, "ffns": {}}
    for h, head in enumerate(layer.heads):
        d, o = head.d_qk, len(head.outputs)
        att.W_Q[h, rows(head.q_inputs), :d] = head.W_Q.to(dt)
        att.b_Q[h, :d] = head.b_Q.to(dt)
        att.W_K[h, rows(head.k_inputs), :d] = head.W_K.to(dt)
        att.b_K[h, :d] = head.b_K.to(dt)
        att.W_V[h, rows(head.v_inputs), :o] = head.W_OV.to(dt)
        att.b_V[h, :o] = head.b_OV.to(dt)
        att.W_O[h, torch.arange(o), rows(head.outputs)] = 1.0
        entry["heads"][head.name] = h
    start = 0
    for f in ffns:
        if block.mlp is None:  # every FFN piece of the program is empty (e.g. ffn.zero())
            if f.b_out.abs().max(initial=0.0) > 0:
                raise ExactLensError(f"FFN {f.name} has output biases but no hidden units")
            continue
        end = start + f.d_hidden
        block.mlp.W_in[rows(f.inputs), start:end] = f.W_in.to(dt)
        block.mlp.b_in[start:end] = f.b_in.to(dt)
        block.mlp.W_out[start:end, rows(f.outputs)] = f.W_out.to(dt)
        block.mlp.b_out[rows(f.outputs)] += f.b_out.to(dt)
        entry["ffns"][f.name] = [start, end]
        start = end
    selectors = layer.selectors()
    if selectors is not None:
        for ln, selector in zip((block.ln1, getattr(block, "ln2", None)), selectors, strict=True):
            if ln is not None:
                _set_selector(ln, selector, rows)
        entry["ln"] = [list(s.slots) for s in selectors]
    return entry


def compile(program: Program, dtype: str = "float64") -> ExactTransformer:  # noqa: A001 - the tracr name
    """Assemble the program's weights into an ExactTransformer (overview:
    :mod:`exactlens.constructions.cookbook.program`); ``dtype``: "float32", "float64" or the torch dtype."""
    dtype = dtype_name(dtype)
    labels = program.residual_labels()
    index = {label: k for k, label in enumerate(labels)}
    layers = program.layers
    ffns_per_layer = [
        [f.with_activation(a) if a else f for f in layer.ffns]
        for layer, a in zip(layers, [layer.activation for layer in layers], strict=False)
    ]
    cfg = _config(program, labels, ffns_per_layer, dtype)
    model = ExactTransformer(cfg)

    def rows(names: Sequence[str]) -> list[int]:
        return [index[x] for x in names]

    readout = program.readout
    with torch.no_grad():
        for token, row in program.embedding.items():
            for label, value in row.items():
                model.embed.W_E[program.vocab.index(token), index[label]] = float(value)
        for f_idx, (_feature, row) in enumerate(program.positions.items()):
            for label, value in row.items():
                model.pos_embed.W_feat[f_idx, index[label]] = float(value)
        record = [_write_layer(block, layer, ffns, rows, cfg.torch_dtype)
                  for layer, block, ffns in zip(layers, model.blocks, ffns_per_layer, strict=True)]
        for k, (out, row) in enumerate(readout.weights.items()):
            for label, value in row.items():
                model.unembed.W_U[index[label], k] = float(value)
            model.unembed.b_U[k] = float(readout.bias.get(out, 0.0))
    cfg.metadata["cookbook"] = {"layers": record, "outputs": list(readout.weights)}
    model.check_finite()
    return model

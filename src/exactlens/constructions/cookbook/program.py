"""Programs over named residual dimensions, and their compilation into an ExactTransformer.

The Transformer Cookbook (Yang et al. 2025) states every recipe as a small FFN or
attention layer over a few named quantities, then assembles recipes with the routing
lemma (§8.2) and serial/parallel composition (§8.3). The compiler is that workflow, one
module per pass (as tracr's compiler is):

    pieces.py    piece (FFN / Head / Selector) over its own labels
    layers.py    ->  Layer (heads + FFN pieces)  ->  Program (labels fixed here)
    assemble.py  ->  compile(program, dtype)  ->  ExactTransformer with cfg.residual_labels set
    compose.py   serial / parallel / rename of layer stacks (§8)
    residual.py  run_on_residual, read: running a model on chosen label values

Imports run one way: pieces <- layers <- assemble, compose. This module is the overview and
the one import path of them all (``exactlens.constructions.cookbook.program`` and the
package ``exactlens.constructions.cookbook`` export every name below).

Pieces
------
``FFN(inputs, W_in, b_in, outputs, W_out, b_out, activation)``: hidden = act(x[inputs] @ W_in
+ b_in); it *adds* hidden @ W_out + b_out to the labels ``outputs`` (the residual
connection is always there; recipes that must replace a value cancel it, §4.2).
``FFN.build(hidden=[{"x": 1.0}, ...], b_in=[...], out={"y": [w per unit]}, b_out={"y": b})``
is the readable constructor.

``Head(q_inputs, W_Q, b_Q, k_inputs, W_K, b_K, v_inputs, outputs, W_OV, b_OV)``: the
score of query i for key j is exactly ``q_i . k_j`` with q = x[q_inputs] @ W_Q + b_Q and
k likewise (compile sets attn_scale = 1, so no hidden 1/sqrt(d) factor); the head adds
``sum_j w_ij (x_j[v_inputs] @ W_OV + b_OV)`` to ``outputs``. ``Head.build(query={"label":
[..d..]}, key=..., value={("out", "in"): w})`` is the readable constructor.

Both are immutable; ``piece.route(inputs=..., outputs=...)`` is the routing lemma
(``inputs={"x": {"a": 1, "b": -1}}`` feeds a - b where the piece read x; ``outputs={"y":
{"z": 2}}`` writes 2*y into z) and ``piece.relabel({"x": "a"})`` renames.

Layers and programs
-------------------
``Layer(heads=(...), ffns=(...), mask=, weighting=, length_scale=)``: one
ExactTransformer block. FFN pieces of a layer sit side by side (hidden units
concatenated, outputs summed), so they must share an activation (identity pieces are
converted to ReLU automatically). A layer without heads ignores its attention settings.
``Layer(..., ln1={slot: {label: w}}, ln2=...)`` makes that one layer pre-LN with the
selective layer norm of §5.3.3 (compile sets the per-layer normalization, ln_select and
W_select; the other layers stay LN-free, so such layers compose with every recipe).

``Program(vocab, embedding, positions, layers, readout, ...)``: ``embedding[token] =
{label: value}``, ``positions[feature] = {label: weight}`` for features named as in
exactlens.model.positional ("i", "1/(i+1)", "I[i=0]", ...), ``readout =
Readout(kind, weights={output: {label: w}}, bias={output: b})``. Labels are the union of
every label mentioned (first appearance order) unless ``labels`` fixes the order.

``compile(program, dtype="float64")`` builds the model: n_heads / d_head / d_mlp are the
maxima over layers (smaller layers padded with zero heads/units, which add nothing);
masks, weightings, length scales and activations that differ between layers need
``cfg.per_layer`` (else ExactLensError). ``model.cfg.metadata["cookbook"]`` records which
head index and which hidden-unit range each named piece got, layer by layer.

Assembly (§8): ``serial(a, b, ...)`` concatenates layer lists; ``parallel(a, b, ...)``
merges layer i of every operand into one layer (heads and FFN units side by side,
shorter operands padded with empty layers, which are identities thanks to the residual);
it refuses layers whose attention settings differ. ``rename(layers, mapping_or_prefix)``
relabels a whole stack (disjoint copies for parallel composition).

Running on chosen values: ``run_on_residual(model, {label: tensor[batch, pos]})`` runs the
real forward with the token embedding replaced by those values through the
``hook_embed`` hook (positional features still added), returning (logits, cache).
"""

from __future__ import annotations

from exactlens.constructions.cookbook.assemble import compile
from exactlens.constructions.cookbook.compose import parallel, rename, serial
from exactlens.constructions.cookbook.layers import Layer, Program, Readout
from exactlens.constructions.cookbook.pieces import F64, FFN, Head, Selector
from exactlens.constructions.cookbook.residual import read, residual_tensor, run_on_residual
from exactlens.model.config import ACTIVATIONS, LENGTH_SCALES, MASKS, WEIGHTINGS

__all__ = ["ACTIVATIONS", "F64", "FFN", "Head", "LENGTH_SCALES", "Layer", "MASKS", "Program", "Readout",
           "Selector", "WEIGHTINGS", "compile", "parallel", "read", "rename", "residual_tensor",
           "run_on_residual", "serial"]

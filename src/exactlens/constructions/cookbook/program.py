"""Programs over named residual dimensions, and their compilation into an ExactTransformer.

The Transformer Cookbook (Yang et al. 2025) states every recipe as a small FFN or
attention layer over a few named quantities, then assembles recipes with the routing
lemma (§8.2) and serial/parallel composition (§8.3). This module is that workflow:

    piece (FFN / Head) over its own labels  ->  Layer (heads + FFN pieces)  ->  Program
    ->  compile(program, dtype)  ->  ExactTransformer with cfg.residual_labels set

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

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from exactlens.dtypes import dtype_name
from exactlens.errors import ExactLensError
from exactlens.model import ExactConfig, ExactTransformer
from exactlens.model.config import ACTIVATIONS, LENGTH_SCALES, MASKS, WEIGHTINGS

F64 = torch.float64


def _tensor(values: Any, shape: tuple[int, ...], what: str) -> torch.Tensor:
    t = torch.as_tensor(values, dtype=F64).clone() if not isinstance(values, torch.Tensor) else values.to(F64)
    if tuple(t.shape) != shape:
        raise ExactLensError(f"{what} must have shape {shape}, got {tuple(t.shape)}")
    if not torch.isfinite(t).all():
        raise ExactLensError(f"{what} contains NaN or inf")
    return t


def _check_labels(labels: Sequence[str], what: str) -> tuple[str, ...]:
    labels = tuple(labels)
    for label in labels:
        if not isinstance(label, str) or not label:
            raise ExactLensError(f"{what}: residual labels must be non-empty strings, got {label!r}")
    if len(set(labels)) != len(labels):
        raise ExactLensError(f"{what}: labels repeat: {list(labels)}")
    return labels


LinearSpec = Mapping[str, Mapping[str, float]]
"""old label -> {new label: weight}; labels not mentioned map to themselves."""


def _route_rows(
    labels: tuple[str, ...], W: torch.Tensor, spec: LinearSpec | None
) -> tuple[tuple[str, ...], torch.Tensor]:
    """Rows of W are indexed by labels (a map read from the residual). Replacing each
    old input l by sum_new spec[l][new] * new gives rows over the new labels."""
    spec = spec or {}
    unknown = sorted(set(spec) - set(labels))
    if unknown:
        raise ExactLensError(f"routing names labels the piece does not use: {unknown}; it uses {list(labels)}")
    new_labels: list[str] = []
    for label in labels:
        for new in spec.get(label, {label: 1.0}):
            if new not in new_labels:
                new_labels.append(new)
    out = torch.zeros(len(new_labels), W.shape[1], dtype=F64)
    for row, label in enumerate(labels):
        for new, weight in spec.get(label, {label: 1.0}).items():
            out[new_labels.index(new)] += float(weight) * W[row]
    return tuple(new_labels), out


def _route_cols(
    labels: tuple[str, ...], W: torch.Tensor, b: torch.Tensor, spec: LinearSpec | None
) -> tuple[tuple[str, ...], torch.Tensor, torch.Tensor]:
    """Columns of W (and entries of b) are indexed by written labels."""
    new_labels, W_t = _route_rows(labels, torch.cat([W, b.unsqueeze(0)], 0).T, spec)
    W_t = W_t.T
    return new_labels, W_t[:-1].clone(), W_t[-1].clone()


def _rename_spec(mapping: Mapping[str, str], labels: Iterable[str]) -> dict[str, dict[str, float]]:
    return {label: {mapping[label]: 1.0} for label in labels if label in mapping}


# ----------------------------------------------------------------------------- pieces


@dataclass(frozen=True, eq=False)
class FFN:
    """A feed-forward piece: adds act(x[inputs] @ W_in + b_in) @ W_out + b_out to x[outputs]."""

    inputs: tuple[str, ...]
    W_in: torch.Tensor  # [len(inputs), d_hidden]
    b_in: torch.Tensor  # [d_hidden]
    outputs: tuple[str, ...]
    W_out: torch.Tensor  # [d_hidden, len(outputs)]
    b_out: torch.Tensor  # [len(outputs)]
    activation: str = "relu"
    name: str = "ffn"

    def __post_init__(self) -> None:
        object.__setattr__(self, "inputs", _check_labels(self.inputs, f"FFN {self.name} inputs"))
        object.__setattr__(self, "outputs", _check_labels(self.outputs, f"FFN {self.name} outputs"))
        h = torch.as_tensor(self.b_in).numel()
        object.__setattr__(self, "W_in", _tensor(self.W_in, (len(self.inputs), h), f"FFN {self.name} W_in"))
        object.__setattr__(self, "b_in", _tensor(self.b_in, (h,), f"FFN {self.name} b_in"))
        object.__setattr__(self, "W_out", _tensor(self.W_out, (h, len(self.outputs)), f"FFN {self.name} W_out"))
        object.__setattr__(self, "b_out", _tensor(self.b_out, (len(self.outputs),), f"FFN {self.name} b_out"))
        if self.activation not in ACTIVATIONS:
            raise ExactLensError(f"FFN {self.name}: activation {self.activation!r}; choose one of {ACTIVATIONS}")

    @property
    def d_hidden(self) -> int:
        return self.W_in.shape[1]

    @classmethod
    def build(
        cls,
        hidden: Sequence[Mapping[str, float]],
        out: Mapping[str, Sequence[float]],
        b_in: Sequence[float] | None = None,
        b_out: Mapping[str, float] | None = None,
        activation: str = "relu",
        name: str = "ffn",
    ) -> FFN:
        """hidden[u] = {label: weight}: pre-activation of unit u; out[label] = one weight per unit."""
        inputs: list[str] = []
        for row in hidden:
            inputs += [label for label in row if label not in inputs]
        outputs = list(out) + [label for label in (b_out or {}) if label not in out]
        W_in = torch.zeros(len(inputs), len(hidden), dtype=F64)
        for unit, row in enumerate(hidden):
            for label, weight in row.items():
                W_in[inputs.index(label), unit] = float(weight)
        W_out = torch.zeros(len(hidden), len(outputs), dtype=F64)
        for label, weights in out.items():
            if len(weights) != len(hidden):
                raise ExactLensError(f"FFN {name}: out[{label!r}] has {len(weights)} weights for {len(hidden)} units")
            W_out[:, outputs.index(label)] = torch.as_tensor(weights, dtype=F64)
        bias = torch.zeros(len(outputs), dtype=F64)
        for label, value in (b_out or {}).items():
            bias[outputs.index(label)] = float(value)
        b = torch.zeros(len(hidden), dtype=F64) if b_in is None else torch.as_tensor(b_in, dtype=F64)
        return cls(tuple(inputs), W_in, b, tuple(outputs), W_out, bias, activation, name)

    def route(self, inputs: LinearSpec | None = None, outputs: LinearSpec | None = None) -> FFN:
        """Routing lemma (§8.2): x -> C f(B x), with B, C given label by label."""
        new_in, W_in = _route_rows(self.inputs, self.W_in, inputs)
        new_out, W_out, b_out = _route_cols(self.outputs, self.W_out, self.b_out, outputs)
        return replace(self, inputs=new_in, W_in=W_in, outputs=new_out, W_out=W_out, b_out=b_out)

    def relabel(self, mapping: Mapping[str, str], name: str | None = None) -> FFN:
        piece = self.route(_rename_spec(mapping, self.inputs), _rename_spec(mapping, self.outputs))
        return replace(piece, name=name or self.name)

    def with_activation(self, activation: str) -> FFN:
        """Identity pieces re-expressed with ReLU units (u = relu(u) - relu(-u))."""
        if activation == self.activation:
            return self
        if self.activation == "identity" and activation == "relu":
            return replace(
                self,
                W_in=torch.cat([self.W_in, -self.W_in], 1),
                b_in=torch.cat([self.b_in, -self.b_in]),
                W_out=torch.cat([self.W_out, -self.W_out], 0),
                activation="relu",
            )
        raise ExactLensError(
            f"FFN {self.name} uses {self.activation!r} units and cannot share a layer with {activation!r} units "
            "(only identity pieces convert, to relu)"
        )

    def __call__(self, values: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Reference evaluation in float64 (what the piece adds to each output label)."""
        x = torch.stack([torch.as_tensor(values[label], dtype=F64) for label in self.inputs], -1)
        act = {"relu": torch.relu, "gelu": torch.nn.functional.gelu, "identity": lambda t: t}[self.activation]
        y = act(x @ self.W_in + self.b_in) @ self.W_out + self.b_out
        return {label: y[..., k] for k, label in enumerate(self.outputs)}


@dataclass(frozen=True, eq=False)
class Head:
    """An attention head: score(i, j) = q_i . k_j (no hidden scaling); adds the weighted
    sum of v_j = x_j[v_inputs] @ W_OV + b_OV to x_i[outputs]."""

    q_inputs: tuple[str, ...]
    W_Q: torch.Tensor  # [len(q_inputs), d]
    b_Q: torch.Tensor  # [d]
    k_inputs: tuple[str, ...]
    W_K: torch.Tensor  # [len(k_inputs), d]
    b_K: torch.Tensor  # [d]
    v_inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    W_OV: torch.Tensor  # [len(v_inputs), len(outputs)]
    b_OV: torch.Tensor  # [len(outputs)]
    name: str = "head"

    def __post_init__(self) -> None:
        n = self.name
        for attr in ("q_inputs", "k_inputs", "v_inputs", "outputs"):
            object.__setattr__(self, attr, _check_labels(getattr(self, attr), f"head {n} {attr}"))
        d = torch.as_tensor(self.b_Q).numel()
        object.__setattr__(self, "W_Q", _tensor(self.W_Q, (len(self.q_inputs), d), f"head {n} W_Q"))
        object.__setattr__(self, "b_Q", _tensor(self.b_Q, (d,), f"head {n} b_Q"))
        object.__setattr__(self, "W_K", _tensor(self.W_K, (len(self.k_inputs), d), f"head {n} W_K"))
        object.__setattr__(self, "b_K", _tensor(self.b_K, (d,), f"head {n} b_K"))
        shape = (len(self.v_inputs), len(self.outputs))
        object.__setattr__(self, "W_OV", _tensor(self.W_OV, shape, f"head {n} W_OV"))
        object.__setattr__(self, "b_OV", _tensor(self.b_OV, (len(self.outputs),), f"head {n} b_OV"))

    @property
    def d_qk(self) -> int:
        return self.W_Q.shape[1]

    @classmethod
    def build(
        cls,
        query: Mapping[str, Sequence[float]],
        key: Mapping[str, Sequence[float]],
        value: Mapping[tuple[str, str], float],
        q_bias: Sequence[float] | None = None,
        k_bias: Sequence[float] | None = None,
        v_bias: Mapping[str, float] | None = None,
        name: str = "head",
    ) -> Head:
        """query[label] = that label's row of W_Q (length d, the same d for all rows and
        for key); value[(out, in)] = weight of x[in] in what is written to out."""
        rows = list(query.values()) + list(key.values())
        if q_bias is not None:
            rows.append(q_bias)
        if k_bias is not None:
            rows.append(k_bias)
        if not rows:
            d = 1
        else:
            d = len(rows[0])
            if any(len(r) != d for r in rows):
                raise ExactLensError(f"head {name}: query/key rows and biases must all have one length")

        def mat(spec: Mapping[str, Sequence[float]]) -> tuple[tuple[str, ...], torch.Tensor]:
            labels = tuple(spec)
            W = torch.tensor([list(map(float, spec[label])) for label in labels], dtype=F64).reshape(len(labels), d)
            return labels, W

        q_in, W_Q = mat(query)
        k_in, W_K = mat(key)
        v_in: list[str] = []
        outs: list[str] = []
        for out_label, in_label in value:
            v_in += [in_label] if in_label not in v_in else []
            outs += [out_label] if out_label not in outs else []
        outs += [label for label in (v_bias or {}) if label not in outs]
        W_OV = torch.zeros(len(v_in), len(outs), dtype=F64)
        for (out_label, in_label), w in value.items():
            W_OV[v_in.index(in_label), outs.index(out_label)] = float(w)
        b_OV = torch.zeros(len(outs), dtype=F64)
        for label, b in (v_bias or {}).items():
            b_OV[outs.index(label)] = float(b)

        def vec(b: Sequence[float] | None) -> torch.Tensor:
            return torch.zeros(d, dtype=F64) if b is None else torch.as_tensor(b, dtype=F64)

        return cls(q_in, W_Q, vec(q_bias), k_in, W_K, vec(k_bias), tuple(v_in), tuple(outs), W_OV, b_OV, name)

    def route(
        self,
        inputs: LinearSpec | None = None,
        outputs: LinearSpec | None = None,
    ) -> Head:
        """Routing lemma (§8.2) for attention: every read (query, key, value) goes through B,
        the written values through C. Labels a spec does not mention stay as they are."""
        inputs = inputs or {}
        q_in, W_Q = _route_rows(self.q_inputs, self.W_Q, {k: v for k, v in inputs.items() if k in self.q_inputs})
        k_in, W_K = _route_rows(self.k_inputs, self.W_K, {k: v for k, v in inputs.items() if k in self.k_inputs})
        v_in, W_OV = _route_rows(self.v_inputs, self.W_OV, {k: v for k, v in inputs.items() if k in self.v_inputs})
        unknown = sorted(set(inputs) - set(self.q_inputs) - set(self.k_inputs) - set(self.v_inputs))
        if unknown:
            raise ExactLensError(f"head {self.name}: routing names labels it does not read: {unknown}")
        outs, W_OV, b_OV = _route_cols(self.outputs, W_OV, self.b_OV, outputs)
        return replace(
            self, q_inputs=q_in, W_Q=W_Q, k_inputs=k_in, W_K=W_K, v_inputs=v_in, outputs=outs, W_OV=W_OV, b_OV=b_OV
        )

    def relabel(self, mapping: Mapping[str, str], name: str | None = None) -> Head:
        reads = set(self.q_inputs) | set(self.k_inputs) | set(self.v_inputs)
        head = self.route(_rename_spec(mapping, reads), _rename_spec(mapping, self.outputs))
        return replace(head, name=name or self.name)

    def scaled(self, factor: float) -> Head:
        """Scores multiplied by factor (W_Q and b_Q scaled), e.g. the gap scaling of §5.7."""
        if not (math.isfinite(factor) and factor > 0):
            raise ExactLensError(f"head {self.name}: score factor must be finite and > 0, got {factor!r}")
        return replace(self, W_Q=self.W_Q * factor, b_Q=self.b_Q * factor)


@dataclass(frozen=True, eq=False)
class Selector:
    """Selective layer norm (§5.3.3): the sublayer reads LN over m slots, slot_k = sum_l
    W[l, k] x[inputs[l]], computed as the cookbook's m-vector LN (gain 1, bias 0, eps 0).
    ``Selector.build({slot: {label: weight}})``. Slots are residual labels; the LN output
    is zero on every other label, so the sublayer's pieces may read only the slots."""

    inputs: tuple[str, ...]
    slots: tuple[str, ...]
    W: torch.Tensor  # [len(inputs), len(slots)]

    def __post_init__(self) -> None:
        object.__setattr__(self, "inputs", _check_labels(self.inputs, "selector inputs"))
        object.__setattr__(self, "slots", _check_labels(self.slots, "selector slots"))
        if len(self.slots) < 2:
            raise ExactLensError(f"a layer-norm selector needs >= 2 slots (LN of one value is 0/0), got {self.slots}")
        object.__setattr__(self, "W", _tensor(self.W, (len(self.inputs), len(self.slots)), "selector W"))

    @classmethod
    def build(cls, spec: Mapping[str, Mapping[str, float]]) -> Selector:
        if isinstance(spec, Selector):
            return spec
        if not isinstance(spec, Mapping) or not spec:
            raise ExactLensError(f"a selector is {{slot label: {{input label: weight}}}}, got {spec!r}")
        inputs: list[str] = []
        for row in spec.values():
            inputs += [label for label in row if label not in inputs]
        W = torch.zeros(len(inputs), len(spec), dtype=F64)
        for k, row in enumerate(spec.values()):
            for label, weight in row.items():
                W[inputs.index(label), k] = float(weight)
        return cls(tuple(inputs), tuple(spec), W)

    def relabel(self, mapping: Mapping[str, str]) -> Selector:
        inputs = tuple(mapping.get(x, x) for x in self.inputs)
        return Selector(inputs, tuple(mapping.get(x, x) for x in self.slots), self.W)

    def __call__(self, values: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Reference in float64: LN of the m slot values (centered, divided by their rms)."""
        x = torch.stack([torch.as_tensor(values[label], dtype=F64) for label in self.inputs], -1) @ self.W
        x = x - x.mean(-1, keepdim=True)
        x = x / x.pow(2).mean(-1, keepdim=True).sqrt()
        return {label: x[..., k] for k, label in enumerate(self.slots)}


# ----------------------------------------------------------------------------- layers, programs


@dataclass(frozen=True)
class Layer:
    """One block: attention heads (summed), then FFN pieces (side by side).

    ``ln1`` / ``ln2``: selectors (``{slot: {label: weight}}`` or a Selector) make the layer
    pre-LN with selective layer norm (§5.3.3): c = x + Att(LN(S1 x)), a = c + FFN(LN(S2 c)).
    Its heads may then read only ln1's slots, its FFN pieces only ln2's. A sublayer without
    pieces reuses the other selector (an LN must stay finite even when nothing reads it)."""

    heads: tuple[Head, ...] = ()
    ffns: tuple[FFN, ...] = ()
    mask: str = "none"
    weighting: str = "softmax"
    length_scale: str = "none"
    ln1: Selector | Mapping[str, Mapping[str, float]] | None = None
    ln2: Selector | Mapping[str, Mapping[str, float]] | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "heads", tuple(self.heads))
        object.__setattr__(self, "ffns", tuple(self.ffns))
        for attr in ("ln1", "ln2"):
            if getattr(self, attr) is not None:
                object.__setattr__(self, attr, Selector.build(getattr(self, attr)))
        if self.pre_ln:
            self._check_reads(self.ln1 if self.heads else None, self.heads, "ln1", "heads")
            self._check_reads(self.ln2 if self.ffns else None, self.ffns, "ln2", "FFN pieces")
        for h in self.heads:
            if not isinstance(h, Head):
                raise ExactLensError(f"Layer.heads takes Head pieces, got {type(h).__name__}")
        for f in self.ffns:
            if not isinstance(f, FFN):
                raise ExactLensError(f"Layer.ffns takes FFN pieces, got {type(f).__name__}")
        for name, value, allowed in (
            ("mask", self.mask, MASKS),
            ("weighting", self.weighting, WEIGHTINGS),
            ("length_scale", self.length_scale, LENGTH_SCALES),
        ):
            if value not in allowed:
                raise ExactLensError(f"Layer {name}={value!r}; choose one of {', '.join(allowed)}")

    @property
    def activation(self) -> str | None:
        """The layer's activation: relu if any piece is relu (identity pieces convert), else the common one."""
        kinds = {f.activation for f in self.ffns}
        if not kinds:
            return None
        if kinds <= {"identity"}:
            return "identity"
        real = kinds - {"identity"}
        if len(real) > 1:
            raise ExactLensError(f"FFN pieces of one layer need one activation, got {sorted(kinds)}")
        (kind,) = real
        if "identity" in kinds and kind != "relu":
            raise ExactLensError(f"identity pieces can only join relu pieces, not {kind!r}")
        return kind

    @property
    def attention(self) -> tuple[str, str, str]:
        return (self.mask, self.weighting, self.length_scale)

    @property
    def pre_ln(self) -> bool:
        """A selective pre-LN layer (some selector given)."""
        return self.ln1 is not None or self.ln2 is not None

    def _check_reads(self, selector: Selector | None, pieces: Sequence[Any], which: str, what: str) -> None:
        if not pieces:
            return
        if selector is None:
            raise ExactLensError(
                f"a pre-LN layer's {what} read LN output: give {which}={{slot: {{label: weight}}}} too"
            )
        reads = set()
        for p in pieces:
            reads |= set(getattr(p, "inputs", ())) | set(getattr(p, "q_inputs", ())) | set(getattr(p, "k_inputs", ()))
            reads |= set(getattr(p, "v_inputs", ()))
        stray = sorted(reads - set(selector.slots))
        if stray:
            raise ExactLensError(
                f"the {what} of a pre-LN layer read {stray}, which {which} does not select (they read 0 there); "
                f"{which} selects {list(selector.slots)}"
            )

    def selectors(self) -> tuple[Selector, Selector] | None:
        """(ln1, ln2) as compiled: a missing one reuses the other; None for an LN-free layer."""
        if not self.pre_ln:
            return None
        return (self.ln1 or self.ln2, self.ln2 or self.ln1)

    def labels(self) -> list[str]:
        seen: list[str] = []
        for sel in (self.ln1, self.ln2):
            if sel is not None:
                seen += [x for x in (*sel.inputs, *sel.slots) if x not in seen]
        for h in self.heads:
            seen += [x for x in (*h.q_inputs, *h.k_inputs, *h.v_inputs, *h.outputs) if x not in seen]
        for f in self.ffns:
            seen += [x for x in (*f.inputs, *f.outputs) if x not in seen]
        return seen


@dataclass(frozen=True)
class Readout:
    """kind: "logits" / "per_position" (linear read at every position) or "sigmoid"
    (one output, read at ``position``); weights[output] = {label: w}."""

    weights: Mapping[str, Mapping[str, float]]
    bias: Mapping[str, float] = field(default_factory=dict)
    kind: str = "per_position"
    position: int = 0

    def __post_init__(self) -> None:
        if not self.weights:
            raise ExactLensError("a readout needs at least one output")
        if self.kind not in ("logits", "per_position", "sigmoid"):
            raise ExactLensError(f"readout kind {self.kind!r}; choose logits, per_position or sigmoid")
        if self.kind == "sigmoid" and len(self.weights) != 1:
            raise ExactLensError("a sigmoid readout has exactly one output")
        extra = sorted(set(self.bias) - set(self.weights))
        if extra:
            raise ExactLensError(f"readout bias names outputs without weights: {extra}")


@dataclass(frozen=True)
class Program:
    """Everything compile needs: embedding, positions, layers, readout, layer norm."""

    vocab: tuple[str, ...]
    embedding: Mapping[str, Mapping[str, float]]
    layers: tuple[Layer, ...]
    readout: Readout
    positions: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    labels: tuple[str, ...] | None = None
    normalization: str = "none"
    ln_eps: float = 0.0
    hard_tie_tolerance: float = 0.0
    name: str = "cookbook"

    def __post_init__(self) -> None:
        object.__setattr__(self, "vocab", tuple(self.vocab))
        object.__setattr__(self, "layers", tuple(self.layers))
        if not self.vocab or len(set(self.vocab)) != len(self.vocab):
            raise ExactLensError(f"vocab must be non-empty and without repeats, got {list(self.vocab)}")
        unknown = sorted(set(self.embedding) - set(self.vocab))
        if unknown:
            raise ExactLensError(f"embedding names tokens outside the vocab: {unknown}")
        if not self.layers:
            raise ExactLensError("a program needs at least one layer (Layer() is the identity)")

    def residual_labels(self) -> tuple[str, ...]:
        seen: list[str] = []

        def add(labels: Iterable[str]) -> None:
            seen.extend(x for x in labels if x not in seen)

        for row in self.embedding.values():
            add(row)
        for row in self.positions.values():
            add(row)
        for layer in self.layers:
            add(layer.labels())
        for row in self.readout.weights.values():
            add(row)
        if self.labels is None:
            return tuple(seen)
        fixed = _check_labels(self.labels, "Program.labels")
        missing = [x for x in seen if x not in fixed]
        if missing:
            raise ExactLensError(f"Program.labels misses labels the program uses: {missing}")
        return fixed


# ----------------------------------------------------------------------------- compile


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


def compile(program: Program, dtype: str = "float64") -> ExactTransformer:  # noqa: A001 - the tracr name
    """Assemble the program's weights into an ExactTransformer (see the module docstring); ``dtype``:
    "float32", "float64" or the torch dtype."""
    dtype = dtype_name(dtype)
    labels = program.residual_labels()
    index = {label: k for k, label in enumerate(labels)}
    layers = program.layers
    acts = [layer.activation for layer in layers]
    has_heads = [bool(layer.heads) for layer in layers]
    has_ffn = [bool(layer.ffns) for layer in layers]
    mask = _layer_switch(layers, has_heads, [x.mask for x in layers], "attention_mask") or "none"
    weighting = _layer_switch(layers, has_heads, [x.weighting for x in layers], "attention_weighting") or "softmax"
    length = _layer_switch(layers, has_heads, [x.length_scale for x in layers], "attn_length_scale") or "none"
    act_fn = _layer_switch(layers, has_ffn, acts, "act_fn") or "relu"
    ffns_per_layer = [
        [f.with_activation(a) if a else f for f in layer.ffns] for layer, a in zip(layers, acts, strict=False)
    ]
    d_mlp = max(sum(f.d_hidden for f in fs) for fs in ffns_per_layer)
    normalization = _normalization(program)
    n_heads = max(1, max(len(layer.heads) for layer in layers))
    d_head = max([1] + [max(h.d_qk, len(h.outputs)) for layer in layers for h in layer.heads])
    readout = program.readout
    out_names = tuple(readout.weights)
    cfg = ExactConfig(
        d_model=len(labels),
        n_layers=len(layers),
        d_vocab=len(program.vocab),
        n_heads=n_heads,
        d_head=d_head,
        d_mlp=d_mlp,
        d_vocab_out=len(out_names),
        attention_mask=mask,
        attention_weighting=weighting,
        attn_scale=1.0,
        attn_length_scale=length,
        hard_tie_tolerance=program.hard_tie_tolerance,
        normalization=normalization,
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
    model = ExactTransformer(cfg)
    dt = cfg.torch_dtype

    def rows(names: Sequence[str]) -> list[int]:
        return [index[x] for x in names]

    record = []
    with torch.no_grad():
        for token, row in program.embedding.items():
            for label, value in row.items():
                model.embed.W_E[program.vocab.index(token), index[label]] = float(value)
        for f_idx, (_feature, row) in enumerate(program.positions.items()):
            for label, value in row.items():
                model.pos_embed.W_feat[f_idx, index[label]] = float(value)
        for layer, block, ffns in zip(layers, model.blocks, ffns_per_layer, strict=True):
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
            record.append(entry)
        for k, (out, row) in enumerate(readout.weights.items()):
            for label, value in row.items():
                model.unembed.W_U[index[label], k] = float(value)
            model.unembed.b_U[k] = float(readout.bias.get(out, 0.0))
    cfg.metadata["cookbook"] = {"layers": record, "outputs": list(out_names)}
    model.check_finite()
    return model


# ----------------------------------------------------------------------------- assembly (§8)


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


# ----------------------------------------------------------------------------- running on chosen values


def residual_tensor(model: ExactTransformer, values: Mapping[str, Any]) -> torch.Tensor:
    """[batch, pos, d_model] with the given labels set (others 0); values broadcast to [batch, pos]."""
    labels = model.cfg.residual_labels
    if labels is None:
        raise ExactLensError("the model has no residual labels")
    unknown = sorted(set(values) - set(labels))
    if unknown:
        raise ExactLensError(f"no residual dimensions named {unknown}; have {list(labels)}")
    dt = model.cfg.torch_dtype
    tensors = {k: torch.as_tensor(v, dtype=dt) for k, v in values.items()}
    if not tensors:
        raise ExactLensError("give at least one label's values")
    shape = torch.broadcast_shapes(*(t.shape for t in tensors.values()))
    if len(shape) != 2:
        raise ExactLensError(f"values must broadcast to [batch, pos], got shape {tuple(shape)}")
    x = torch.zeros(*shape, len(labels), dtype=dt)
    for label, t in tensors.items():
        x[..., labels.index(label)] = t.expand(shape)
    return x


def run_on_residual(
    model: ExactTransformer, values: Mapping[str, Any], n_positions: torch.Tensor | None = None, **cache_kwargs: Any
) -> tuple[torch.Tensor, Any]:
    """Run the real forward with the token embedding replaced by ``values`` (through the
    hook_embed hook; positional features are still added). Returns (output, ActivationCache)."""
    x = residual_tensor(model, values)
    tokens = torch.zeros(x.shape[:2], dtype=torch.long)

    def put(_act: torch.Tensor, hook: Any) -> torch.Tensor:
        return x

    with model.hooks(fwd_hooks=[("hook_embed", put)]):
        return model.run_with_cache(tokens, n_positions=n_positions, **cache_kwargs)


def read(cache: Any, model: ExactTransformer, hook: str, label: str) -> torch.Tensor:
    """cache[hook][..., dimension named label], e.g. read(cache, model, "blocks.0.hook_resid_post", "y")."""
    labels = model.cfg.residual_labels
    if label not in labels:
        raise ExactLensError(f"no residual dimension named {label!r}; have {list(labels)}")
    return cache[hook][..., labels.index(label)]

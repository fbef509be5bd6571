"""The Cookbook compiler's first pass: pieces over named residual labels (:class:`FFN`, :class:`Head`, the
selective layer norm's :class:`Selector`), each immutable, with routing (§8.2) and relabelling.

The overview of the whole compiler (pieces -> layers and programs -> assembly into weights) is
:mod:`exactlens.constructions.cookbook.program`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch

from exactlens.errors import ExactLensError
from exactlens.model.config import ACTIVATIONS

F64 = torch.float64


def _tensor(values: Any, shape: tuple[int, ...], what: str) -> torch.Tensor:
    t = torch.as_tensor(values, dtype=F64).clone() if not isinstance(values, torch.Tensor) else values.to(F64)
    if tuple(t.shape) != shape:
        raise ExactLensError(f"{what} must have shape {shape}, got {tuple(t.shape)}")
    if not torch.isfinite(t).all():
        raise ExactLensError(f"{what} contains NaN or inf")
    return t


def check_labels(labels: Sequence[str], what: str) -> tuple[str, ...]:
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
        object.__setattr__(self, "inputs", check_labels(self.inputs, f"FFN {self.name} inputs"))
        object.__setattr__(self, "outputs", check_labels(self.outputs, f"FFN {self.name} outputs"))
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
            object.__setattr__(self, attr, check_labels(getattr(self, attr), f"head {n} {attr}"))
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
        object.__setattr__(self, "inputs", check_labels(self.inputs, "selector inputs"))
        object.__setattr__(self, "slots", check_labels(self.slots, "selector slots"))
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

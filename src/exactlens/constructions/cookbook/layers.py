"""The Cookbook compiler's second pass: pieces grouped into :class:`Layer` s (one ExactTransformer block
each) and a :class:`Program` (vocabulary, embedding, positions, layers, :class:`Readout`); the residual
labels are fixed here. Overview: :mod:`exactlens.constructions.cookbook.program`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from exactlens.constructions.cookbook.pieces import FFN, Head, Selector, check_labels
from exactlens.errors import ExactLensError
from exactlens.model.config import LENGTH_SCALES, MASKS, WEIGHTINGS


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
        fixed = check_labels(self.labels, "Program.labels")
        missing = [x for x in seen if x not in fixed]
        if missing:
            raise ExactLensError(f"Program.labels misses labels the program uses: {missing}")
        return fixed

"""The computational graph of a model: which components write into the residual stream, which read
from it, and the edges between them (the granularity of circuit analysis, as in ACDC and edge
attribution patching).

Senders write an output into the stream: ``embed`` (token embedding), ``pos`` (positions), every
head ``L{l}.H{h}``, every MLP ``L{l}.MLP``. Receivers read the sum of the senders before them:
heads (at ``qkv`` granularity their queries, keys and values separately: ``L{l}.H{h}.q`` ...),
MLPs and ``output`` (the unembedding). An edge is (sender, receiver): the part of the receiver's
input that the sender wrote.

Layer norm decides the shape. Without it or with pre-LN the stream is a sum and every earlier
sender is an input of every later receiver (pre-LN applies the receiver's LN to the sum). A post-LN
sublayer *replaces* the stream by LN(stream + sublayer): the norm is then a node of its own
(``L{l}.LN1``, ``L{l}.LN2``) that reads the senders of its segment and is the only sender the next
segment starts from, so a post-LN model's graph is a chain through its norms. An FFN without
residual (``mlp_residual=False``) also restarts the stream with its own output.
Attention's output bias b_O is added to the stream as a constant, never an edge.

At ``position`` granularity (as auto-circuit resolves edges) every qkv edge is split into one edge
per token position of words of one length, ``SENDER->RECEIVER.q@P``: the part of the receiver's
input at position P that the sender wrote there. The graph then holds ``n_positions`` copies of each
qkv edge.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

from exactlens.errors import ExactLensError

GRANULARITIES = ("head", "qkv")
"""The granularities of every edge graph (the diff's circuit part offers these)."""
POSITION = "position"
EDGE_GRANULARITIES = (*GRANULARITIES, POSITION)
"""``circuit`` and ``discover`` also offer position-resolved edges (words of one length)."""
SLOTS = ("q", "k", "v")


@dataclass(frozen=True, order=True)
class Edge:
    """The part of ``receiver``'s input (``slot`` q/k/v of a head at qkv granularity; at ``position``
    only the token ``position``) written by ``sender``."""

    sender: str
    receiver: str
    slot: str | None = None
    position: int | None = None

    @property
    def name(self) -> str:
        return f"{self.sender}->{self.target}" + ("" if self.position is None else f"@{self.position}")

    @property
    def whole(self) -> Edge:
        """The edge over every position (itself when it has none)."""
        return self if self.position is None else Edge(self.sender, self.receiver, self.slot)

    @property
    def target(self) -> str:
        """The receiving input: a node, or ``node.slot``."""
        return self.receiver if self.slot is None else f"{self.receiver}.{self.slot}"

    @classmethod
    def parse(cls, text: str) -> Edge:
        if "->" not in text:
            raise ExactLensError(f"an edge is written 'SENDER->RECEIVER[.q|.k|.v]', got {text!r}")
        sender, target = text.split("->", 1)
        position = None
        if "@" in target:
            target, _, at = target.rpartition("@")
            if not at.isdigit():
                raise ExactLensError(f"an edge's position is written '@P' with P a whole number, got {text!r}")
            position = int(at)
        receiver, _, slot = target.rpartition(".") if target.endswith((".q", ".k", ".v")) else (target, "", "")
        return cls(sender, receiver, slot or None, position)


@dataclass(frozen=True)
class Step:
    """One node in computation order: what it is (``kind``: embed, pos, head, mlp, norm, output), which
    layer/head it sits in, and the senders it reads (empty for the embeddings)."""

    node: str
    kind: str
    layer: int | None
    head: int | None
    reads: tuple[str, ...]
    which: str | None = None  # norm: "ln1"/"ln2"


@dataclass
class ModelGraph:
    """Every node of a model in computation order, and its edges at one granularity."""

    steps: list[Step]
    granularity: str
    edges: list[Edge] = field(default_factory=list)
    n_positions: int | None = None  # position granularity: the words' number of token positions

    @property
    def nodes(self) -> list[str]:
        return [s.node for s in self.steps]

    @property
    def senders(self) -> list[str]:
        return [s.node for s in self.steps if s.kind != "output"]

    def step(self, node: str) -> Step:
        for s in self.steps:
            if s.node == node:
                return s
        raise ExactLensError(f"the model has no node {node!r}; its nodes are {self.nodes}")

    def edges_into(self, node: str) -> list[Edge]:
        return [e for e in self.edges if e.receiver == node]

    @cached_property
    def edge_set(self) -> frozenset[Edge]:
        """The edges as a set (built once: ACDC checks every patched edge of every trial forward)."""
        return frozenset(self.edges)

    def check_edge(self, edge: Edge) -> Edge:
        if edge not in self.edge_set:
            raise ExactLensError(f"{edge.name} is not an edge of this model at {self.granularity} granularity")
        return edge


def slots_of(step: Step, granularity: str) -> tuple[str | None, ...]:
    return SLOTS if step.kind == "head" and granularity in ("qkv", POSITION) else (None,)


def model_graph(model, granularity: str = "head", n_positions: int | None = None) -> ModelGraph:
    """The graph of an ExactTransformer (see the module docstring); ``n_positions``: the number of token
    positions of the words (position granularity only)."""
    if granularity not in EDGE_GRANULARITIES:
        raise ExactLensError(f"granularity {granularity!r} is unknown; choose one of {', '.join(EDGE_GRANULARITIES)}")
    if (granularity == POSITION) != (n_positions is not None):
        raise ExactLensError("position granularity needs the words' number of token positions (and only it does)")
    if n_positions is not None and (isinstance(n_positions, bool) or not isinstance(n_positions, int)
                                    or n_positions < 1):
        raise ExactLensError(f"the number of token positions must be an integer >= 1, got {n_positions!r}")
    cfg = model.cfg
    steps: list[Step] = [Step("embed", "embed", None, None, ())]
    stream = ["embed"]
    if cfg.learned_positions or cfg.positional_features:
        steps.append(Step("pos", "pos", None, None, ()))
        stream.append("pos")
    norms = cfg.per_layer("normalization")
    for layer in range(cfg.n_layers):
        post = norms[layer] == "post"
        before = tuple(stream)
        heads = [f"L{layer}.H{h}" for h in range(cfg.n_heads)]
        steps += [Step(name, "head", layer, h, before) for h, name in enumerate(heads)]
        stream += heads
        if post:
            steps.append(Step(f"L{layer}.LN1", "norm", layer, None, tuple(stream), "ln1"))
            stream = [f"L{layer}.LN1"]
        if cfg.d_mlp == 0:
            continue
        mlp = f"L{layer}.MLP"
        steps.append(Step(mlp, "mlp", layer, None, tuple(stream)))
        if not cfg.mlp_residual:
            stream = [mlp]
            continue
        stream.append(mlp)
        if post:
            steps.append(Step(f"L{layer}.LN2", "norm", layer, None, tuple(stream), "ln2"))
            stream = [f"L{layer}.LN2"]
    steps.append(Step("output", "output", None, None, tuple(stream)))
    positions = (None,) if n_positions is None else tuple(range(n_positions))
    edges = [Edge(sender, s.node, slot, p) for s in steps for slot in slots_of(s, granularity) for sender in s.reads
             for p in positions]
    return ModelGraph(steps, granularity, edges, n_positions)

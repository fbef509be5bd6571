"""Helpers to write constructions the way papers state them.

Papers write a layer as matrices acting on column vectors: q = W^Q a,
v = W^V a with W^V in R^{d x d} (no separate output matrix). In the
HookedTransformer format, q = a @ W_Q[h] + b_Q[h] and the head writes
z @ W_O[h]. A paper head with full value matrix W^V maps to d_head = d_model,
W_V[h] = (W^V)^T and W_O[h] = I; a query/key row vector becomes column 0 of
W_Q[h]/W_K[h]. Scores are divided by sqrt(d_head) = sqrt(d), as in the papers.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from exactlens.errors import ExactLensError
from exactlens.model import ExactConfig, ExactTransformer


def token_labels(vocab: tuple[str, ...]) -> tuple[str, ...]:
    """The indicator feature of each token: "0" -> I[w_i=0], "[CLS]" -> I[w_i=CLS]."""
    return tuple(f"I[w_i={token.strip('[]')}]" for token in vocab)


def labelled_config(
    name: str,
    labels: tuple[str, ...],
    vocab: tuple[str, ...],
    *,
    layers: int,
    heads: int,
    d_mlp: int,
    positions: tuple[str, ...],
    dtype: str,
    metadata: dict,
    **switches,
) -> ExactConfig:
    """The common shape of a hand-built membership model: a residual of named features
    (d_model = d_head = len(labels), so scores are divided by sqrt(d) as in the papers), one
    token per vocabulary entry, softmax attention over every position, a ReLU FFN and a
    sigmoid at [CLS] (position 0). ``switches`` override any ExactConfig field."""
    fields = dict(
        d_model=len(labels),
        n_layers=layers,
        n_heads=heads,
        d_head=len(labels),
        d_mlp=d_mlp,
        d_vocab=len(vocab),
        vocab=vocab,
        positional_features=positions,
        attention_mask="none",
        attention_weighting="softmax",
        act_fn="relu",
        readout="sigmoid",
        readout_position=0,
        residual_labels=labels,
        dtype=dtype,
        model_name=name,
        metadata=metadata,
    )
    return ExactConfig(**{**fields, **switches})


class LabelledModel:
    """An ExactTransformer whose residual dimensions are addressed by label."""

    def __init__(self, cfg: ExactConfig, model: ExactTransformer | None = None):
        if cfg.residual_labels is None:
            raise ExactLensError("a construction must name every residual dimension (residual_labels)")
        self.model = ExactTransformer(cfg) if model is None else model
        self.index = {label: i for i, label in enumerate(cfg.residual_labels)}
        if len(self.index) != cfg.d_model:
            raise ExactLensError(f"residual labels repeat: {cfg.residual_labels}")

    @classmethod
    def around(cls, model: ExactTransformer) -> LabelledModel:
        """Address the weights of an existing model (e.g. one about to be trained) by label."""
        return cls(model.cfg, model)

    def dim(self, label: str) -> int:
        if label not in self.index:
            raise ExactLensError(f"no residual dimension named {label!r}; have {list(self.index)}")
        return self.index[label]

    def vector(self, entries: Mapping[str, float]) -> torch.Tensor:
        out = torch.zeros(self.model.cfg.d_model, dtype=self.model.cfg.torch_dtype)
        for label, value in entries.items():
            out[self.dim(label)] = value
        return out

    @torch.no_grad()
    def embed(self, token_id: int, entries: Mapping[str, float]) -> None:
        self.model.embed.W_E[token_id] = self.vector(entries)

    def embed_one_hot_tokens(self) -> None:
        """Token t writes 1 to its indicator feature I[w_i=t] ([CLS] -> I[w_i=CLS])."""
        for token_id, label in enumerate(token_labels(self.model.cfg.vocab)):
            self.embed(token_id, {label: 1})

    @torch.no_grad()
    def position(self, feature: str, entries: Mapping[str, float]) -> None:
        row = self.model.cfg.positional_features.index(feature)
        self.model.pos_embed.W_feat[row] = self.vector(entries)

    @torch.no_grad()
    def learned_position(self, position: int, entries: Mapping[str, float]) -> None:
        """Row ``position`` of a learned position table (positional_features == ("learned",))."""
        self.model.pos_embed.W_pos[position] = self.vector(entries)

    @torch.no_grad()
    def query_key(self, layer: int, head: int, query: Mapping[str, float], key: Mapping[str, float]) -> None:
        """Paper's row vectors W^Q, W^K (scalar q and k): score = (W^Q a_i)(W^K a_j) / sqrt(d_head)."""
        attn = self.model.blocks[layer].attn
        attn.W_Q[head, :, 0] = self.vector(query)
        attn.W_K[head, :, 0] = self.vector(key)

    def _full_head(self, what: str) -> None:
        cfg = self.model.cfg
        if cfg.d_head != cfg.d_model:
            raise ExactLensError(f"{what} writes a full d x d matrix and needs d_head == d_model")

    @torch.no_grad()
    def scores(self, layer: int, head: int, writes: Mapping[tuple[str, str], float]) -> None:
        """A paper's full bilinear score x_j^T (K^T Q) x_i of key j and query i (before the
        config's scale): writes[(key_label, query_label)] = (K^T Q)[key, query]; stored as
        W_K = I, W_Q = (K^T Q)^T (d_head = d_model), as x_i^T W_Q W_K^T x_j is the same number."""
        self._full_head("scores()")
        attn = self.model.blocks[layer].attn
        attn.W_K[head] = torch.eye(self.model.cfg.d_model, dtype=self.model.cfg.torch_dtype)
        attn.W_Q[head] = 0
        for (key_label, query_label), weight in writes.items():
            attn.W_Q[head, self.dim(query_label), self.dim(key_label)] = weight

    @torch.no_grad()
    def identity_output(self, layer: int, head: int) -> None:
        """W_O = I (d_head = d_model): the head writes its value vector as it is."""
        self._full_head("identity_output()")
        cfg = self.model.cfg
        self.model.blocks[layer].attn.W_O[head] = torch.eye(cfg.d_model, dtype=cfg.torch_dtype)

    @torch.no_grad()
    def value(self, layer: int, head: int, writes: Mapping[tuple[str, str], float]) -> None:
        """Paper's W^V: writes[(out_label, in_label)] = W^V[out, in]; W_O = I (d_head = d_model)."""
        self._full_head("value()")
        attn = self.model.blocks[layer].attn
        for (out_label, in_label), weight in writes.items():
            attn.W_V[head, self.dim(in_label), self.dim(out_label)] = weight
        self.identity_output(layer, head)

    @torch.no_grad()
    def ffn(self, layer: int, hidden: list[Mapping[str, float]], outputs: Mapping[str, list[float]],
            hidden_bias: float = 0.0, output_bias: Mapping[str, float] | None = None) -> None:
        """W^{F,1} rows (one mapping per hidden unit) and W^{F,2} (out_label -> weight per unit);
        ``hidden_bias``: b^{F,1} of every listed unit, ``output_bias``: b^{F,2} by label (default none)."""
        mlp = self.model.blocks[layer].mlp
        if mlp is None or len(hidden) > mlp.W_in.shape[1]:
            raise ExactLensError(f"layer {layer} has no room for {len(hidden)} hidden units")
        for unit, row in enumerate(hidden):
            mlp.W_in[:, unit] = self.vector(row)
            mlp.b_in[unit] = hidden_bias
        for out_label, weights in outputs.items():
            mlp.W_out[: len(weights), self.dim(out_label)] = torch.tensor(weights, dtype=mlp.W_out.dtype)
        for out_label, bias in (output_bias or {}).items():
            mlp.b_out[self.dim(out_label)] = bias

    @torch.no_grad()
    def readout(self, entries: Mapping[str, float], bias: float = 0.0) -> None:
        self.model.unembed.W_U[:, 0] = self.vector(entries)
        self.model.unembed.b_U[0] = bias

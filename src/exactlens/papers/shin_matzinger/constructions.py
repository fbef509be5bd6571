"""Shin & Matzinger 2025 §2: three hand-programmed one-layer transformers for Y_i = q_true(X_{i-1}, X_i).

All three share one architecture (``pair_config``): the input column of token i is
one-hot category X_i (dims cat0..cat{N-1}) concatenated with one-hot position i
(dims pos0..pos{M-1}), d_model = N + M (a fixed embedding table and a one-hot
learned-position table); one head of softmax-free causal attention
(attention_weighting="none": the weights are the bilinear scores
w_ji = X_j^T k^T q X_i, eq. 2.5), the skip X + ATTENTION_*, then an FFN whose
output *is* the prediction (mlp_residual=False; it is written to residual
dimension 0 and read there by the per-position readout).

The paper writes q, k, v as d x d matrices acting on columns; in the
TransformerLens layout score(i, j) = x_i^T W_Q W_K^T x_j, so we store W_K = I,
W_Q = (k^T q)^T, W_V = v^T and W_O = I (d_head = d_model). Categories are
numbered 0..N-1 and positions 0..M-1; the first position has no target.

- Solution 1 (§2.1): k^T q = 2 D_{-1} on the position block, v keeps the
  categories, so the FFN sees e_{X_i} + 2 e_{X_{i-1}}; B has the paper's N^2 rows
  (3 e_a for the pair (a, a), 2 e_a + e_b for (a, b)), bias -4. The paper's
  readout C (the q_true values in row order) is not exact: a row (a, b) also
  fires (with 2) when X_{i-1} = X_i = a, and no single-ReLU row can isolate
  (a, b) there, since 2 e_a + e_b lies between 3 e_a and e_a + 2 e_b. The
  readout below solves the overlap in closed form, so the model is exact.
- Solution 2 (§2.2): k^T q = A_2 (= q_true) on the category block, v = S shifts
  the position block down by one (scaled 1/L), and ReLU(X + ATT - 1) times L keeps
  the diagonal (eq. 2.21).
- Solution 3 (§2.3): v = A_2^T on the category block (scaled 1/L), k^T q = D_{-1}
  on the position block, and the same skip + ReLU extracts the entry (eq. 2.32).

The large constant L must exceed every value the ReLU has to keep or drop. The
paper asks L > q_true (non-negative entries, "larger than all values"). For
q_true with negative entries (the standard normal q_true of §4) we add
c = max(0, -min q_true) to every score (solution 2) or value (solution 3) and
subtract c at the output, so the requirement is L > max q_true + c, which is
the paper's bound when q_true >= 0 and at most 2 max |q_true| otherwise.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from exactlens.constructions.builder import LabelledModel
from exactlens.errors import ExactLensError
from exactlens.model import ExactConfig, ExactTransformer
from exactlens.papers.shin_matzinger.task import check_positions, check_q, make_q

PAPER = "Shin & Matzinger 2025"


def cat(a: int) -> str:
    """The residual label of category a (one-hot input X_i = a)."""
    return f"cat{a}"


def pos(i: int) -> str:
    """The residual label of position i (one-hot)."""
    return f"pos{i}"


# mlp_residual=False: the FFN's output replaces the residual, and its dimension 0 (label cat0) carries
# the prediction, which the per-position readout reads there.
PREDICTION = cat(0)


def residual_labels(categories: int, positions: int) -> tuple[str, ...]:
    return tuple(cat(a) for a in range(categories)) + tuple(pos(i) for i in range(positions))


def pair_config(
    categories: int, positions: int, d_mlp: int, dtype: str = "float32", normalization: str = "none", **extra
) -> ExactConfig:
    """The one architecture of §2 and §4: one-hot inputs (d_model = N + M), one head of
    softmax-free causal attention with full d x d q, k, v, an FFN whose output is the prediction.
    ``normalization='post'`` puts the §4 normalization layer between attention and FFN."""
    n, m = categories, check_positions(positions)
    d = n + m
    return ExactConfig(
        d_model=d,
        n_layers=1,
        d_vocab=n,
        n_heads=1,
        d_head=d,
        d_mlp=d_mlp,
        d_vocab_out=1,
        attention_mask="causal",
        attention_weighting="none",
        attn_scale=1.0,
        attn_bias=False,
        normalization=normalization,
        mlp_residual=False,
        positional_features=("learned",),
        n_ctx=m,
        readout="per_position",
        residual_labels=residual_labels(n, m),
        vocab=tuple(str(a) for a in range(n)),
        dtype=dtype,
        model_name="shin-matzinger",
        **extra,
    )


def set_one_hot_inputs(model: ExactTransformer, categories: int) -> None:
    """W_E = [I_N | 0], W_pos = [0 | I_M]: the paper's input matrix X (columns = tokens); W_O = I."""
    b = LabelledModel.around(model)
    for a in range(categories):
        b.embed(a, {cat(a): 1})
    for i in range(model.cfg.n_ctx):
        b.learned_position(i, {pos(i): 1})
    b.identity_output(0, 0)


def shift_down(positions: int) -> torch.Tensor:
    """D_{-1} (eq. 2.6), [M, M]: D[r, c] = 1 iff r = c - 1; x_j^T D x_i = 1 iff j = i - 1."""
    return torch.diag(torch.ones(positions - 1, dtype=torch.float64), 1)


def large_constant_bound(q_true: torch.Tensor) -> tuple[float, float]:
    """(shift c, bound): c = max(0, -min q) makes every entry >= 0; L must exceed max q + c."""
    q = check_q(q_true)
    shift = max(0.0, -float(q.min()))
    return shift, float(q.max()) + shift


def check_large(q_true: torch.Tensor, large: float | None) -> tuple[float, float]:
    """(L, c); L None -> 100 (the paper's value) or 2 * bound when q_true needs more."""
    shift, bound = large_constant_bound(q_true)
    if large is None:
        return (100.0 if bound < 100.0 else 2.0 * bound), shift
    if not isinstance(large, (int, float)) or isinstance(large, bool) or not large > bound:
        raise ExactLensError(
            f"the large constant L={large!r} must exceed max q_true + max(0, -min q_true) = {bound:.6g} "
            "(Shin & Matzinger §2.2: larger than every value the ReLU must keep or drop); "
            f"choose L > {bound:.6g}, or leave it None for {100.0 if bound < 100 else 2 * bound:.6g}"
        )
    return float(large), shift


def _new_model(q: torch.Tensor, positions: int, d_mlp: int, dtype: str, kind: str, **meta) -> LabelledModel:
    n = q.shape[0]
    scale = max(float(q.abs().max()), float(meta.get("large", 1.0)))  # the largest value computed on the way
    cfg = pair_config(
        n, positions, d_mlp, dtype,
        metadata={"paper": PAPER, "solution": kind, "q_true": q.tolist(), "value_scale": scale, **meta},
    )
    b = LabelledModel(cfg)
    set_one_hot_inputs(b.model, n)
    b.readout({PREDICTION: 1})
    return b


def _previous_position(m: int) -> list[tuple[str, str]]:
    """The nonzero entries of D_{-1} (eq. 2.6) as (key, query) labels: position i - 1 for query i."""
    return [(pos(i - 1), pos(i)) for i in range(1, m)]


def solution1_readout(q_true: torch.Tensor) -> torch.Tensor:
    """C for the paper's B with bias -4, rows (a,a) first then (a,b), a != b (float64 [N^2]).

    On e_{X_i} + 2 e_{X_{i-1}} the active rows are: for (p, c) = (a, b), a != b, row (a, b)
    with 1 and row (a, a) with 2; for (a, a), row (a, a) with 5 and every row (a, b) with 2.
    So q(a, b) = C_ab + 2 C_aa and q(a, a) = 5 C_aa + 2 sum_b C_ab, which gives
    C_aa = (q(a,a) - 2 S_a) / (5 - 4 (N - 1)), S_a = sum_{b != a} q(a, b), C_ab = q(a,b) - 2 C_aa.
    """
    q = check_q(q_true)
    n = q.shape[0]
    diag = q.diagonal()
    off_sum = q.sum(1) - diag
    c_diag = (diag - 2 * off_sum) / (5 - 4 * (n - 1))
    c_off = [q[a, b] - 2 * c_diag[a] for a in range(n) for b in range(n) if a != b]
    return torch.cat([c_diag, torch.stack(c_off)]) if c_off else c_diag


def solution1_pairs(categories: int) -> list[tuple[int, int]]:
    """Row order of B (eq. 2.10): the pairs (a, a), then (a, b) with a != b, a = X_{i-1}, b = X_i."""
    n = categories
    return [(a, a) for a in range(n)] + [(a, b) for a in range(n) for b in range(n) if a != b]


@torch.no_grad()
def build_solution1(q_true: torch.Tensor, positions: int, dtype: str = "float32") -> ExactTransformer:
    """§2.1: attention brings X_{i-1} next to X_i; the FFN's N^2 rows and C decode the pair."""
    q = check_q(q_true)
    n, m = q.shape[0], check_positions(positions)
    b = _new_model(q, m, n * n, dtype, "solution1")
    b.scores(0, 0, {key_query: 2.0 for key_query in _previous_position(m)})  # eq. 2.7-2.8: k^T q = 2 D_{-1}
    b.value(0, 0, {(cat(a), cat(a)): 1.0 for a in range(n)})  # eq. 2.9: keep the categories
    # B (eq. 2.10), one hidden unit per row: the pair (a, a) reads 3 e_a, the pair (a, c) reads 2 e_a + e_c;
    # the FFN sees e_{X_i} + 2 e_{X_{i-1}}, bias -4; C (solution1_readout) decodes the active rows.
    rows = [{cat(a): 3.0} if a == c else {cat(a): 2.0, cat(c): 1.0} for a, c in solution1_pairs(n)]
    b.ffn(0, rows, {PREDICTION: solution1_readout(q).tolist()}, hidden_bias=-4.0)
    return b.model


def _skip_relu_readout(b: LabelledModel, large: float, shift: float) -> None:
    """Y = L * 1^T ReLU(X + ATT - 1) - c (eq. 2.21 / 2.32, with the shift c for negative q):
    one hidden unit per residual label."""
    labels = b.model.cfg.residual_labels
    b.ffn(0, [{label: 1.0} for label in labels], {PREDICTION: [large] * len(labels)}, hidden_bias=-1.0,
          output_bias={PREDICTION: -shift})


@torch.no_grad()
def build_solution2(
    q_true: torch.Tensor, positions: int, large: float | None = None, dtype: str = "float32"
) -> ExactTransformer:
    """§2.2: the bilinear score is q_true(X_j, X_i); v shifts the position block; skip + ReLU keep the diagonal."""
    q, b, big, shift = _skip_relu_model(q_true, positions, large, dtype, "solution2")
    n = q.shape[0]
    # eq. 2.17: k^T q = A_2 on the categories, the score of key X_j = a for query X_i = c is q(a, c) (+ c shift)
    b.scores(0, 0, {(cat(a), cat(c)): float(q[a, c] + shift) for a in range(n) for c in range(n)})
    # S = D_{-1}^T maps position j to j + 1 (scaled by 1/L, eq. 2.21)
    b.value(0, 0, {(query, key): 1.0 / big for key, query in _previous_position(positions)})
    return b.model


@torch.no_grad()
def build_solution3(
    q_true: torch.Tensor, positions: int, large: float | None = None, dtype: str = "float32"
) -> ExactTransformer:
    """§2.3: v = A_2^T on the categories, k^T q = D_{-1} on the positions; skip + ReLU extract the entry."""
    q, b, big, shift = _skip_relu_model(q_true, positions, large, dtype, "solution3")
    n = q.shape[0]
    b.scores(0, 0, {key_query: 1.0 for key_query in _previous_position(positions)})  # k^T q = D_{-1}
    # v = A_2^T / L: the value of X_j = a is row a of q_true, written to the categories (the skip picks X_i's)
    b.value(0, 0, {(cat(c), cat(a)): float((q[a, c] + shift) / big) for a in range(n) for c in range(n)})
    return b.model


def _skip_relu_model(
    q_true: torch.Tensor, positions: int, large: float | None, dtype: str, solution: str
) -> tuple[torch.Tensor, LabelledModel, float, float]:
    """Solutions 2 and 3 share the FFN (skip + ReLU, width d) and the readout; they differ in attention."""
    q = check_q(q_true)
    m = check_positions(positions)
    big, shift = check_large(q, large)
    b = _new_model(q, m, q.shape[0] + m, dtype, solution, large=big, shift=shift)
    _skip_relu_readout(b, big, shift)
    return q, b, big, shift


# ---- registry builders (JSON-able parameters) ------------------------------------------


def solution1(
    categories: int = 10, positions: int = 50, q: str = "normal", q_seed: int = 0, dtype: str = "float32"
) -> ExactTransformer:
    """Solution 1 (§2.1) for q_true of kind q ("normal": seeded standard normal, "code": eq. 2.15)."""
    return build_solution1(make_q(q, categories, q_seed), positions, dtype)


def _registry_builder(build: Callable[..., ExactTransformer], section: str) -> Callable[..., ExactTransformer]:
    def builder(
        categories: int = 10,
        positions: int = 50,
        q: str = "normal",
        q_seed: int = 0,
        large: float | None = None,
        dtype: str = "float32",
    ) -> ExactTransformer:
        return build(make_q(q, categories, q_seed), positions, large, dtype)

    builder.__doc__ = f"{section}; large = L (None: 100, or 2 x the bound when q_true needs more)."
    return builder


solution2 = _registry_builder(build_solution2, "Solution 2 (§2.2)")
solution3 = _registry_builder(build_solution3, "Solution 3 (§2.3)")


def predict(model: ExactTransformer, categories: torch.Tensor) -> torch.Tensor:
    """The model's predictions [batch, M] for category ids [batch, M] (positions 0..M-1)."""
    if categories.ndim != 2:
        raise ExactLensError(f"categories must be [batch, M], got shape {tuple(categories.shape)}")
    return model(categories.long())[..., 0]

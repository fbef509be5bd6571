"""Tests of the hooked model that fail if its math, hooks, masks or checks were wrong.

The central check compares every switch combination against ``naive_forward``:
an independent re-implementation written with plain loops over query positions
and explicit formulas, computed in float64 on each unpadded sequence alone.
"""

from __future__ import annotations

import itertools
import json
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformer_lens import ActivationCache, FactoredMatrix, patching

from exactlens.errors import ExactLensError
from exactlens.model import ExactConfig, ExactTransformer, positional
from exactlens.model.config import MASKS, NORMALIZATIONS, WEIGHTINGS
from exactlens.model.positional import register_position_feature, sinusoidal_features

TOL = {"float32": 1e-5, "float64": 1e-12}


F64 = torch.float64

# Independent formulas of the named positional features, for 0 <= i < n.
FEATURE_FORMULAS = {
    "1": lambda i, n: 1.0,
    "i": lambda i, n: float(i),
    "n": lambda i, n: float(n),
    "i/n": lambda i, n: i / n,
    "1/n": lambda i, n: 1 / n,
    "i/(n-1)": lambda i, n: i / (n - 1) if n > 1 else 0.0,
    "n-1-i": lambda i, n: float(n - 1 - i),
    "(n-1-i)/n": lambda i, n: (n - 1 - i) / n,
    "i^2": lambda i, n: float(i * i),
    "(i/n)^2": lambda i, n: (i / n) ** 2,
    "1/(i+1)": lambda i, n: 1 / (i + 1),
    "1/(i+1)^2": lambda i, n: 1 / (i + 1) ** 2,
    "cos(i*pi)": lambda i, n: math.cos(i * math.pi),
    "I[i=0]": lambda i, n: float(i == 0),
    "I[i=1]": lambda i, n: float(i == 1),
    "I[i=n-1]": lambda i, n: float(i == n - 1),
    "I[i<n/2]": lambda i, n: float(i < n / 2),
    "I[i>=n/2]": lambda i, n: float(i >= n / 2),
    "I[i<=(n-1)/2]": lambda i, n: float(i <= (n - 1) / 2),
    "I[i>=(n-1)/2]": lambda i, n: float(i >= (n - 1) / 2),
}


def sinusoid_formula(name: str):
    kind, rest = name.split("[")
    j, d = (int(x) for x in rest.rstrip("]").split("/"))
    trig = math.sin if kind == "sin" else math.cos
    return lambda i, n: trig(i / 10000 ** (2 * j / d))


def feature_formula(name: str):
    return FEATURE_FORMULAS[name] if name in FEATURE_FORMULAS else sinusoid_formula(name)


# ---- helpers -------------------------------------------------------------------------------------

BASE = dict(
    d_model=6,
    n_layers=2,
    d_vocab=5,
    n_heads=2,
    d_mlp=5,
    d_vocab_out=3,
    positional_features=("i/n", "1", "cos(i*pi)", "n"),
)


def make_model(seed: int = 0, scale: float = 0.5, **overrides) -> ExactTransformer:
    """A small model with every parameter random (biases and LN gains/biases included)."""
    model = ExactTransformer(ExactConfig(**{**BASE, **overrides}))
    randomize(model, seed, scale)
    return model.eval()


def randomize(model: ExactTransformer, seed: int, scale: float = 0.5) -> None:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen, dtype=F64)
            p.copy_(1 + 0.2 * noise if name.endswith(".w") else scale * noise)


def random_tokens(batch: int, n_pos: int, d_vocab: int, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, d_vocab, (batch, n_pos), generator=torch.Generator().manual_seed(seed))


def visible(mask: str, i: int, j: int) -> bool:
    return {"none": True, "causal": j <= i, "strict_causal": j < i, "past": j >= i, "strict_past": j > i}[mask]


def naive_weights(scores: dict[int, float], weighting: str, tol: float) -> dict[int, float]:
    """Attention weights of one query from its {key: score} over the visible keys."""
    if not scores:
        return {}
    if weighting == "none":
        return dict(scores)
    best = max(scores.values())
    if weighting == "softmax":
        exp = {j: math.exp(s - best) for j, s in scores.items()}
        total = sum(exp.values())
        return {j: e / total for j, e in exp.items()}
    tied = sorted(j for j, s in scores.items() if s >= best - tol)
    if weighting == "average_hard":
        return {j: (1 / len(tied) if j in tied else 0.0) for j in scores}
    pick = tied[0] if weighting == "unique_hard_left" else tied[-1]
    return {j: float(j == pick) for j in scores}


def naive_act(v: torch.Tensor, name: str) -> torch.Tensor:
    if name == "relu":
        return torch.tensor([max(a, 0.0) for a in v.tolist()], dtype=F64)
    if name == "gelu":
        return torch.tensor([0.5 * a * (1 + math.erf(a / math.sqrt(2))) for a in v.tolist()], dtype=F64)
    return v.clone()


def naive_forward(model: ExactTransformer, tokens: torch.Tensor, n_positions: torch.Tensor) -> dict:
    """Float64 loops over each unpadded sequence. Entries past a sequence's n are NaN (queries)
    or -inf / 0 (keys), since padding must be invisible."""
    cfg = model.cfg
    P = {k: v.detach().to(F64) for k, v in model.state_dict().items()}
    B, T = tokens.shape
    H, L, D = cfg.n_heads, cfg.n_layers, cfg.d_model
    nan = float("nan")
    out = {
        "logits": torch.full((B, T, cfg.d_vocab_out), nan, dtype=F64),
        "hook_pos_embed": torch.full((B, T, D), nan, dtype=F64),
    }
    for layer in range(L):
        out[f"blocks.{layer}.attn.hook_attn_scores"] = torch.full((B, H, T, T), nan, dtype=F64)
        out[f"blocks.{layer}.attn.hook_pattern"] = torch.full((B, H, T, T), nan, dtype=F64)
        for name in ("hook_attn_out", "hook_resid_mid", "hook_resid_post"):
            out[f"blocks.{layer}.{name}"] = torch.full((B, T, D), nan, dtype=F64)

    def ln(x: torch.Tensor, prefix: str) -> torch.Tensor:
        if cfg.ln_select:  # Cookbook §5.3.3: LN reads x @ W_select
            x = torch.stack([sum(x[r] * P[f"{prefix}.W_select"][r, c] for r in range(D)) for c in range(D)])
        if cfg.ln_center:
            x = x - sum(x.tolist()) / D
        if not cfg.ln_scale:
            return x * P[f"{prefix}.w"] + P[f"{prefix}.b"]
        scale = math.sqrt(sum(a * a for a in x.tolist()) / D + cfg.ln_eps)
        return x / scale * P[f"{prefix}.w"] + P[f"{prefix}.b"]

    divisor = cfg.attn_scale if cfg.attn_scale is not None else math.sqrt(cfg.d_head)
    for b in range(B):
        n = int(n_positions[b])
        xs = []
        for i in range(n):
            if cfg.learned_positions:
                pos = P["pos_embed.W_pos"][i]
            else:
                pos = torch.zeros(D, dtype=F64)
                for f, name in enumerate(cfg.positional_features):
                    pos = pos + feature_formula(name)(i, n) * P["pos_embed.W_feat"][f]
            out["hook_pos_embed"][b, i] = pos
            xs.append(P["embed.W_E"][int(tokens[b, i])] + pos)
        for layer in range(L):
            pre = f"blocks.{layer}"
            mask, weighting, length_scale, act, norm = (
                cfg.per_layer(name)[layer]
                for name in ("attention_mask", "attention_weighting", "attn_length_scale", "act_fn", "normalization")
            )
            a_in = [ln(x, f"{pre}.ln1") for x in xs] if norm == "pre" else xs
            q = [[a_in[i] @ P[f"{pre}.attn.W_Q"][h] + P[f"{pre}.attn.b_Q"][h] for i in range(n)] for h in range(H)]
            k = [[a_in[i] @ P[f"{pre}.attn.W_K"][h] + P[f"{pre}.attn.b_K"][h] for i in range(n)] for h in range(H)]
            v = [[a_in[i] @ P[f"{pre}.attn.W_V"][h] + P[f"{pre}.attn.b_V"][h] for i in range(n)] for h in range(H)]
            mids = []
            for i in range(n):
                keys = [j for j in range(n) if visible(mask, i, j)]
                factor = 1 / divisor
                if length_scale == "log_n":
                    factor *= math.log(n)
                elif length_scale == "log_visible" and keys:
                    factor *= math.log(len(keys))
                attn_out = P[f"{pre}.attn.b_O"].clone()
                for h in range(H):
                    scores = {j: float(q[h][i] @ k[h][j]) * factor for j in keys}
                    weights = naive_weights(scores, weighting, cfg.hard_tie_tolerance)
                    z = torch.zeros(cfg.d_head, dtype=F64)
                    for j in range(T):
                        out[f"{pre}.attn.hook_attn_scores"][b, h, i, j] = scores.get(j, -math.inf)
                        out[f"{pre}.attn.hook_pattern"][b, h, i, j] = weights.get(j, 0.0)
                    for j, w in weights.items():
                        z = z + w * v[h][j]
                    attn_out = attn_out + z @ P[f"{pre}.attn.W_O"][h]
                out[f"{pre}.hook_attn_out"][b, i] = attn_out
                mid = xs[i] + attn_out
                mids.append(ln(mid, f"{pre}.ln1") if norm == "post" else mid)
            new = []
            for i in range(n):
                out[f"{pre}.hook_resid_mid"][b, i] = mids[i]
                if cfg.d_mlp == 0:
                    new.append(mids[i])
                    continue
                m_in = ln(mids[i], f"{pre}.ln2") if norm == "pre" else mids[i]
                hidden = naive_act(m_in @ P[f"{pre}.mlp.W_in"] + P[f"{pre}.mlp.b_in"], act)
                res = mids[i] + hidden @ P[f"{pre}.mlp.W_out"] + P[f"{pre}.mlp.b_out"]
                new.append(ln(res, f"{pre}.ln2") if norm == "post" else res)
            xs = new
            for i in range(n):
                out[f"{pre}.hook_resid_post"][b, i] = xs[i]
        for i in range(n):
            if cfg.ln_final is None:  # standard: a final LN iff every layer is pre-LN
                final_ln = set(cfg.per_layer("normalization")) == {"pre"}
            else:
                final_ln = cfg.ln_final
            x = ln(xs[i], "ln_final") if final_ln else xs[i]
            out["logits"][b, i] = x @ P["unembed.W_U"] + P["unembed.b_U"]
    return out


def assert_real_positions_close(actual: torch.Tensor, expected: torch.Tensor, n_positions, tol: float, what: str):
    """Compare at real (unpadded) query positions: dim 1 for [b, pos, ...], dim 2 for [b, head, q, k]."""
    for b, n in enumerate(n_positions.tolist()):
        if actual.ndim == 4:
            a, e = actual[b, :, :n, :], expected[b, :, :n, :]
        else:
            a, e = actual[b, :n], expected[b, :n]
        finite = e[torch.isfinite(e)]
        size = max(1.0, float(finite.abs().max())) if finite.numel() else 1.0  # tolerance relative to the tensor
        torch.testing.assert_close(
            a.to(F64), e, atol=tol * size, rtol=tol, msg=lambda m, b=b: f"{what}, sequence {b}: {m}"
        )


# ---- every switch combination against the naive re-implementation --------------------------------

COMBOS = list(itertools.product(MASKS, WEIGHTINGS, NORMALIZATIONS, ("float32", "float64")))
ACTS = ("relu", "gelu", "identity")
LENGTH_SCALES = ("none", "log_n", "log_visible")


@pytest.mark.parametrize(
    "index, mask, weighting, norm, dtype", [(k, *c) for k, c in enumerate(COMBOS)], ids=["-".join(c) for c in COMBOS]
)
def test_matches_naive_reimplementation(index, mask, weighting, norm, dtype):
    # Vary the remaining switches over the combinations so that each is exercised with all the others.
    extra = dict(
        act_fn=ACTS[index % 3],
        attn_length_scale=LENGTH_SCALES[(index // 3) % 3],
        attn_scale=None if index % 2 else 1.7,
        ln_eps=(1e-5, 0.0, 0.3)[index % 3],
        ln_center=index % 4 != 3,
        ln_scale=index % 4 == 3 or index % 6 != 5,  # never both off (that is normalization="none")
        d_mlp=0 if index % 7 == 0 else 5,
    )
    if index % 5 == 0:
        extra.update(positional_features=("learned",), n_ctx=8)
    model = make_model(
        seed=index,
        scale=0.3 if weighting == "none" else 0.5,  # unnormalized bilinear attention grows fast with depth
        attention_mask=mask,
        attention_weighting=weighting,
        normalization=norm,
        dtype=dtype,
        **extra,
    )
    tokens = random_tokens(3, 6, model.cfg.d_vocab, seed=index)
    n_positions = torch.tensor([6, 4, 3])
    logits, cache = model.run_with_cache(tokens, n_positions=n_positions)
    assert logits.dtype == model.cfg.torch_dtype
    expected = naive_forward(model, tokens, n_positions)
    tol = TOL[dtype]
    for name, want in expected.items():
        got = logits if name == "logits" else cache[name]
        assert_real_positions_close(got, want, n_positions, tol, name)


@pytest.mark.parametrize("seed", range(12))
def test_per_layer_switches_match_naive_reimplementation(seed):
    """Each layer with its own mask, weighting, length scale, activation and normalization
    (seeds 0-5: one normalization for all layers; 6-11: per layer, selective LN where no
    layer is post-LN)."""
    rng = torch.Generator().manual_seed(seed)

    def pick(options):
        return tuple(options[int(i)] for i in torch.randint(len(options), (3,), generator=rng))

    if seed < 6:
        norm, select = NORMALIZATIONS[seed % 3], False
    else:
        norm = pick(NORMALIZATIONS if seed % 2 else ("none", "pre"))
        select = "post" not in norm
    final = (None, True, False)[seed % 3]  # the standard final LN, or forced on / off

    model = make_model(
        seed=100 + seed,
        n_layers=3,
        scale=0.4,
        attention_mask=pick(MASKS),
        attention_weighting=pick(("softmax", "average_hard", "unique_hard_left", "unique_hard_right", "none")),
        attn_length_scale=pick(LENGTH_SCALES),
        act_fn=pick(ACTS),
        normalization=norm,
        ln_select=select,
        ln_final=final,
        d_mlp=4,
        dtype="float64",
    )
    tokens = random_tokens(3, 6, model.cfg.d_vocab, seed=seed)
    n_positions = torch.tensor([6, 5, 2])
    logits, cache = model.run_with_cache(tokens, n_positions=n_positions)
    for name, want in naive_forward(model, tokens, n_positions).items():
        got = logits if name == "logits" else cache[name]
        assert_real_positions_close(got, want, n_positions, TOL["float64"], name)


def test_per_layer_switch_validation_and_round_trip(tmp_path):
    with pytest.raises(ExactLensError, match=r"one of them per layer \(n_layers=2\)"):
        ExactConfig(**{**BASE, "attention_mask": ("causal",)})
    with pytest.raises(ExactLensError, match=r"attention_weighting\[1\]='soft' is not allowed"):
        ExactConfig(**{**BASE, "attention_weighting": ("softmax", "soft")})
    with pytest.raises(ExactLensError, match="not a per-layer switch"):
        ExactConfig(**BASE).per_layer("ln_eps")
    with pytest.raises(ExactLensError, match="leave nothing of layer norm"):
        ExactConfig(**{**BASE, "normalization": "pre", "ln_center": False, "ln_scale": False})
    cfg = ExactConfig(**{**BASE, "attention_mask": ["causal", "none"], "act_fn": "gelu"})
    assert cfg.per_layer("attention_mask") == ("causal", "none")
    assert cfg.per_layer("act_fn") == ("gelu", "gelu")
    assert cfg.uniform("attention_mask") is None and cfg.uniform("act_fn") == "gelu"
    model = ExactTransformer(cfg)
    model.init_weights(seed=3)
    model.save(tmp_path / "m")
    again = ExactTransformer.load(tmp_path / "m")
    assert again.cfg.attention_mask == ("causal", "none")
    tokens = random_tokens(2, 4, cfg.d_vocab)
    torch.testing.assert_close(again(tokens), model(tokens), atol=0, rtol=0)


@pytest.mark.parametrize("norm", ["post", "pre"])
def test_ln_without_scaling_only_centers(norm):
    model = make_model(seed=14, normalization=norm, ln_scale=False, dtype="float64")
    _, cache = model.run_with_cache(random_tokens(2, 5, 5))
    x = ln_inputs(cache, 0)["ln1"] if norm == "post" else cache["blocks.0.hook_resid_pre"]
    normalized = cache["blocks.0.ln1.hook_normalized"]
    torch.testing.assert_close(normalized, x - x.mean(-1, keepdim=True), atol=1e-12, rtol=0)
    assert ExactConfig(**{**BASE, "normalization": "pre", "ln_scale": False}).normalization_type is None


# ---- masks ---------------------------------------------------------------------------------------


@settings(max_examples=40, deadline=None)
@given(
    mask=st.sampled_from(MASKS),
    lengths=st.lists(st.integers(1, 7), min_size=1, max_size=4),
    seed=st.integers(0, 1000),
)
def test_visible_keys_follow_mask_definition(mask, lengths, seed):
    model = make_model(seed=seed, n_layers=1, d_mlp=0, attention_mask=mask, dtype="float64")
    width = max(lengths)
    tokens = random_tokens(len(lengths), width, model.cfg.d_vocab, seed)
    n_positions = torch.tensor(lengths)
    _, cache = model.run_with_cache(tokens, n_positions=n_positions)
    scores = cache["blocks.0.attn.hook_attn_scores"]
    pattern = cache["blocks.0.attn.hook_pattern"]
    for b, n in enumerate(lengths):
        for i in range(n):
            keys = [j for j in range(width) if j < n and visible(mask, i, j)]
            seen = torch.isfinite(scores[b, :, i, :])
            assert seen.all(0).tolist() == [j in keys for j in range(width)], (b, i)
            assert (~seen).all(0).tolist() == [j not in keys for j in range(width)]
            assert (pattern[b, :, i, :] > 0).all(0).tolist() == [j in keys for j in range(width)]
            total = pattern[b, :, i, :].sum(-1)
            torch.testing.assert_close(total, torch.full_like(total, 1.0 if keys else 0.0), atol=1e-12, rtol=0)


@pytest.mark.parametrize("weighting", WEIGHTINGS)
@pytest.mark.parametrize("norm", NORMALIZATIONS)
@pytest.mark.parametrize("mask", ["strict_causal", "strict_past"])
def test_query_without_visible_key_gets_zero_output(mask, norm, weighting):
    model = make_model(seed=3, attention_mask=mask, attention_weighting=weighting, normalization=norm)
    tokens = random_tokens(3, 5, model.cfg.d_vocab)
    n_positions = torch.tensor([5, 3, 1])
    logits, cache = model.run_with_cache(tokens, n_positions=n_positions)
    for name, value in cache.items():
        assert not torch.isnan(value).any(), name
    assert torch.isfinite(logits).all()
    for b, n in enumerate(n_positions.tolist()):
        lonely = 0 if mask == "strict_causal" else n - 1
        for layer in range(2):
            z = cache[f"blocks.{layer}.attn.hook_z"][b, lonely]
            assert torch.equal(z, torch.zeros_like(z))
            assert torch.equal(cache[f"blocks.{layer}.attn.hook_pattern"][b, :, lonely], torch.zeros(2, 5))
            b_O = model.blocks[layer].attn.b_O
            assert torch.equal(cache[f"blocks.{layer}.hook_attn_out"][b, lonely], b_O.detach())


@pytest.mark.parametrize("weighting", WEIGHTINGS)
@pytest.mark.parametrize("mask", MASKS)
def test_padded_batch_equals_each_sequence_alone(mask, weighting):
    k = MASKS.index(mask) * 5 + WEIGHTINGS.index(weighting)
    dtype = "float32" if k % 4 == 0 else "float64"
    model = make_model(
        seed=k,
        attention_mask=mask,
        attention_weighting=weighting,
        normalization=NORMALIZATIONS[k % 3],
        attn_length_scale=LENGTH_SCALES[(k // 3) % 3],
        positional_features=("i/n", "n", "I[i=n-1]", "(n-1-i)/n"),
        dtype=dtype,
    )
    lengths = [7, 2, 5, 1]
    tokens = random_tokens(len(lengths), 7, model.cfg.d_vocab, seed=k)
    n_positions = torch.tensor(lengths)
    padded, cache = model.run_with_cache(tokens, n_positions=n_positions)
    tol = 10 * TOL[dtype]
    for b, n in enumerate(lengths):
        alone, alone_cache = model.run_with_cache(tokens[b : b + 1, :n])
        torch.testing.assert_close(padded[b, :n], alone[0], atol=tol, rtol=tol)
        torch.testing.assert_close(cache["hook_pos_embed"][b, :n], alone_cache["hook_pos_embed"][0], atol=0, rtol=0)


def test_positional_features_use_each_sequences_own_n():
    model = ExactTransformer(ExactConfig(d_model=2, n_layers=1, d_vocab=2, positional_features=("n", "i/n")))
    with torch.no_grad():
        model.pos_embed.W_feat.copy_(torch.eye(2))
    _, cache = model.run_with_cache(torch.zeros(3, 5, dtype=torch.long), n_positions=torch.tensor([5, 2, 4]))
    pos = cache["hook_pos_embed"]
    for b, n in enumerate([5, 2, 4]):
        assert pos[b, :n, 0].tolist() == [float(n)] * n
        torch.testing.assert_close(pos[b, :n, 1], torch.arange(n, dtype=torch.float32) / n)


# ---- hard attention ------------------------------------------------------------------------------


def tie_model(weighting: str, tol: float = 0.0, mask: str = "none", dtype: str = "float64") -> ExactTransformer:
    """Score of key j = value of its token (W_E[t, 0]); value read by attention = position j."""
    cfg = ExactConfig(
        d_model=2,
        n_layers=1,
        d_vocab=4,
        positional_features=("i",),
        attention_mask=mask,
        attention_weighting=weighting,
        attn_scale=1.0,
        hard_tie_tolerance=tol,
        dtype=dtype,
    )
    model = ExactTransformer(cfg)
    with torch.no_grad():
        model.embed.W_E[:, 0] = torch.tensor([0.0, 2.0, 1.95, 1.5])
        model.pos_embed.W_feat[0, 1] = 1.0
        model.blocks[0].attn.b_Q[0, 0] = 1.0  # q = e_0 for every query
        model.blocks[0].attn.W_K[0, 0, 0] = 1.0  # k = (token value, 0)
        model.blocks[0].attn.W_V[0, 1, 0] = 1.0  # v = (position, 0)
    return model.eval()


TIE_TOKENS = [0, 1, 3, 1, 2, 0, 1, 2]  # value 2.0 at positions 1, 3, 6; 1.95 at 4, 7


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("mask", MASKS)
@pytest.mark.parametrize("tol", [0.0, 0.1])
@pytest.mark.parametrize("weighting", ["average_hard", "unique_hard_left", "unique_hard_right"])
def test_hard_attention_ties(weighting, tol, mask, dtype):
    model = tie_model(weighting, tol, mask, dtype)
    values = [0.0, 2.0, 1.95, 1.5]
    _, cache = model.run_with_cache(torch.tensor([TIE_TOKENS]))
    pattern = cache["blocks.0.attn.hook_pattern"][0, 0]
    z = cache["blocks.0.attn.hook_z"][0, :, 0, 0]
    n = len(TIE_TOKENS)
    for i in range(n):
        keys = [j for j in range(n) if visible(mask, i, j)]
        if not keys:
            assert pattern[i].abs().sum() == 0 and z[i] == 0
            continue
        best = max(values[TIE_TOKENS[j]] for j in keys)
        # tol 0.1 merges 2.0 and 1.95 (float32 rounding of 1.95 does not matter at this margin)
        tied = [j for j in keys if values[TIE_TOKENS[j]] >= best - (0.1 if tol else 1e-9)]
        if weighting == "average_hard":
            want = [1 / len(tied) if j in tied else 0.0 for j in range(n)]
            want_z = sum(tied) / len(tied)
        else:
            pick = tied[0] if weighting == "unique_hard_left" else tied[-1]
            want = [float(j == pick) for j in range(n)]
            want_z = float(pick)
        assert pattern[i].tolist() == pytest.approx(want, abs=1e-7), (i, tied)
        assert float(z[i]) == pytest.approx(want_z, abs=1e-6)


def test_hard_attention_on_edited_scores():
    """Ties planted through hook_attn_scores: the weighting reads the (edited) scores."""
    row = torch.tensor([1.0, 3.0, 3.0, 2.0, 3.0, 2.95], dtype=F64)
    expected = {
        ("average_hard", 0.0): [0, 1 / 3, 1 / 3, 0, 1 / 3, 0],
        ("average_hard", 0.1): [0, 0.25, 0.25, 0, 0.25, 0.25],
        ("average_hard", 5.0): [1 / 6] * 6,
        ("unique_hard_left", 0.0): [0, 1, 0, 0, 0, 0],
        ("unique_hard_left", 1.5): [0, 1, 0, 0, 0, 0],
        ("unique_hard_right", 0.0): [0, 0, 0, 0, 1, 0],
        ("unique_hard_right", 0.1): [0, 0, 0, 0, 0, 1],
        ("unique_hard_right", 5.0): [0, 0, 0, 0, 0, 1],
    }
    for (weighting, tol), want in expected.items():
        got = pattern_for_planted_scores(row, weighting, tol)
        want = torch.tensor(want, dtype=F64).expand_as(got)
        torch.testing.assert_close(got, want, atol=1e-15, rtol=0, msg=f"{weighting} tol={tol}")


def pattern_for_planted_scores(row: torch.Tensor, weighting: str, tol: float) -> torch.Tensor:
    model = make_model(seed=1, attention_weighting=weighting, hard_tie_tolerance=tol, n_layers=1, dtype="float64")
    seen = {}

    def plant(scores, hook):
        return row.expand_as(scores).clone()

    def grab(pattern, hook):
        seen["pattern"] = pattern.detach().clone()

    model.run_with_hooks(
        random_tokens(2, 6, 5),
        fwd_hooks=[("blocks.0.attn.hook_attn_scores", plant), ("blocks.0.attn.hook_pattern", grab)],
    )
    return seen["pattern"]


# ---- length-dependent attention scale ------------------------------------------------------------


def twin(model: ExactTransformer, **changes) -> ExactTransformer:
    """The same weights under a changed config."""
    other = ExactTransformer(model.cfg.replace(**changes))
    other.load_state_dict(model.state_dict())
    return other.eval()


@pytest.mark.parametrize("mask", MASKS)
def test_log_n_multiplies_scores_by_log_of_real_length(mask):
    plain = make_model(seed=5, attention_mask=mask, dtype="float64", n_layers=1)
    scaled = twin(plain, attn_length_scale="log_n")
    lengths = [6, 4, 2, 1]
    tokens = random_tokens(4, 6, 5)
    n_positions = torch.tensor(lengths)
    _, c0 = plain.run_with_cache(tokens, n_positions=n_positions)
    _, c1 = scaled.run_with_cache(tokens, n_positions=n_positions)
    s0, s1 = c0["blocks.0.attn.hook_attn_scores"], c1["blocks.0.attn.hook_attn_scores"]
    for b, n in enumerate(lengths):
        real = s0[b, :, :n]
        seen = torch.isfinite(real)
        torch.testing.assert_close(s1[b, :, :n][seen], real[seen] * math.log(n), atol=1e-12, rtol=1e-12)
        assert torch.equal(torch.isfinite(s1[b, :, :n]), seen)


@pytest.mark.parametrize("mask", MASKS)
def test_log_visible_multiplies_scores_by_log_of_visible_count(mask):
    plain = make_model(seed=6, attention_mask=mask, dtype="float64", n_layers=1)
    scaled = twin(plain, attn_length_scale="log_visible")
    lengths = [6, 5, 3]
    tokens = random_tokens(3, 6, 5)
    for n_positions in (torch.tensor(lengths), None):
        _, c0 = plain.run_with_cache(tokens, n_positions=n_positions)
        _, c1 = scaled.run_with_cache(tokens, n_positions=n_positions)
        s0, s1 = c0["blocks.0.attn.hook_attn_scores"], c1["blocks.0.attn.hook_attn_scores"]
        for b, n in enumerate(lengths if n_positions is not None else [6, 6, 6]):
            for i in range(n):
                count = sum(visible(mask, i, j) for j in range(n))
                seen = torch.isfinite(s0[b, :, i])
                assert int(seen[0].sum()) == count
                if count:
                    want = s0[b, :, i][seen] * math.log(count)
                    torch.testing.assert_close(s1[b, :, i][seen], want, atol=1e-12, rtol=1e-12)


# ---- hooks ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("weighting", ["softmax", "none", "average_hard"])
def test_editing_attn_scores_changes_output(weighting):
    model = make_model(seed=7, attention_weighting=weighting, dtype="float64")
    tokens = random_tokens(2, 5, 5)
    clean_logits, clean = model.run_with_cache(tokens)
    original = clean["blocks.0.attn.hook_attn_scores"]
    seen = {}

    def edit(scores, hook):
        edited = scores.clone()
        edited[..., 0] = scores.amax(-1) + 3.0  # key 0 becomes the unique maximum of every row
        seen["scores"] = edited
        return edited

    def grab(pattern, hook):
        seen["pattern"] = pattern

    logits = model.run_with_hooks(
        tokens, fwd_hooks=[("blocks.0.attn.hook_attn_scores", edit), ("blocks.0.attn.hook_pattern", grab)]
    )
    assert not torch.allclose(logits, clean_logits, atol=1e-6)
    edited, pattern = seen["scores"], seen["pattern"]
    if weighting == "softmax":
        torch.testing.assert_close(pattern, torch.softmax(edited, -1))
    elif weighting == "none":
        torch.testing.assert_close(pattern, edited)
    else:
        assert torch.equal(pattern, torch.zeros_like(pattern).index_fill(-1, torch.tensor([0]), 1.0))
    assert not torch.equal(edited, original)
    # the hooks are removed afterwards: a plain run gives the clean output again
    torch.testing.assert_close(model(tokens), clean_logits, atol=0, rtol=0)


def test_run_with_hooks_zeroing_final_resid_leaves_the_unembed_bias():
    model = make_model(seed=8, normalization="none")
    logits = model.run_with_hooks(
        random_tokens(2, 4, 5), fwd_hooks=[("blocks.1.hook_resid_post", lambda x, hook: torch.zeros_like(x))]
    )
    torch.testing.assert_close(logits, model.unembed.b_U.detach().expand_as(logits), atol=0, rtol=0)


@pytest.mark.parametrize("via", ["config", "setter"])
def test_hook_result_fires_and_sums_to_attn_out(via):
    model = make_model(seed=9, use_attn_result=via == "config", dtype="float64")
    tokens = random_tokens(2, 5, 5)
    reference = twin(model, use_attn_result=False)
    ref_logits, ref_cache = reference.run_with_cache(tokens)
    assert "blocks.0.attn.hook_result" not in ref_cache.cache_dict
    if via == "setter":
        model.set_use_attn_result(True)
    logits, cache = model.run_with_cache(tokens)
    torch.testing.assert_close(logits, ref_logits, atol=1e-12, rtol=1e-12)
    for layer in range(2):
        result = cache[f"blocks.{layer}.attn.hook_result"]
        assert result.shape == (2, 5, 2, 6)
        b_O = model.blocks[layer].attn.b_O.detach()
        torch.testing.assert_close(result.sum(-2) + b_O, cache[f"blocks.{layer}.hook_attn_out"], atol=1e-12, rtol=0)
        # head h's result is z_h @ W_O[h]
        z = cache[f"blocks.{layer}.attn.hook_z"]
        W_O = model.blocks[layer].attn.W_O.detach()
        for h in range(2):
            torch.testing.assert_close(result[:, :, h], z[:, :, h] @ W_O[h], atol=1e-12, rtol=0)
    model.set_use_attn_result(False)
    _, cache = model.run_with_cache(tokens)
    assert "blocks.0.attn.hook_result" not in cache.cache_dict


def test_hook_names_are_transformer_lens_names():
    model = make_model(normalization="pre")
    names = set(model.hook_dict)
    for name in ("hook_embed", "hook_pos_embed", "ln_final.hook_scale", "ln_final.hook_normalized"):
        assert name in names
    for layer in range(2):
        for suffix in (
            "hook_resid_pre",
            "hook_attn_out",
            "hook_resid_mid",
            "hook_mlp_out",
            "hook_resid_post",
            "attn.hook_q",
            "attn.hook_k",
            "attn.hook_v",
            "attn.hook_attn_scores",
            "attn.hook_pattern",
            "attn.hook_z",
            "attn.hook_result",
            "ln1.hook_scale",
            "ln1.hook_normalized",
            "ln2.hook_scale",
            "ln2.hook_normalized",
            "mlp.hook_pre",
            "mlp.hook_post",
        ):
            assert f"blocks.{layer}.{suffix}" in names


# ---- layer norm ----------------------------------------------------------------------------------


def ln_inputs(cache, layer: int) -> dict[str, torch.Tensor]:
    """Post-LN: what ln1 and ln2 of a layer normalize."""
    return {
        "ln1": cache[f"blocks.{layer}.hook_resid_pre"] + cache[f"blocks.{layer}.hook_attn_out"],
        "ln2": cache[f"blocks.{layer}.hook_resid_mid"] + cache[f"blocks.{layer}.hook_mlp_out"],
    }


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("eps", [0.0, 0.5])
def test_post_ln(eps, dtype):
    model = ExactTransformer(ExactConfig(**{**BASE, "normalization": "post", "ln_eps": eps, "dtype": dtype}))
    model.init_weights(seed=10, scale=0.8)  # LN gain 1 and bias 0
    _, cache = model.run_with_cache(random_tokens(3, 6, 5))
    tol = TOL[dtype] * 10
    for layer in range(2):
        for ln, x in ln_inputs(cache, layer).items():
            normalized = cache[f"blocks.{layer}.{ln}.hook_normalized"]
            scale = cache[f"blocks.{layer}.{ln}.hook_scale"]
            var = ((x - x.mean(-1, keepdim=True)) ** 2).mean(-1, keepdim=True)
            torch.testing.assert_close(scale, (var + eps).sqrt(), atol=tol, rtol=tol)
            torch.testing.assert_close(normalized, (x - x.mean(-1, keepdim=True)) / scale, atol=tol, rtol=tol)
            mean = normalized.mean(-1)
            torch.testing.assert_close(mean, torch.zeros_like(mean), atol=tol, rtol=0)
            mean_square = (normalized**2).mean(-1)
            want = (var / (var + eps)).squeeze(-1)
            torch.testing.assert_close(mean_square, want, atol=tol, rtol=tol)
            if eps == 0:
                torch.testing.assert_close(mean_square, torch.ones_like(mean_square), atol=tol, rtol=0)
        # gain 1, bias 0: the stream after each LN is the normalized vector itself
        for resid, ln in (("resid_mid", "ln1"), ("resid_post", "ln2")):
            torch.testing.assert_close(
                cache[f"blocks.{layer}.hook_{resid}"], cache[f"blocks.{layer}.{ln}.hook_normalized"]
            )


def test_post_ln_applies_gain_and_bias():
    model = make_model(seed=11, normalization="post", dtype="float64")
    _, cache = model.run_with_cache(random_tokens(2, 5, 5))
    ln1 = model.blocks[0].ln1
    want = cache["blocks.0.ln1.hook_normalized"] * ln1.w.detach() + ln1.b.detach()
    torch.testing.assert_close(cache["blocks.0.hook_resid_mid"], want, atol=1e-12, rtol=0)


@pytest.mark.parametrize("norm", ["post", "pre"])
def test_ln_without_centering_only_scales(norm):
    model = make_model(seed=12, normalization=norm, ln_center=False, ln_eps=0.0, dtype="float64")
    _, cache = model.run_with_cache(random_tokens(2, 5, 5))
    if norm == "post":
        x = ln_inputs(cache, 0)["ln1"]
    else:
        x = cache["blocks.0.hook_resid_pre"]
    assert x.mean(-1).abs().max() > 1e-3  # so that centering would show
    normalized = cache["blocks.0.ln1.hook_normalized"]
    scale = cache["blocks.0.ln1.hook_scale"]
    torch.testing.assert_close(scale, (x**2).mean(-1, keepdim=True).sqrt(), atol=1e-12, rtol=1e-12)
    torch.testing.assert_close(normalized * scale, x, atol=1e-12, rtol=1e-12)
    torch.testing.assert_close((normalized**2).mean(-1), torch.ones(2, 5, dtype=F64), atol=1e-12, rtol=0)


def test_pre_ln_structure():
    model = make_model(seed=13, normalization="pre", dtype="float64")
    assert isinstance(model.ln_final, torch.nn.Module)
    logits, cache = model.run_with_cache(random_tokens(2, 5, 5))

    def ln(module, x):
        x = x - x.mean(-1, keepdim=True)
        return x / ((x**2).mean(-1, keepdim=True) + module.eps).sqrt() * module.w.detach() + module.b.detach()

    for layer, block in enumerate(model.blocks):
        resid_pre = cache[f"blocks.{layer}.hook_resid_pre"]
        attn_in = ln(block.ln1, resid_pre)
        q = torch.einsum("bpm,hmd->bphd", attn_in, block.attn.W_Q.detach()) + block.attn.b_Q.detach()
        torch.testing.assert_close(cache[f"blocks.{layer}.attn.hook_q"], q, atol=1e-12, rtol=0)
        mid = resid_pre + cache[f"blocks.{layer}.hook_attn_out"]
        torch.testing.assert_close(cache[f"blocks.{layer}.hook_resid_mid"], mid, atol=1e-12, rtol=0)
        mlp_in = ln(block.ln2, mid)
        pre = mlp_in @ block.mlp.W_in.detach() + block.mlp.b_in.detach()
        torch.testing.assert_close(cache[f"blocks.{layer}.mlp.hook_pre"], pre, atol=1e-12, rtol=0)
        post = mid + cache[f"blocks.{layer}.hook_mlp_out"]
        torch.testing.assert_close(cache[f"blocks.{layer}.hook_resid_post"], post, atol=1e-12, rtol=0)
    final = ln(model.ln_final, cache["blocks.1.hook_resid_post"])
    torch.testing.assert_close(logits, final @ model.W_U.detach() + model.b_U.detach(), atol=1e-12, rtol=0)


@pytest.mark.parametrize("norm", ["none", "post"])
def test_no_final_ln_unless_pre(norm):
    model = make_model(seed=14, normalization=norm, dtype="float64")
    assert not hasattr(model, "ln_final")
    logits, cache = model.run_with_cache(random_tokens(2, 5, 5))
    want = cache["blocks.1.hook_resid_post"] @ model.W_U.detach() + model.b_U.detach()
    torch.testing.assert_close(logits, want, atol=1e-12, rtol=0)


def test_normalization_type_for_transformer_lens():
    assert ExactConfig(**{**BASE, "normalization": "none"}).normalization_type is None
    assert ExactConfig(**{**BASE, "normalization": "post"}).normalization_type is None
    assert ExactConfig(**{**BASE, "normalization": "pre"}).normalization_type == "LN"
    assert ExactConfig(**{**BASE, "normalization": "pre", "ln_center": False}).normalization_type == "RMS"


# ---- parameters in HookedTransformer format ------------------------------------------------------


def expected_shapes(cfg: ExactConfig) -> dict[str, tuple[int, ...]]:
    m, h, d, v = cfg.d_model, cfg.n_heads, cfg.d_head, cfg.d_vocab
    shapes = {"embed.W_E": (v, m), "unembed.W_U": (m, cfg.d_vocab_out), "unembed.b_U": (cfg.d_vocab_out,)}
    if cfg.learned_positions:
        shapes["pos_embed.W_pos"] = (cfg.n_ctx, m)
    else:
        shapes["pos_embed.W_feat"] = (len(cfg.positional_features), m)
    for layer in range(cfg.n_layers):
        p = f"blocks.{layer}"
        shapes.update({f"{p}.attn.W_{x}": (h, m, d) for x in "QKV"})
        shapes.update({f"{p}.attn.b_{x}": (h, d) for x in "QKV"})
        shapes.update({f"{p}.attn.W_O": (h, d, m), f"{p}.attn.b_O": (m,)})
        if cfg.d_mlp:
            mlp = cfg.d_mlp
            shapes.update({f"{p}.mlp.W_in": (m, mlp), f"{p}.mlp.b_in": (mlp,)})
            shapes.update({f"{p}.mlp.W_out": (mlp, m), f"{p}.mlp.b_out": (m,)})
        if cfg.normalization != "none":
            lns = ("ln1", "ln2") if cfg.d_mlp else ("ln1",)
            shapes.update({f"{p}.{ln}.{x}": (m,) for ln in lns for x in "wb"})
    if cfg.normalization == "pre":
        shapes.update({"ln_final.w": (m,), "ln_final.b": (m,)})
    return shapes


@pytest.mark.parametrize(
    "overrides",
    [
        dict(normalization="pre", positional_features=("learned",), n_ctx=7),
        dict(normalization="post", d_mlp=0, n_heads=3, d_head=4),
        dict(normalization="none", positional_features=(), dtype="float64"),
        dict(normalization="pre", d_mlp=0, positional_features=sinusoidal_features(4)),
    ],
    ids=["pre-learned", "post-attn-only", "none-no-features", "pre-sinusoidal"],
)
def test_state_dict_is_hooked_transformer_format(overrides):
    cfg = ExactConfig(**{**BASE, **overrides})
    state = ExactTransformer(cfg).state_dict()
    want = expected_shapes(cfg)
    assert set(state) == set(want)
    for key, shape in want.items():
        assert tuple(state[key].shape) == shape, key
        assert state[key].dtype == cfg.torch_dtype, key


def test_float64_end_to_end():
    model = make_model(seed=15, normalization="pre", dtype="float64")
    logits, cache = model.run_with_cache(random_tokens(2, 5, 5))
    assert logits.dtype == F64
    assert all(value.dtype == F64 for value in cache.values())


def test_init_weights_is_seeded_and_sets_ln_gain():
    a = ExactTransformer(ExactConfig(**{**BASE, "normalization": "pre"})).init_weights(seed=3)
    b = ExactTransformer(ExactConfig(**{**BASE, "normalization": "pre"})).init_weights(seed=3)
    c = ExactTransformer(ExactConfig(**{**BASE, "normalization": "pre"})).init_weights(seed=4)
    for key, value in a.state_dict().items():
        assert torch.equal(value, b.state_dict()[key]), key
    assert not torch.equal(a.embed.W_E, c.embed.W_E)
    assert torch.equal(a.ln_final.w, torch.ones(6)) and torch.equal(a.blocks[0].attn.b_Q, torch.zeros(2, 3))
    assert a.blocks[0].attn.W_Q.abs().max() > 0


def test_init_weights_without_positional_features():
    model = ExactTransformer(ExactConfig(**{**BASE, "positional_features": ()})).init_weights(seed=0)
    assert torch.isfinite(model(random_tokens(1, 4, 5))).all()


# ---- TransformerLens utilities -------------------------------------------------------------------


@pytest.mark.parametrize("norm", ["none", "pre"])
def test_activation_cache_methods(norm):
    model = make_model(seed=16, normalization=norm, dtype="float64", use_attn_result=True)
    tokens = random_tokens(2, 5, 5)
    logits, cache = model.run_with_cache(tokens)
    assert isinstance(cache, ActivationCache)

    accumulated, labels = cache.accumulated_resid(return_labels=True)
    assert labels == ["0_pre", "1_pre", "final_post"]
    assert accumulated.shape == (3, 2, 5, 6)
    torch.testing.assert_close(accumulated[1], cache["blocks.1.hook_resid_pre"], atol=0, rtol=0)
    torch.testing.assert_close(accumulated[-1], cache["blocks.1.hook_resid_post"], atol=0, rtol=0)
    if norm == "pre":
        lensed = cache.accumulated_resid(apply_ln=True)
        torch.testing.assert_close(lensed[-1] @ model.W_U + model.b_U, logits, atol=1e-12, rtol=0)

    parts, labels = cache.decompose_resid(return_labels=True)
    assert labels == ["embed", "pos_embed", "0_attn_out", "0_mlp_out", "1_attn_out", "1_mlp_out"]
    torch.testing.assert_close(parts.sum(0), cache["blocks.1.hook_resid_post"], atol=1e-12, rtol=0)
    torch.testing.assert_close(cache.decompose_resid(layer=1).sum(0), cache["blocks.1.hook_resid_pre"])

    heads, labels = cache.stack_head_results(return_labels=True)
    assert labels == ["L0H0", "L0H1", "L1H0", "L1H1"]
    assert heads.shape == (4, 2, 5, 6)
    for layer in range(2):
        b_O = model.blocks[layer].attn.b_O.detach()
        total = heads[2 * layer : 2 * layer + 2].sum(0) + b_O
        torch.testing.assert_close(total, cache[f"blocks.{layer}.hook_attn_out"], atol=1e-12, rtol=0)


def test_stack_head_results_without_hook_result():
    """ActivationCache computes head results from hook_z and W_O when hook_result did not fire."""
    model = make_model(seed=17, dtype="float64")
    _, cache = model.run_with_cache(random_tokens(2, 5, 5))
    heads = cache.stack_head_results()
    total = heads[:2].sum(0) + model.blocks[0].attn.b_O.detach()
    torch.testing.assert_close(total, cache["blocks.0.hook_attn_out"], atol=1e-12, rtol=0)


def test_run_with_cache_without_batch_dim():
    model = make_model(seed=18)
    _, cache = model.run_with_cache(random_tokens(1, 4, 5), remove_batch_dim=True)
    assert isinstance(cache, ActivationCache)
    assert cache["hook_embed"].shape == (4, 6)
    assert cache["blocks.0.attn.hook_pattern"].shape == (2, 4, 4)


def test_activation_patching_resid_pre():
    model = make_model(seed=19, normalization="pre", attention_mask="causal")
    clean = torch.tensor([[0, 1, 2, 3, 1, 4]])
    corrupted = torch.tensor([[0, 1, 4, 3, 1, 4]])  # differs at position 2 only
    clean_logits, clean_cache = model.run_with_cache(clean)
    corrupted_logits = model(corrupted)

    def metric(logits):
        return logits[:, -1, 0].sum().detach()

    assert abs(float(metric(clean_logits)) - float(metric(corrupted_logits))) > 1e-3
    result = patching.get_act_patch_resid_pre(model, corrupted, clean_cache, metric)
    assert result.shape == (2, 6)
    # layer 0, position 2: the corrupted run then is the clean run; elsewhere layer 0's input is unchanged
    assert float(result[0, 2]) == pytest.approx(float(metric(clean_logits)), abs=1e-5)
    for pos in (0, 1, 3, 4, 5):
        assert float(result[0, pos]) == pytest.approx(float(metric(corrupted_logits)), abs=1e-5)
    # under a causal mask, positions before 2 never differ, so patching them changes nothing in any layer
    for pos in (0, 1):
        assert float(result[1, pos]) == pytest.approx(float(metric(corrupted_logits)), abs=1e-5)


def test_qk_and_ov_factored_matrices():
    model = ExactTransformer(ExactConfig(**{**BASE, "dtype": "float64", "use_attn_result": True, "attn_scale": 1.3}))
    model.init_weights(seed=20)  # biases 0: QK and OV are the whole bilinear / linear maps
    QK, OV = model.QK, model.OV
    assert isinstance(QK, FactoredMatrix) and isinstance(OV, FactoredMatrix)
    assert tuple(QK.shape) == (2, 2, 6, 6) and tuple(OV.shape) == (2, 2, 6, 6)
    gen = torch.Generator().manual_seed(0)
    resid = [torch.randn(2, 5, 6, generator=gen, dtype=F64) for _ in range(2)]
    hooks = [(f"blocks.{layer}.hook_resid_pre", lambda x, hook, r=resid[layer]: r) for layer in range(2)]
    with model.hooks(fwd_hooks=hooks):
        _, cache = model.run_with_cache(random_tokens(2, 5, 5))
    for layer in range(2):
        x = resid[layer]
        for h in range(2):
            raw = x @ QK.AB[layer, h] @ x.transpose(-1, -2)
            scores = cache[f"blocks.{layer}.attn.hook_attn_scores"][:, h]
            torch.testing.assert_close(scores * 1.3, raw, atol=1e-12, rtol=1e-12)
            pattern = cache[f"blocks.{layer}.attn.hook_pattern"][:, h]
            result = cache[f"blocks.{layer}.attn.hook_result"][:, :, h]
            torch.testing.assert_close(result, pattern @ (x @ OV.AB[layer, h]), atol=1e-12, rtol=1e-12)


# ---- save / load ---------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_save_load_round_trip(tmp_path, dtype):
    model = make_model(
        seed=21,
        dtype=dtype,
        normalization="post",
        attention_weighting="average_hard",
        residual_labels=tuple(f"r{k}" for k in range(6)),
        metadata={"paper": "test", "c": 1.5},
    )
    model.save(tmp_path / "ckpt")
    loaded = ExactTransformer.load(tmp_path / "ckpt")
    assert loaded.cfg == model.cfg
    tokens = random_tokens(3, 6, 5)
    n_positions = torch.tensor([6, 3, 5])
    assert torch.equal(loaded(tokens, n_positions=n_positions), model(tokens, n_positions=n_positions))
    for key, value in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[key], value) and loaded.state_dict()[key].dtype == value.dtype


def test_save_load_learned_positions(tmp_path):
    model = make_model(seed=22, positional_features=("learned",), n_ctx=9, normalization="pre")
    loaded = ExactTransformer.load(model.save(tmp_path))
    tokens = random_tokens(2, 9, 5)
    assert torch.equal(loaded(tokens), model(tokens))


def rewrite_weights(directory, change) -> None:
    state = torch.load(directory / "weights.pt", weights_only=True)
    change(state)
    torch.save(state, directory / "weights.pt")


@pytest.mark.parametrize(
    "change, expected",
    [
        (
            lambda s: s.update({"embed.W_E": torch.zeros(7, 6)}),
            r"embed\.W_E has shape \(7, 6\), config implies \(5, 6\)",
        ),
        (lambda s: s.pop("unembed.b_U"), r"missing weight unembed\.b_U"),
        (lambda s: s.update({"blocks.2.attn.W_Q": torch.zeros(2, 6, 3)}), r"unexpected weight blocks\.2\.attn\.W_Q"),
        (
            lambda s: s.update({"blocks.0.mlp.W_in": s["blocks.0.mlp.W_in"].double()}),
            r"blocks\.0\.mlp\.W_in has dtype torch\.float64, config says float32",
        ),
    ],
    ids=["shape", "missing", "unexpected", "dtype"],
)
def test_load_names_what_does_not_match(tmp_path, change, expected):
    make_model(seed=23).save(tmp_path)
    rewrite_weights(tmp_path, change)
    with pytest.raises(ExactLensError, match=expected):
        ExactTransformer.load(tmp_path)


def test_load_with_edited_config_names_the_weights(tmp_path):
    make_model(seed=24).save(tmp_path)
    data = json.loads((tmp_path / "config.json").read_text())
    data["d_mlp"] = 0
    (tmp_path / "config.json").write_text(json.dumps(data))
    with pytest.raises(ExactLensError, match=r"unexpected weight blocks\.0\.mlp\.W_in"):
        ExactTransformer.load(tmp_path)


def test_load_rejects_nan_weights(tmp_path):
    model = make_model(seed=25)
    with torch.no_grad():
        model.blocks[1].attn.W_V[0, 0, 0] = float("nan")
    with pytest.raises(ExactLensError, match=r"NaN.*blocks\.1\.attn\.W_V"):
        model.save(tmp_path / "refused")  # save refuses them ...
    model.write_checkpoint(tmp_path)  # ... and load refuses a file that has them anyway
    with pytest.raises(ExactLensError, match=r"NaN.*blocks\.1\.attn\.W_V"):
        ExactTransformer.load(tmp_path)


@pytest.mark.parametrize("missing", ["config.json", "weights.pt"])
def test_load_missing_file(tmp_path, missing):
    make_model().save(tmp_path)
    (tmp_path / missing).unlink()
    with pytest.raises(ExactLensError, match=missing.replace(".", r"\.") + " is missing"):
        ExactTransformer.load(tmp_path)
    with pytest.raises(ExactLensError, match="missing"):
        ExactTransformer.load(tmp_path / "nowhere")


@pytest.mark.parametrize(
    "text, expected",
    [
        ("{not json", "not valid JSON"),
        ('{"d_model": 6, "n_layers": 1, "d_vocab": 5, "colour": "red"}', r"unknown config fields \['colour'\]"),
        ('{"n_layers": 1, "d_vocab": 5}', "d_model"),
        ("[1, 2]", "JSON object"),
        ("null", "JSON object"),
        ('{"d_model": 6, "n_layers": 1, "d_vocab": 5, "attention_mask": "sideways"}', "attention_mask='sideways'"),
    ],
    ids=["bad-json", "unknown-field", "missing-field", "list", "null", "bad-value"],
)
def test_load_bad_config(tmp_path, text, expected):
    make_model().save(tmp_path)
    (tmp_path / "config.json").write_text(text)
    with pytest.raises(ExactLensError, match=expected):
        ExactTransformer.load(tmp_path)


@pytest.mark.parametrize("content", [b"garbage", b""], ids=["garbage", "empty"])
def test_load_corrupt_weights_file(tmp_path, content):
    make_model().save(tmp_path)
    (tmp_path / "weights.pt").write_bytes(content)
    with pytest.raises(ExactLensError, match=r"weights\.pt"):
        ExactTransformer.load(tmp_path)


def test_load_weights_file_that_is_not_a_state_dict(tmp_path):
    make_model().save(tmp_path)
    torch.save(torch.zeros(3), tmp_path / "weights.pt")
    with pytest.raises(ExactLensError, match=r"weights\.pt"):
        ExactTransformer.load(tmp_path)


# ---- bad input -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "tokens, n_positions, expected",
    [
        (torch.zeros(2, 3), None, r"integer torch\.Tensor.*float32"),
        ([[0, 1, 2]], None, r"integer torch\.Tensor.*list"),
        (torch.zeros(2, 3, dtype=torch.bool), None, "integer"),
        (torch.zeros(3, dtype=torch.long), None, r"shape \[batch >= 1, pos >= 1\], got \(3,\)"),
        (torch.zeros(0, 3, dtype=torch.long), None, r"got \(0, 3\)"),
        (torch.zeros(2, 0, dtype=torch.long), None, r"got \(2, 0\)"),
        (torch.zeros(1, 2, 3, dtype=torch.long), None, "shape"),
        (torch.tensor([[0, 5, 1]]), None, r"token ids must lie in \[0, 5\), got range \[0, 5\]"),
        (torch.tensor([[0, -1, 1]]), None, r"\[0, 5\)"),
        (torch.tensor([[0, 1, 2]]), torch.tensor([0]), r"n_positions must lie in \[1, 3\]"),
        (torch.tensor([[0, 1, 2]]), torch.tensor([4]), r"n_positions must lie in \[1, 3\]"),
        (torch.tensor([[0, 1, 2]]), torch.tensor([3, 3]), r"shape \[batch\]"),
        (torch.tensor([[0, 1, 2]]), [3], r"shape \[batch\]"),
        (torch.tensor([[0, 1, 2]]), torch.tensor([2.5]), "integer"),
    ],
    ids=[
        "float-tokens",
        "list-tokens",
        "bool-tokens",
        "1d",
        "empty-batch",
        "no-positions",
        "3d",
        "id-too-big",
        "id-negative",
        "n-zero",
        "n-too-big",
        "n-wrong-shape",
        "n-list",
        "n-float",
    ],
)
def test_bad_input_raises_helpful_error(tokens, n_positions, expected):
    model = make_model()
    with pytest.raises(ExactLensError, match=expected):
        model(tokens, n_positions=n_positions)


def test_too_many_positions_for_learned_table():
    model = make_model(positional_features=("learned",), n_ctx=4)
    model(torch.zeros(1, 4, dtype=torch.long))
    with pytest.raises(ExactLensError, match=r"5 positions exceed the learned positional table \(n_ctx=4\)"):
        model(torch.zeros(1, 5, dtype=torch.long))


def test_bad_return_type():
    with pytest.raises(ExactLensError, match="return_type"):
        make_model()(torch.zeros(1, 2, dtype=torch.long), return_type="loss")
    assert make_model()(torch.zeros(1, 2, dtype=torch.long), return_type=None) is None


@pytest.mark.parametrize(
    "overrides, expected",
    [
        (dict(attention_mask="future"), r"attention_mask='future' is not allowed; choose one of none, causal"),
        (dict(attention_weighting="sparsemax"), r"attention_weighting='sparsemax'.*softmax"),
        (dict(attn_length_scale="sqrt_n"), r"attn_length_scale='sqrt_n'.*log_n"),
        (dict(normalization="rms"), r"normalization='rms'.*post"),
        (dict(act_fn="tanh"), r"act_fn='tanh'.*gelu"),
        (dict(readout="argmax"), r"readout='argmax'.*sigmoid"),
        (dict(dtype="float16"), r"dtype='float16'.*float64"),
        (dict(residual_labels=("a", "b")), "residual_labels has 2 names but d_model=6"),
        (dict(n_heads=4), "d_model=6 is not divisible by n_heads=4"),
        (dict(positional_features=("i/n", "i^3")), r"unknown positional feature 'i\^3'"),
        (dict(positional_features=("sin[2/4]",)), "0 <= 2j < D"),
        (dict(positional_features=("i", "i")), "repeat"),
        (dict(positional_features=("learned",)), "n_ctx"),
        (dict(positional_features=("learned",), n_ctx=0), "n_ctx"),
        (dict(positional_features=("learned", "i")), "cannot be combined"),
        (dict(d_model=0), "d_model must be a positive integer"),
        (dict(n_layers=1.5), "n_layers must be a positive integer"),
        (dict(d_vocab=True), "d_vocab must be a positive integer"),
        (dict(d_head=0), "d_head must be a positive integer"),
        (dict(d_mlp=-1), "d_mlp must be an integer >= 0"),
        (dict(attn_scale=0.0), "attn_scale"),
        (dict(attn_scale=float("inf")), "attn_scale"),
        (dict(ln_eps=-1e-5), "ln_eps must be a finite number >= 0"),
        (dict(ln_eps=float("inf")), "ln_eps must be a finite number"),
        (dict(ln_eps=float("nan")), "ln_eps"),
        (dict(hard_tie_tolerance=-0.1), "hard_tie_tolerance"),
        (dict(readout="sigmoid", d_vocab_out=2), "sigmoid readout has d_vocab_out=1"),
        (dict(vocab=("a", "b")), "vocab has 2 tokens but d_vocab=5"),
    ],
)
def test_bad_config_raises_helpful_error(overrides, expected):
    with pytest.raises(ExactLensError, match=expected):
        ExactConfig(**{**BASE, **overrides})


def test_unknown_feature_error_lists_known_features():
    with pytest.raises(ExactLensError) as info:
        ExactConfig(**{**BASE, "positional_features": ("wobble",)})
    assert "i/n" in str(info.value) and "register_position_feature" in str(info.value)


def test_config_json_round_trip():
    cfg = ExactConfig(**{**BASE, "residual_labels": tuple("abcdef"), "vocab": tuple("vwxyz"), "ln_eps": 0.0})
    assert ExactConfig.from_dict(json.loads(cfg.to_json())) == cfg


# ---- positional features -------------------------------------------------------------------------


def feature_values(names: tuple[str, ...], lengths: list[int], dtype: str = "float64") -> torch.Tensor:
    """hook_pos_embed of a model whose W_feat is the identity: the feature values [batch, pos, feature]."""
    model = ExactTransformer(
        ExactConfig(d_model=len(names), n_layers=1, d_vocab=2, positional_features=names, dtype=dtype)
    )
    with torch.no_grad():
        model.pos_embed.W_feat.copy_(torch.eye(len(names)))
    tokens = torch.zeros(len(lengths), max(lengths), dtype=torch.long)
    _, cache = model.run_with_cache(tokens, n_positions=torch.tensor(lengths))
    return cache["hook_pos_embed"]


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_named_features_match_their_formulas(dtype):
    names = tuple(FEATURE_FORMULAS)
    lengths = [1, 2, 3, 4, 5, 7]
    values = feature_values(names, lengths, dtype)
    for b, n in enumerate(lengths):
        for i in range(n):
            for f, name in enumerate(names):
                want = FEATURE_FORMULAS[name](i, n)
                assert float(values[b, i, f]) == pytest.approx(want, abs=TOL[dtype]), (name, i, n)
    # cos(i*pi) is exactly (-1)^i
    col = names.index("cos(i*pi)")
    assert values[5, :7, col].tolist() == [(-1.0) ** i for i in range(7)]


NAMED_FEATURES = [n for n in positional.known_features() if n not in ("sin[j/D]", "cos[j/D]", "learned")]


@pytest.mark.parametrize("name", NAMED_FEATURES)
def test_every_known_feature_has_a_tested_formula(name):
    assert name in FEATURE_FORMULAS, f"add the formula of positional feature {name!r} to FEATURE_FORMULAS"


@pytest.mark.parametrize("d", [2, 4, 6, 10])
def test_sinusoidal_features_match_the_standard_encoding(d):
    names = sinusoidal_features(d)
    assert names[:2] == (f"sin[0/{d}]", f"cos[0/{d}]") and len(names) == d
    values = feature_values(names, [9])[0]
    for i in range(9):
        for j in range(d // 2):
            angle = i / 10000 ** (2 * j / d)
            assert float(values[i, 2 * j]) == pytest.approx(math.sin(angle), abs=1e-12)
            assert float(values[i, 2 * j + 1]) == pytest.approx(math.cos(angle), abs=1e-12)


@pytest.mark.parametrize("d", [0, 1, 3])
def test_sinusoidal_features_need_even_dimension(d):
    with pytest.raises(ExactLensError, match="even dimension"):
        sinusoidal_features(d)


def test_register_position_feature():
    name = "test_model:(i+1)/(n+1)"
    register_position_feature(name, lambda i, n: (i + 1) / (n + 1))
    try:
        values = feature_values((name, "i"), [3, 5])
        for b, n in enumerate([3, 5]):
            assert values[b, :n, 0].tolist() == pytest.approx([(i + 1) / (n + 1) for i in range(n)], abs=1e-15)
        with pytest.raises(ExactLensError, match="already exists"):
            register_position_feature(name, lambda i, n: i)
        with pytest.raises(ExactLensError, match="already exists"):
            register_position_feature("i/n", lambda i, n: i)
        with pytest.raises(ExactLensError, match="already exists"):
            register_position_feature("sin[0/2]", lambda i, n: i)
    finally:
        positional._FEATURES.pop(name, None)
    with pytest.raises(ExactLensError, match="unknown positional feature"):
        ExactConfig(**{**BASE, "positional_features": (name,)})


# ---- readout -------------------------------------------------------------------------------------


@pytest.mark.parametrize("position", [0, 2, -1])
def test_sigmoid_readout_reads_its_position(position):
    model = make_model(seed=26, readout="sigmoid", d_vocab_out=1, readout_position=position, dtype="float64")
    tokens = random_tokens(3, 6, 5)
    n_positions = torch.tensor([6, 4, 3])
    with torch.no_grad():
        logits = model(tokens, n_positions=n_positions)[..., 0]
        got = model.readout_logits(tokens, n_positions)
    for b, n in enumerate([6, 4, 3]):
        assert float(got[b]) == float(logits[b, position if position >= 0 else n + position])
    with pytest.raises(ExactLensError, match="readout='sigmoid'"):
        make_model().readout_logits(tokens)


def test_per_layer_normalization_and_selective_ln(tmp_path):
    """normalization per layer (final LN only when every layer is pre-LN) and ln_select."""
    with pytest.raises(ExactLensError, match=r"normalization\[1\]='mid' is not allowed"):
        ExactConfig(**{**BASE, "normalization": ("pre", "mid")})
    with pytest.raises(ExactLensError, match="ln_select=True .* defined for pre-LN"):
        ExactConfig(**{**BASE, "normalization": ("post", "none"), "ln_select": True})
    with pytest.raises(ExactLensError, match="ln_select must be True or False"):
        ExactConfig(**{**BASE, "ln_select": 1})
    assert ExactConfig(**{**BASE, "normalization": ("pre", "pre")}).final_ln
    assert not ExactConfig(**{**BASE, "normalization": "pre", "ln_final": False}).final_ln
    forced = ExactConfig(**{**BASE, "normalization": "post", "ln_final": True})
    assert forced.final_ln and not forced.standard_final_ln and forced.normalization_type is None
    no_final = ExactConfig(**{**BASE, "normalization": "pre", "ln_final": False})
    assert no_final.normalization_type is None  # TL's decompositions would apply a final LN that is not there
    with pytest.raises(ExactLensError, match="ln_final must be True, False or None"):
        ExactConfig(**{**BASE, "ln_final": "yes"})
    mixed = make_model(seed=5, normalization=("pre", "none"), ln_select=True, dtype="float64")
    assert not mixed.cfg.final_ln and not hasattr(mixed, "ln_final") and not hasattr(mixed.blocks[1], "ln1")
    assert mixed.cfg.normalization_type is None  # TransformerLens's decompositions do not apply
    # the selector is what LN reads: zeroing every row but two leaves LN of those two components
    with torch.no_grad():
        keep = torch.zeros(6, 6, dtype=F64)
        keep[0, 0] = keep[3, 3] = 1.0
        mixed.blocks[0].ln1.W_select.copy_(keep)
        mixed.blocks[0].ln1.w.fill_(1.0)
        mixed.blocks[0].ln1.b.zero_()
    tokens = random_tokens(2, 5, 5)
    _, cache = mixed.run_with_cache(tokens)
    x = cache["blocks.0.hook_resid_pre"]
    picked = torch.zeros_like(x)
    picked[..., [0, 3]] = x[..., [0, 3]]
    centred = picked - picked.mean(-1, keepdim=True)
    want = centred / (centred.pow(2).mean(-1, keepdim=True) + mixed.cfg.ln_eps).sqrt()
    torch.testing.assert_close(cache["blocks.0.ln1.hook_normalized"], want, atol=1e-12, rtol=0)
    mixed.save(tmp_path / "m")
    again = ExactTransformer.load(tmp_path / "m")
    assert again.cfg.normalization == ("pre", "none") and again.cfg.ln_select
    torch.testing.assert_close(again(tokens), mixed(tokens), atol=0, rtol=0)
    fresh = ExactTransformer(mixed.cfg).init_weights(seed=1)
    torch.testing.assert_close(fresh.blocks[0].ln1.W_select, torch.eye(6, dtype=F64), atol=0, rtol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
def test_average_hard_weights_are_the_division_bit_for_bit(dtype):
    """hard_weights computes tied / count as tied * (1 / count), in place: the same values for every row (tied is 0
    or 1), with a mask and without, and on rows that see no key (weight 0 everywhere)."""
    from exactlens.model.components import hard_weights

    gen = torch.Generator().manual_seed(0)
    scores = torch.randint(0, 4, (3, 2, 9, 11), generator=gen).to(dtype) + 1e-3 * torch.rand(3, 2, 9, 11,
                                                                                            generator=gen, dtype=dtype)
    allowed = torch.rand(3, 1, 9, 11, generator=gen) < 0.6
    allowed[0, 0, 2] = False  # a query that sees no key
    for tol in (0.0, 0.01, 0.5):
        for mask in (None, allowed):
            masked = scores if mask is None else scores.masked_fill(~mask, -float("inf"))
            tied = masked >= masked.amax(-1, keepdim=True) - tol
            if mask is not None:
                tied = tied & mask
            tied = tied.to(dtype)
            want = tied / tied.sum(-1, keepdim=True).clamp(min=1)
            got = hard_weights(masked, mask, "average_hard", tol)
            assert torch.equal(got, want), (tol, mask is None)
            assert got.shape == scores.shape and got.dtype == dtype


def test_hard_weights_broadcast_a_larger_mask_as_before():
    """A mask with more rows than the scores (in-place is impossible there): the out-of-place result, broadcast."""
    from exactlens.model.components import hard_weights

    scores = torch.tensor([[[[1.0, 3.0, 3.0, 2.0]]]], dtype=F64)  # [1, 1, 1, 4]
    allowed = torch.tensor([[[[True, True, False, True]]], [[[True, False, False, True]]]])  # [2, 1, 1, 4]
    got = hard_weights(scores, allowed, "average_hard", 0.0)
    assert got.shape == (2, 1, 1, 4)
    assert got[0, 0, 0].tolist() == [0.0, 1.0, 0.0, 0.0]  # 3.0 at key 1 only (key 2 masked)
    assert got[1, 0, 0].tolist() == [0.0, 0.0, 0.0, 0.0]  # the best (3.0) is masked and the rest is below it

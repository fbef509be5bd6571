"""Chiang & Cholak (2022) constructions against the paper.

Every construction is checked at three levels, so that a wrong weight fails some test:
  * the weights themselves against the matrices the paper displays (§3.2, §3.3, §4.1, §4.2, §5.2);
  * the residual stream through hooks, dimension by dimension, against the paper's column
    vectors c^{1,i}, a^{1,i}, a^{2,0} (addressed by the residual labels);
  * the output logit against the closed forms (§3.2, Appendix A, eq. 1, §5.2, §5.3), which
    the tests re-derive inline instead of only calling the module's helpers.
n = |w| + 1 is the number of positions (CLS included); "length" means |w|.
"""

from __future__ import annotations

import math

import pytest
import torch

from exactlens.analysis.verify import verify
from exactlens.constructions import build, get, names
from exactlens.errors import ExactLensError
from exactlens.papers.chiang_cholak import constructions as cc
from exactlens.tasks import get as get_language

# This file checks the Chiang & Cholak entries; other papers' constructions have their own tests.
CC_NAMES = [n for n in names() if get(n).paper.startswith("Chiang & Cholak")]

PARITY = get_language("parity")
FIRST = get_language("first")
C_VALUES = (0.5, 1.0, 3.0)
DTYPES = ("float32", "float64")
GEN_SEED = 1234


# ----------------------------------------------------------------------------- helpers


def f64(values) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float64)


def lang_of(name: str):
    return PARITY if name.startswith("parity") else FIRST


def logits_of(model, ids: torch.Tensor) -> torch.Tensor:
    """Sigmoid logits [batch] in float64 for symbol ids [batch, |w|]."""
    tokens = lang_of(model.cfg.model_name).encode(ids).tokens
    with torch.no_grad():
        return model.readout_logits(tokens).double()


def cache_of(model, ids: torch.Tensor):
    tokens = lang_of(model.cfg.model_name).encode(ids).tokens
    with torch.no_grad():
        logits, cache = model.run_with_cache(tokens)
    return logits[:, 0, 0].double(), cache


def words(length: int, count: int = 24, seed: int = GEN_SEED) -> torch.Tensor:
    """All words for |w| <= 10, else `count` uniform random ones (reproducible)."""
    if length <= 10:
        return PARITY.all_words(length)
    return PARITY.sample(length, count, torch.Generator().manual_seed(seed + length))


def in_parity(ids: torch.Tensor) -> torch.Tensor:  # written here, independently of the language module
    return torch.tensor([sum(int(b) for b in row) % 2 == 1 for row in ids], dtype=torch.bool)


def in_first(ids: torch.Tensor) -> torch.Tensor:
    return torch.tensor([len(row) > 0 and int(row[0]) == 1 for row in ids], dtype=torch.bool)


def truth(name: str, ids: torch.Tensor) -> torch.Tensor:
    return in_parity(ids) if name.startswith("parity") else in_first(ids)


def col(model, label: str) -> int:
    return model.cfg.residual_labels.index(label)


def assert_close(actual, expected, rtol: float, atol: float, msg: str = "") -> None:
    actual = torch.as_tensor(actual, dtype=torch.float64)
    expected = torch.as_tensor(expected, dtype=torch.float64)
    torch.testing.assert_close(actual, expected, rtol=rtol, atol=atol, msg=lambda m: f"{msg}\n{m}")


TOL = {"float64": dict(rtol=1e-10, atol=1e-13), "float32": dict(rtol=2e-5, atol=2e-6)}


# ----------------------------------------------------------------------------- weights vs. the paper


def unit(d: int, i: int, value: float = 1.0) -> torch.Tensor:
    """value * e_i, 1-indexed as in the paper."""
    out = torch.zeros(d, dtype=torch.float64)
    out[i - 1] = value
    return out


def mat(d_out: int, d_in: int, entries: dict[tuple[int, int], float]) -> torch.Tensor:
    """A paper matrix (acting on column vectors) from 1-indexed entries."""
    out = torch.zeros(d_out, d_in, dtype=torch.float64)
    for (r, c), v in entries.items():
        out[r - 1, c - 1] = v
    return out


def paper_layer(d, q=None, k=None, v=None, f1=None, f2=None):
    """One head's (W^Q row, W^K row, W^V) and the FFN (W^{F,1}, W^{F,2}); None means zero."""
    zero_row = torch.zeros(d, dtype=torch.float64)
    return dict(
        q=zero_row if q is None else q,
        k=zero_row if k is None else k,
        v=torch.zeros(d, d, dtype=torch.float64) if v is None else v,
        f1=f1,
        f2=f2,
    )


def assert_weights(model, embed: torch.Tensor, pos: dict[str, torch.Tensor], layers: list[list[dict]],
                   ffns: list[tuple[torch.Tensor, torch.Tensor] | None], readout: torch.Tensor) -> None:
    """Compare every parameter with the paper's matrices.

    embed [3, d] = WE(0), WE(1), WE(CLS); pos: feature -> PE direction; layers[l][h] the paper's
    head (q, k rows and W^V acting on columns); ffns[l] = (W^{F,1}, W^{F,2}) or None (does nothing).
    The model's effective maps are compared: QK = W_Q W_K^T (= q^T k), OV = W_V W_O (= (W^V)^T),
    W_in = (W^{F,1})^T, W_out = (W^{F,2})^T; all biases are zero (Appendix B relies on it).
    """
    m = model.double()
    assert_close(m.embed.W_E, embed, 0, 0, "word embeddings")
    feats = m.cfg.positional_features
    assert set(feats) == set(pos)
    for f, direction in pos.items():
        assert_close(m.pos_embed.W_feat[feats.index(f)], direction, 0, 0, f"positional feature {f}")
    assert len(m.blocks) == len(layers)
    for li, (block, heads, ffn) in enumerate(zip(m.blocks, layers, ffns, strict=True)):
        att = block.attn
        assert att.W_Q.shape[0] == len(heads)
        for h, head in enumerate(heads):
            qk = att.W_Q[h] @ att.W_K[h].T
            assert_close(qk, torch.outer(head["q"], head["k"]), 0, 1e-15, f"QK layer {li + 1} head {h + 1}")
            ov = att.W_V[h] @ att.W_O[h]
            assert_close(ov, head["v"].T, 0, 1e-15, f"W^V layer {li + 1} head {h + 1}")
        for b in (att.b_Q, att.b_K, att.b_V, att.b_O):
            assert not b.abs().any(), f"attention bias in layer {li + 1}"
        mlp = block.mlp
        if ffn is None:
            assert mlp is None or not (mlp.W_in.abs().any() or mlp.W_out.abs().any())
        else:
            f1, f2 = ffn
            units = f1.shape[0]
            assert_close(mlp.W_in[:, :units], f1.T, 0, 0, f"W^F1 layer {li + 1}")
            assert_close(mlp.W_out[:units], f2.T, 0, 0, f"W^F2 layer {li + 1}")
            assert not mlp.W_in[:, units:].abs().any() and not mlp.W_out[units:].abs().any()
        if mlp is not None:
            assert not mlp.b_in.abs().any() and not mlp.b_out.abs().any(), f"FFN bias in layer {li + 1}"
    assert_close(m.unembed.W_U[:, 0], readout, 0, 0, "readout W^{L+1}")
    assert m.unembed.b_U.item() == 0


@pytest.mark.parametrize("c", C_VALUES)
def test_parity_weights_are_section_3_2(c):
    d = 9
    m = build("parity", dtype="float64", c=c)
    assert m.cfg.d_model == d and m.cfg.n_layers == 2 and m.cfg.n_heads == 2 and m.cfg.normalization == "none"
    embed = torch.stack([unit(d, 1), unit(d, 2), unit(d, 3)])
    pos = {"i/n": unit(d, 4), "cos(i*pi)": unit(d, 5)}
    q2 = unit(d, 3, c * math.sqrt(d))
    layer1 = [paper_layer(d, v=mat(d, d, {(6, 2): 1, (7, 3): 1})), paper_layer(d)]
    layer2 = [paper_layer(d, q=q2, k=unit(d, 5, -1), v=mat(d, d, {(9, 8): 1})),
              paper_layer(d, q=q2, k=unit(d, 5, 1), v=mat(d, d, {(9, 8): -1}))]
    f1 = mat(3, d, {(1, 4): -1, (1, 6): 1, (1, 7): -1, (2, 4): -1, (2, 6): 1, (3, 4): -1, (3, 6): 1, (3, 7): 1})
    f2 = mat(d, 3, {(8, 1): 1, (8, 2): -2, (8, 3): 1})
    assert_weights(m, embed, pos, [layer1, layer2], [(f1, f2), None], unit(d, 9))


@pytest.mark.parametrize("c", C_VALUES)
def test_first_weights_are_section_3_3(c):
    d = 6
    m = build("first", dtype="float64", c=c)
    assert m.cfg.d_model == d and m.cfg.n_layers == 2 and m.cfg.attn_length_scale == "none"
    embed = torch.stack([unit(d, 1), unit(d, 2), unit(d, 3)])
    layer2 = [paper_layer(d, q=unit(d, 3, c * math.sqrt(d)), k=unit(d, 4), v=mat(d, d, {(6, 4): -0.5, (6, 5): 1}))]
    f1 = mat(1, d, {(1, 1): -1, (1, 3): -1, (1, 4): 1})
    f2 = mat(d, 1, {(5, 1): 1})
    assert_weights(m, embed, {"I[i=1]": unit(d, 4)}, [[paper_layer(d)], layer2], [(f1, f2), None], unit(d, 6))
    # first-log is the same network with eq. (2) attention.
    log = build("first-log", dtype="float64", c=c)
    assert log.cfg.attn_length_scale == "log_n"
    assert_weights(log, embed, {"I[i=1]": unit(d, 4)}, [[paper_layer(d)], layer2], [(f1, f2), None], unit(d, 6))


@pytest.mark.parametrize("c", C_VALUES)
def test_first_flawed_weights_are_section_5_2(c):
    d = 5
    m = build("first-flawed", dtype="float64", c=c)
    assert m.cfg.n_layers == 1
    embed = torch.stack([unit(d, 1), unit(d, 2), unit(d, 3)])
    head = paper_layer(d, q=unit(d, 3, c * math.sqrt(d)), k=unit(d, 4),
                       v=mat(d, d, {(5, 1): -0.5, (5, 2): 0.5, (5, 3): -0.5}))
    assert_weights(m, embed, {"I[i=1]": unit(d, 4)}, [[head]], [None], unit(d, 5))


@pytest.mark.parametrize("name, base", [("parity-ln", "parity"), ("first-ln", "first")])
@pytest.mark.parametrize("eps", [0.0, 1e-5])
def test_ln_weights_are_section_4_1(name, base, eps):
    """W̄^Q = [W^Q 0], W̄^K = [W^K 0], W̄^V = [[W^V, 0], [-W^V, 0]], W̄^{F,1} = [W^{F,1} 0],
    W̄^{F,2} = [W^{F,2}; -W^{F,2}], embeddings [x; -x]; post-LN with gamma = 1, beta = 0."""
    m = build(name, dtype="float64", eps=eps)
    b = build(base, dtype="float64")
    d = b.cfg.d_model
    assert m.cfg.d_model == 2 * d and m.cfg.normalization == "post" and m.cfg.ln_eps == eps
    assert_close(m.embed.W_E, torch.cat([b.embed.W_E, -b.embed.W_E], -1), 0, 0)
    assert_close(m.pos_embed.W_feat, torch.cat([b.pos_embed.W_feat, -b.pos_embed.W_feat], -1), 0, 0)
    for nb, ob in zip(m.blocks, b.blocks, strict=True):
        for ln in (nb.ln1, nb.ln2):
            assert ln.eps == eps and bool((ln.w == 1).all()) and not ln.b.abs().any()
            assert not ln.w.requires_grad
        qk_new = nb.attn.W_Q @ nb.attn.W_K.transpose(-1, -2)
        qk_old = ob.attn.W_Q @ ob.attn.W_K.transpose(-1, -2)
        assert_close(qk_new[:, :d, :d], qk_old, 0, 0)
        assert not qk_new[:, d:].abs().any() and not qk_new[:, :, d:].abs().any()
        ov_old = ob.attn.W_V @ ob.attn.W_O  # (W^V)^T: [head, in, out]
        # Fig. 3's parameter is a single entry, so W_V itself is the 2d x 2d (W̄^V)^T and W_O = I.
        assert_close(nb.attn.W_O, torch.eye(2 * d, dtype=torch.float64).expand_as(nb.attn.W_O), 0, 0)
        assert_close(nb.attn.W_V[:, :d, :d], ov_old, 0, 0)
        assert_close(nb.attn.W_V[:, :d, d:], -ov_old, 0, 0)
        assert not nb.attn.W_V[:, d:].abs().any()
        assert_close(nb.mlp.W_in[:d], ob.mlp.W_in, 0, 0)
        assert not nb.mlp.W_in[d:].abs().any()
        assert_close(nb.mlp.W_out, torch.cat([ob.mlp.W_out, -ob.mlp.W_out], -1), 0, 0)
    assert_close(m.unembed.W_U[:d], b.unembed.W_U, 0, 0)
    assert not m.unembed.W_U[d:].abs().any()


@pytest.mark.parametrize("name, base", [("parity-ln-eta", "parity-ln"), ("first-ln-eta", "first-ln")])
@pytest.mark.parametrize("eta", [0.01, 0.5])
def test_prop2_layer_weights(name, base, eta):
    """§4.2: the new layer's attention does nothing, W^{F,1} = [I; -I],
    W^{F,2} = [-I I] + [[W, -W], [-W, W], 0] with W = the old readout, readout c e_1
    with c = -log(exp(eta) - 1)/sqrt(d/2) (eta converted from bits to nats)."""
    m = build(name, dtype="float64", eta=eta)
    old = build(base, dtype="float64", eps=0.0)
    d = old.cfg.d_model
    L = old.cfg.n_layers
    assert m.cfg.n_layers == L + 1 and m.cfg.ln_eps == 0 and m.cfg.d_model == d
    for nb, ob in zip(m.blocks[:L], old.blocks, strict=True):  # the old layers are untouched
        for p in ("W_Q", "W_K", "W_V", "W_O"):
            assert_close(getattr(nb.attn, p), getattr(ob.attn, p), 0, 0)
        assert_close(nb.mlp.W_in[:, : ob.mlp.W_in.shape[1]], ob.mlp.W_in, 0, 0)
        assert not nb.mlp.W_in[:, ob.mlp.W_in.shape[1]:].abs().any()
        assert_close(nb.mlp.W_out[: ob.mlp.W_out.shape[0]], ob.mlp.W_out, 0, 0)
    last = m.blocks[L]
    assert not (last.attn.W_V @ last.attn.W_O).abs().any()
    eye = torch.eye(d, dtype=torch.float64)
    f1 = torch.cat([eye, -eye], 0)  # [2d, d]
    w = old.unembed.W_U[:, 0]
    f2 = torch.cat([-eye, eye], 1)
    f2[0] += torch.cat([w, -w])
    f2[1] += torch.cat([-w, w])
    assert_close(last.mlp.W_in[:, : 2 * d], f1.T, 0, 0)
    assert_close(last.mlp.W_out[: 2 * d], f2.T, 0, 0)
    assert not last.mlp.b_in.abs().any() and not last.mlp.b_out.abs().any()
    c = -math.log(math.exp(eta * math.log(2)) - 1) / math.sqrt(d / 2)
    assert_close(m.unembed.W_U[:, 0], unit(d, 1, c), 1e-12, 0)


# ----------------------------------------------------------------------------- closed forms


def parity_s_inline(n: int, k: int, c: float) -> float:
    """§3.2 (even n) and Appendix A (odd n), re-derived.

    Odd n: s = -(n-1) sinh 2c / (n Z1 Z2) for even k and +(n+1) sinh 2c / (n Z1 Z2) for odd k.
    (The paper prints cosh 2c in the odd-k line; expanding its own previous line,
    (n+1)/2 (e^{2c} - e^{-2c}), gives sinh 2c.)
    """
    if n % 2 == 0:
        return (-1) ** (k + 1) * 2 * math.tanh(c) / n**2
    z1 = (n - 1) / 2 * math.exp(c) + (n + 1) / 2 * math.exp(-c)
    z2 = (n + 1) / 2 * math.exp(c) + (n - 1) / 2 * math.exp(-c)
    if k % 2 == 0:
        return -(n - 1) * math.sinh(2 * c) / (n * z1 * z2)
    return (n + 1) * math.sinh(2 * c) / (n * z1 * z2)


PARITY_LENGTHS = list(range(1, 11)) + [49, 50, 199, 200]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("c", C_VALUES)
def test_parity_logit_closed_form(dtype, c):
    m = build("parity", dtype=dtype, c=c)
    for length in PARITY_LENGTHS:
        ids = words(length, count=6)
        n, ks = length + 1, ids.sum(1).tolist()
        s = logits_of(m, ids)
        expected = f64([parity_s_inline(n, k, c) for k in ks])
        helper = f64([cc.parity_closed_form(n, k, c) for k in ks])
        assert_close(helper, expected, 1e-12, 0, "chiang_cholak.parity_closed_form disagrees with Appendix A")
        if dtype == "float64":
            assert_close(s, expected, 1e-8, 0, f"|w|={length}")
        else:  # k/n, I[i=k]/n in float32: the error is absolute, ~1e-8, while s ~ 1/n^2
            assert_close(s, expected, 1e-3, 5e-8, f"|w|={length}")
        assert bool(((s > 0) == torch.tensor([k % 2 == 1 for k in ks])).all()), "sign rule: s > 0 iff k odd"


def test_parity_even_n_value_is_independent_of_position_of_ones():
    """For even n, s depends on k only through its parity: ±2 tanh(c)/n^2 exactly."""
    m = build("parity", dtype="float64", c=1.0)
    ids = PARITY.all_words(9)
    s = logits_of(m, ids)
    expected = 2 * math.tanh(1.0) / 100
    assert_close(s.abs(), torch.full_like(s, expected), 1e-12, 0)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("c", C_VALUES)
def test_first_logit_eq1(dtype, c):
    m = build("first", dtype=dtype, c=c)
    for length in list(range(1, 11)) + [100, 300]:
        ids = words(length, count=6)
        n = length + 1
        expected = f64([math.exp(c) / (math.exp(c) + n - 1) * (float(r[0] == 1) - 0.5) for r in ids])
        helper = f64([cc.first_closed_form(n, bool(r[0] == 1), c) for r in ids])
        assert_close(helper, expected, 1e-14, 0)
        assert_close(logits_of(m, ids), expected, **TOL[dtype], msg=f"|w|={length}")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("c", C_VALUES)
def test_first_flawed_logit_section_5_2(dtype, c):
    m = build("first-flawed", dtype=dtype, c=c)
    for length in list(range(1, 11)) + [100, 300]:
        ids = words(length, count=6)
        n, z = length + 1, math.exp(c) + length
        expected = f64([(math.exp(c) - 1) / z * (float(r[0] == 1) - 0.5) + (int(r.sum()) - n / 2) / z for r in ids])
        helper = f64([cc.first_flawed_closed_form(n, bool(r[0] == 1), int(r.sum()), c) for r in ids])
        assert_close(helper, expected, 1e-12, 1e-15)
        assert_close(logits_of(m, ids), expected, **TOL[dtype], msg=f"|w|={length}")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("c", C_VALUES)
def test_first_log_logit_section_5_3(dtype, c):
    """Eq. (2): CLS gives position 1 weight n^c/(n^c + n - 1); for c = 1 that is n/(2n-1), so
    s = n/(2n-1) (I[w_1=1] - 1/2) and 1/4 < |s| <= 1/3 (<= 1/2, the paper's bound) for every n >= 2."""
    m = build("first-log", dtype=dtype, c=c)
    for length in list(range(1, 11)) + [100, 300]:
        ids = words(length, count=6)
        n = length + 1
        sign = f64([float(r[0] == 1) - 0.5 for r in ids])
        s = logits_of(m, ids)
        assert_close(s, n**c / (n**c + n - 1) * sign, **TOL[dtype], msg=f"|w|={length}")
        helper = f64([cc.first_log_closed_form(n, bool(r[0] == 1), c) for r in ids])
        assert_close(helper, n**c / (n**c + n - 1) * sign, 1e-14, 0)
        if c == 1.0:
            assert_close(s, n / (2 * n - 1) * sign, **TOL[dtype])
            assert bool((s.abs() > 0.25).all()) and bool((s.abs() <= 0.5).all())
            assert bool((s.abs() <= 1 / 3 + 1e-6).all())


def test_empty_word_is_rejected():
    """|w| = 0 (n = 1): CLS sees only itself and every logit is 0, which rejects; neither language
    contains the empty word. The Prop. 2 layer normalizes the zero vector [s, -s, 0...] with eps = 0,
    which is 0/0 (NaN): see test_empty_word_prop2_is_nan."""
    empty = torch.zeros(1, 0, dtype=torch.long)
    for name in CC_NAMES:
        if name.endswith("-eta"):
            continue
        s = logits_of(build(name, dtype="float64"), empty)
        assert torch.isfinite(s).all() and s.item() <= 0, name
        assert not truth(name, empty).item()


@pytest.mark.parametrize("name", ["parity-ln-eta", "first-ln-eta"])
def test_empty_word_prop2_is_outside_the_stated_range(name):
    # Prop. 2 layer: for the empty word s = 0 and LN(0) with eps = 0 is 0/0 -- faithfully NaN,
    # so the registry states |w| >= 1 and verify refuses length 0.
    s = logits_of(build(name, dtype="float64"), torch.zeros(1, 0, dtype=torch.long))
    assert torch.isnan(s).all()
    assert get(name).min_length == 1
    with pytest.raises(ExactLensError, match="defined for"):
        verify(name, [0, 1])


# ----------------------------------------------------------------------------- residual stream through hooks


@pytest.mark.parametrize("c", [1.0, 3.0])
def test_parity_residual_stream_section_3_2(c):
    m = build("parity", dtype="float64", c=c)
    tol = dict(rtol=1e-12, atol=1e-14)
    for length in [1, 2, 3, 4, 7, 8, 33]:
        ids = words(length, count=16)
        s, cache = cache_of(m, ids)
        n, pos = length + 1, torch.arange(length + 1, dtype=torch.float64)
        k = ids.sum(1).double()[:, None]  # [batch, 1]
        tok = torch.cat([torch.full((ids.shape[0], 1), 2), ids], 1)  # 0, 1, 2 = CLS
        a0 = {"I[w_i=0]": (tok == 0).double(), "I[w_i=1]": (tok == 1).double(), "I[w_i=CLS]": (tok == 2).double(),
              "i/n": (pos / n).expand_as(tok), "cos(i*pi)": torch.cos(pos * math.pi).round().expand_as(tok)}
        c1 = dict(a0, **{"k/n": (k / n).expand_as(tok), "1/n": torch.full(tok.shape, 1 / n, dtype=torch.float64)})
        a1 = dict(c1, **{"I[i=k]/n": (pos[None] == k).double() / n})
        for label in m.cfg.residual_labels:
            zero = torch.zeros(tok.shape, dtype=torch.float64)
            got = {h: cache[f"blocks.{h}"][..., col(m, label)] for h in
                   ("0.hook_resid_pre", "0.hook_resid_mid", "0.hook_resid_post")}
            assert_close(got["0.hook_resid_pre"], a0.get(label, zero), **tol, msg=f"a^0 {label} |w|={length}")
            assert_close(got["0.hook_resid_mid"], c1.get(label, zero), **tol, msg=f"c^1 {label} |w|={length}")
            assert_close(got["0.hook_resid_post"], a1.get(label, zero), **tol, msg=f"a^1 {label} |w|={length}")
        # h^{1,i} = (1/n) [max(0, k-i-1), max(0, k-i), max(0, k-i+1)]
        h = cache["blocks.0.mlp.hook_post"][..., :3]
        diff = k - pos[None]
        expected_h = torch.stack([(diff - 1).clamp(min=0), diff.clamp(min=0), (diff + 1).clamp(min=0)], -1) / n
        assert_close(h, expected_h, **tol)
        # Layer 2 attention at CLS: head 1 weights exp((-1)^(i+1) c), head 2 exp((-1)^i c), normalized.
        pattern = cache["blocks.1.attn.hook_pattern"][:, :, 0, :]  # [batch, head, key]
        alt = torch.cos(pos * math.pi).round()
        for head, sign in ((0, -1), (1, 1)):
            w = torch.exp(sign * alt * c)
            assert_close(pattern[:, head], (w / w.sum()).expand_as(pattern[:, head]), **tol)
        # a^{2,0} = [0, 0, 1, 0, 1, k/n, 1/n, I[k=0]/n, s]
        cls = cache["blocks.1.hook_resid_post"][:, 0, :]
        expected = torch.zeros(ids.shape[0], 9, dtype=torch.float64)
        expected[:, 2] = 1
        expected[:, 4] = 1
        expected[:, 5] = k[:, 0] / n
        expected[:, 6] = 1 / n
        expected[:, 7] = (k[:, 0] == 0).double() / n
        expected[:, 8] = f64([parity_s_inline(n, int(kk), c) for kk in k[:, 0]])
        assert_close(cls, expected, rtol=1e-9, atol=1e-14, msg=f"a^(2,0) |w|={length}")
        assert_close(s, expected[:, 8], rtol=1e-12, atol=0)


@pytest.mark.parametrize("name", ["first", "first-log"])
@pytest.mark.parametrize("c", [1.0, 3.0])
def test_first_residual_stream_section_3_3(name, c):
    m = build(name, dtype="float64", c=c)
    tol = dict(rtol=1e-12, atol=1e-14)
    for length in [1, 2, 3, 6, 40]:
        ids = words(length, count=16)
        s, cache = cache_of(m, ids)
        n, pos = length + 1, torch.arange(length + 1)
        tok = torch.cat([torch.full((ids.shape[0], 1), 2), ids], 1)
        none = torch.zeros_like(tok, dtype=torch.bool)
        a0 = torch.stack([tok == 0, tok == 1, tok == 2, (pos == 1).expand_as(tok), none, none], -1).double()
        a1 = a0.clone()
        a1[..., 4] = ((tok == 1) & (pos == 1)).double()
        assert col(m, "I[w_i=1 & i=1]") == 4 and col(m, "s") == 5
        assert_close(cache["blocks.0.hook_resid_pre"], a0, **tol)
        assert_close(cache["blocks.0.hook_resid_mid"], a0, **tol, msg="layer-1 attention does nothing")
        assert_close(cache["blocks.0.hook_resid_post"], a1, **tol, msg="a^1 with I[w_i=1 & i=1]")
        # Layer 2 at CLS: weight e^c (or n^c under eq. 2) on position 1, 1 on the others.
        top = n**c if name == "first-log" else math.exp(c)
        w = torch.ones(n, dtype=torch.float64)
        w[1] = top
        pattern = cache["blocks.1.attn.hook_pattern"][:, 0, 0, :]
        assert_close(pattern, (w / w.sum()).expand_as(pattern), **tol)
        cls = cache["blocks.1.hook_resid_post"][:, 0, :]
        expected = torch.zeros(ids.shape[0], 6, dtype=torch.float64)
        expected[:, 2] = 1
        expected[:, 5] = top / (top + n - 1) * (ids[:, 0].double() - 0.5)
        assert_close(cls, expected, **tol, msg="a^(2,0) = [0, 0, 1, 0, 0, s]")
        assert_close(s, expected[:, 5], **tol)


def test_first_flawed_residual_stream():
    c = 2.0
    m = build("first-flawed", dtype="float64", c=c)
    for length in [1, 4, 9]:
        ids = words(length)
        s, cache = cache_of(m, ids)
        n = length + 1
        cls = cache["blocks.0.hook_resid_post"][:, 0, :]
        z = math.exp(c) + n - 1
        expected = torch.zeros(ids.shape[0], 5, dtype=torch.float64)
        expected[:, 2] = 1
        expected[:, 4] = ((math.exp(c) - 1) * (ids[:, 0].double() - 0.5) + ids.sum(1).double() - n / 2) / z
        assert_close(cls, expected, rtol=1e-12, atol=1e-14)


# ----------------------------------------------------------------------------- §4.1 and Appendix B


HOOKS = ("hook_resid_pre", "hook_attn_out", "hook_resid_mid", "hook_mlp_out", "hook_resid_post")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("eps", [0.0, 1e-5])
@pytest.mark.parametrize("name", ["parity-ln", "first-ln", "first-log-ln"])
def test_ln_residual_is_x_minus_x_and_normalized(name, eps, dtype):
    m = build(name, dtype=dtype, eps=eps)
    d = m.cfg.d_model // 2
    labels = m.cfg.residual_labels
    assert labels[d:] == tuple(f"-({lab})" for lab in labels[:d])
    atol = 1e-12 if dtype == "float64" else 2e-6
    for length in [1, 2, 5, 8, 40]:
        ids = words(length, count=8)
        _, cache = cache_of(m, ids)
        for layer in range(m.cfg.n_layers):
            for hook in HOOKS:
                x = cache[f"blocks.{layer}.{hook}"].double()
                assert_close(x[..., d:], -x[..., :d], 0, atol, f"{hook} layer {layer} is not [x; -x]")
            for hook, ln in (("hook_resid_mid", "ln1"), ("hook_resid_post", "ln2")):
                x = cache[f"blocks.{layer}.{hook}"].double()
                assert_close(x.mean(-1), torch.zeros(x.shape[:-1], dtype=torch.float64), 0, atol,
                             f"post-LN mean, {hook} layer {layer}")
                ms = x.pow(2).mean(-1)
                scale2 = cache[f"blocks.{layer}.{ln}.hook_scale"][..., 0].double() ** 2  # var + eps
                expected = (scale2 - eps) / scale2 if eps else torch.ones_like(ms)
                assert_close(ms, expected, 10 * atol, 10 * atol, f"post-LN mean square, {hook} layer {layer}")


@pytest.mark.parametrize("eps", [0.0, 1e-5])
@pytest.mark.parametrize("name, base", [("parity-ln", "parity"), ("first-ln", "first")])
def test_appendix_b_scaling_and_same_decisions(name, base, eps):
    """Layer 1 is the no-LN layer times a positive per-position factor (A_1 C_1), and the
    final decisions equal the no-LN model's on every string."""
    for c in (0.5, 3.0):
        ln_model = build(name, dtype="float64", eps=eps, c=c)
        plain = build(base, dtype="float64", c=c)
        d = plain.cfg.d_model
        for length in [1, 2, 3, 4, 7, 8, 31, 100]:
            ids = words(length, count=12)
            s_ln, cache_ln = cache_of(ln_model, ids)
            s, cache = cache_of(plain, ids)
            assert torch.equal(s_ln > 0, s > 0), f"{name} c={c} |w|={length}"
            assert torch.equal(s > 0, truth(base, ids))
            for hook in ("blocks.0.hook_resid_mid", "blocks.0.hook_resid_post"):
                x, y = cache_ln[hook][..., :d], cache[hook]
                ratio = (x * y).sum(-1) / (y * y).sum(-1)  # least-squares factor per position
                assert bool((ratio > 0).all())
                assert_close(x, ratio[..., None] * y, 1e-10, 1e-12, f"{hook}: not a positive multiple")


# ----------------------------------------------------------------------------- Prop. 2


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", ["parity-ln-eta", "first-ln-eta"])
def test_prop2_cross_entropy_is_eta_for_every_string(name, dtype):
    rtol = 1e-9 if dtype == "float64" else 1e-5
    for eta in (0.01, 0.3):
        m = build(name, dtype=dtype, eta=eta)
        d = m.cfg.d_model
        last = f"blocks.{m.cfg.n_layers - 1}.hook_resid_post"
        for length in list(range(1, 9)) + [31, 200]:
            ids = words(length, count=8)
            s, cache = cache_of(m, ids)
            member = truth(name, ids)
            p = torch.sigmoid(s)
            ce_bits = -torch.log2(torch.where(member, p, 1 - p))
            assert_close(ce_bits, torch.full_like(ce_bits, eta), rtol, 0, f"eta={eta} |w|={length}")
            # the final pre-readout vector at CLS: [±sqrt(d/2), ∓sqrt(d/2), 0, ...], + iff accepted
            v = cache[last][:, 0, :].double()
            sign = member.double() * 2 - 1
            expected = torch.zeros_like(v)
            expected[:, 0] = sign * math.sqrt(d / 2)
            expected[:, 1] = -sign * math.sqrt(d / 2)
            assert_close(v, expected, rtol, 10 * rtol, f"final vector eta={eta} |w|={length}")


def test_prop2_rejects_eta_that_cannot_recognize():
    """c = -log(2^eta - 1)/sqrt(d/2) is 0 at eta = 1 bit and negative above: then no decision
    would be right, so eta must lie in (0, 1) bits."""
    for name in ("parity-ln-eta", "first-ln-eta"):
        for eta in (0, -0.1, 1.0, 2.0, math.inf, math.nan, "0.1", True):
            with pytest.raises(ExactLensError):
                build(name, eta=eta)
        build(name, eta=0.999)


# ----------------------------------------------------------------------------- Prop. 3 with layer norm


def test_prop3_first_log_ln_normalized_logit():
    """Prop. 3 with LN: at the last layer's first LN, the pre-LN vector at CLS is
    [0, 0, A, 0, 0, s; 0, 0, -A, 0, 0, -s], so s̄ = s / sqrt((A^2 + s^2)/6 + eps).

    The paper takes A = 1 and s from the no-LN network (|s| > 1/4). In the real network the
    earlier LNs rescale: A = sqrt(6) (LN of CLS's one-hot [e_3; -e_3]), position 1's key and value
    are sqrt(2) (w_1 = 1) or sqrt(3) (w_1 = 0) after layer 1, so with eps = 0 and c = 1
    s = sqrt(2)/2 * n^sqrt(6)/(n^sqrt(6) + n - 1) if w_1 = 1 and -sqrt(3)/2 * n^3/(n^3 + n - 1) if not,
    and s̄ = s/sqrt(1 + s^2/6). The smallest |s̄| is at |w| = 1, w = 1: 0.58065, which is still above
    the paper's bound (1/4)(5/24 + eps)^(-1/2) = 0.5477; |s̄| rises to 0.6794 (w_1 = 1) and
    sqrt(2/3) = 0.8165 (w_1 = 0) as n grows.
    """
    for eps in (0.0, 1e-5):
        m = build("first-log-ln", dtype="float64", eps=eps)
        cls_dim, s_dim = col(m, "I[w_i=CLS]"), col(m, "s")
        smallest = math.inf
        for length in list(range(1, 11)) + [30, 100, 1000]:
            ids = words(length, count=8)
            if length > 10:
                ids = torch.cat([ids, FIRST.hard_words(length)])
            final, cache = cache_of(m, ids)
            pre = cache["blocks.1.hook_resid_pre"][:, 0] + cache["blocks.1.hook_attn_out"][:, 0]
            others = [i for i in range(pre.shape[-1]) if i not in (cls_dim, s_dim, cls_dim + 6, s_dim + 6)]
            assert not pre[:, others].abs().any()
            A, s = pre[:, cls_dim], pre[:, s_dim]
            sbar = cache["blocks.1.hook_resid_mid"][:, 0, s_dim]
            assert_close(sbar, s / torch.sqrt((A**2 + s**2) / 6 + eps), 1e-12, 1e-15, f"s̄ |w|={length}")
            assert_close(final, sbar / cache["blocks.1.ln2.hook_scale"][:, 0, 0], 1e-12, 1e-15)
            assert torch.equal(final > 0, in_first(ids))
            n = length + 1
            if eps == 0:
                assert_close(A, torch.full_like(A, math.sqrt(6)), 1e-12, 0)
                a1, a0 = n ** math.sqrt(6), n**3.0
                w1 = ids[:, 0] == 1
                s_one, s_zero = math.sqrt(2) / 2 * a1 / (a1 + n - 1), -math.sqrt(3) / 2 * a0 / (a0 + n - 1)
                s_exp = torch.where(w1, f64(s_one), f64(s_zero))
                assert_close(s, s_exp, 1e-12, 0, f"s |w|={length}")
                assert_close(final, s_exp / torch.sqrt(1 + s_exp**2 / 6), 1e-12, 0)
            smallest = min(smallest, float(final.abs().min()))
        paper_bound = 0.25 * (5 / 24 + eps) ** -0.5
        assert smallest > paper_bound
        s1 = math.sqrt(2) / 2 * 2 ** math.sqrt(6) / (2 ** math.sqrt(6) + 1)  # |w| = 1, w = "1", eps = 0
        assert smallest == pytest.approx(s1 / math.sqrt(1 + s1**2 / 6), rel=1e-12 if eps == 0 else 1e-5)
        assert smallest == pytest.approx(0.58065, abs=1e-5)


@pytest.mark.parametrize("dtype", DTYPES)
def test_first_log_ln_decisions(dtype):
    for eps in (0.0, 1e-5):
        m = build("first-log-ln", dtype=dtype, eps=eps)
        for length in list(range(1, 11)) + [200]:
            ids = FIRST.all_words(length) if length <= 10 else torch.cat([words(length, 16), FIRST.hard_words(length)])
            assert torch.equal(logits_of(m, ids) > 0, in_first(ids)), f"|w|={length}"


# ----------------------------------------------------------------------------- §5.2 flawed FIRST


def test_first_flawed_correct_iff_exp_c_exceeds_length():
    """The worst word is 1 0^(|w|-1): s (e^c + |w|) = (e^c - |w|)/2. So the model is right on all
    words of length |w| iff e^c > |w| (i.e. c > log(n - 1))."""
    for c in (0.5, 1.0, 2.0, 2.3, 3.0):
        m = build("first-flawed", dtype="float64", c=c)
        for length in range(1, 26):
            if length <= 12:
                ids = FIRST.all_words(length)
            else:
                ids = torch.cat([words(length, count=64), FIRST.hard_words(length)])
            ok = torch.equal(logits_of(m, ids) > 0, in_first(ids))
            assert ok == (math.exp(c) > length), f"c={c} |w|={length}"
            worst = torch.tensor([[1] + [0] * (length - 1)])
            s = logits_of(m, worst).item()
            assert s == pytest.approx((math.exp(c) - length) / (2 * (math.exp(c) + length)), rel=1e-12, abs=1e-15)


@pytest.mark.parametrize("m_int", [3, 5, 8, 12])
def test_first_flawed_boundary(m_int):
    """c = log m + 1e-6: correct on every word with |w| <= m, 1 0^m wrong.
    c = log m - 1e-6: correct up to |w| = m - 1, 1 0^(m-1) wrong."""
    for delta, last_good in ((1e-6, m_int), (-1e-6, m_int - 1)):
        model = build("first-flawed", dtype="float64", c=math.log(m_int) + delta)
        for length in range(1, last_good + 1):
            ids = FIRST.all_words(length)
            assert torch.equal(logits_of(model, ids) > 0, in_first(ids)), f"m={m_int} delta={delta} |w|={length}"
        bad = last_good + 1
        worst = torch.tensor([[1] + [0] * (bad - 1)])
        assert logits_of(model, worst).item() < 0, f"1 0^{bad - 1} should be misclassified"


# ----------------------------------------------------------------------------- accuracy on all strings




@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", [n for n in CC_NAMES if n != "first-flawed"])
def test_accuracy_all_strings_and_long_random(name, dtype):
    m = build(name, dtype=dtype)
    lang = lang_of(name)
    for length in range(1, 13):
        ids = lang.all_words(length)
        s = logits_of(m, ids)
        assert torch.isfinite(s).all()
        assert torch.equal(s > 0, truth(name, ids)), f"{name} {dtype} |w|={length}"
    gen = torch.Generator().manual_seed(7)
    for length, count in ((50, 32), (200, 16), (1000, 8)):
        ids = lang.sample(length, count, gen)
        if length < 1000:
            ids = torch.cat([ids, lang.hard_words(length)])
        s = logits_of(m, ids)
        assert torch.equal(s > 0, truth(name, ids)), f"{name} {dtype} |w|={length}"
    # language membership of the module agrees with the inline one
    assert torch.equal(lang.membership(ids), truth(name, ids))


# ----------------------------------------------------------------------------- Fig. 3


def test_fig3_parameter_is_one_and_sensitive():
    m = build("parity-ln", dtype="float64", eps=0.0)
    labels = m.cfg.residual_labels
    assert labels[5] == "k/n" and labels[1] == "I[w_i=1]"  # the paper's 1-indexed 6 and 2
    W = m.blocks[0].attn.W_V
    assert W[0, 1, 5].item() == 1.0
    assert W[0, 1, 5 + 9].item() == -1.0  # its -k/n twin
    length = 100
    ids = PARITY.hard_words(length)  # 1^k 0^(100-k) over the range of k
    assert torch.equal(logits_of(m, ids) > 0, in_parity(ids))
    for value in (1.01, 0.99, 1.2):
        with torch.no_grad():
            W[0, 1, 5] = value
        wrong = int((~torch.eq(logits_of(m, ids) > 0, in_parity(ids))).sum())
        assert wrong > 0, f"W̄^(V,1,1)_(6,2) = {value} should break accuracy at |w| = {length}"
    with torch.no_grad():
        W[0, 1, 5] = 1.0
    assert torch.equal(logits_of(m, ids) > 0, in_parity(ids))


# ----------------------------------------------------------------------------- labels and registry


@pytest.mark.parametrize("name", names())
def test_every_construction_labels_every_dimension(name):
    m = build(name)
    labels = m.cfg.residual_labels
    assert labels is not None and len(labels) == m.cfg.d_model
    assert len(set(labels)) == len(labels) and all(isinstance(x, str) and x for x in labels)
    assert not any(x.startswith("dim") for x in labels)
    assert m.cfg.model_name == name
    if name in CC_NAMES:
        assert get(name).language == lang_of(name).name


def test_registry_lists_the_paper_constructions():
    assert {"parity", "first", "parity-ln", "first-ln", "parity-ln-eta", "first-ln-eta", "first-log",
            "first-log-ln", "first-flawed"} <= set(names())
    for name in names():
        desc = get(name).describe()
        assert desc["name"] == name and "dtype" not in desc["parameters"]


def test_registry_errors():
    with pytest.raises(ExactLensError, match="unknown construction"):
        build("no-such-construction")
    with pytest.raises(ExactLensError, match="no parameters"):
        build("parity", eps=0.0)
    with pytest.raises(ExactLensError):
        build("first", gamma=1)
    for name in CC_NAMES:
        for bad_c in (0, -1.0, math.inf, math.nan, "1", True):
            with pytest.raises(ExactLensError):
                build(name, c=bad_c)
    for name in ("parity-ln", "first-ln", "first-log-ln"):
        for bad_eps in (-1e-9, -1.0, math.inf, math.nan, "0", None):
            with pytest.raises(ExactLensError):
                build(name, eps=bad_eps)
    for name in ("parity-ln-eta", "first-ln-eta"):
        for bad_eta in (0, -0.5):
            with pytest.raises(ExactLensError):
                build(name, eta=bad_eta)
    with pytest.raises(ExactLensError):
        build("parity", dtype="float16")


def test_build_passes_dtype_and_parameters():
    m = build("parity", dtype="float64", c=2.0)
    assert m.cfg.dtype == "float64" and m.W_E.dtype == torch.float64
    assert m.cfg.metadata["c"] == 2.0
    assert not m.training
    m = build("first-log-ln", eps=0.0)
    assert m.cfg.dtype == "float32" and m.cfg.ln_eps == 0.0
    m = build("parity-ln-eta", dtype="float64", eta=0.25)
    assert m.cfg.metadata["eta_bits"] == 0.25
    assert build("parity", c=3).cfg.metadata["c"] == 3.0

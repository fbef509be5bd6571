"""Cookbook §5.3.3 layer-norm hash and index lookup, with the selective layer norm of the
model (Layer(ln1=..., ln2=...) -> per-layer pre-LN, LN(x @ W_select)). References are
computed here: LN of the 4-vector by its definition, lookups by plain Python indexing."""

from __future__ import annotations

import itertools
import math
from dataclasses import replace
from decimal import Decimal, getcontext

import pytest
import torch

from exactlens.constructions.cookbook import (
    FFN,
    Layer,
    Program,
    Readout,
    attention,
    compile,
    layer_norm_hash,
    parallel,
    read,
    run_on_residual,
)
from exactlens.errors import ExactLensError

H = layer_norm_hash
DTYPES = ("float32", "float64")
SYMBOLS = ("a", "b")
KEY, QUERY = H.hash_labels("phi(j+1)"), H.hash_labels("phi(i)")


def ln_reference(v: torch.Tensor) -> torch.Tensor:
    """Definition 6.1 with gain 1, bias 0, eps 0 over the last axis."""
    v = v.double()
    centered = v - v.mean(-1, keepdim=True)
    return centered / centered.pow(2).mean(-1, keepdim=True).sqrt()


def hash_model(dtype: str, extra: tuple[str, ...] = ()) -> torch.nn.Module:
    """One hash layer phi(x, y) -> h[0..3], then an LN-free layer; ``extra`` labels ride along."""
    layers = (H.hash_layer({"x": 1.0}, {"y": 1.0}, H.hash_labels("h"), name="hash"), Layer())
    program = Program(
        vocab=("t",),
        embedding={},
        layers=layers,
        readout=Readout({"o": {"x": 1.0}}),
        labels=("x", "y", *extra, *H.hash_labels("h")),
    )
    return compile(program, dtype=dtype)


def read_hash(cache, model, hook: str, labels) -> torch.Tensor:
    return torch.stack([read(cache, model, hook, label) for label in labels], -1).double()


def tokens_of(words: list[str]) -> torch.Tensor:
    """[CLS] first (id len(SYMBOLS)), then the symbols."""
    return torch.tensor([[len(SYMBOLS)] + [SYMBOLS.index(c) for c in w] for w in words], dtype=torch.long)


def predecessor_reference(word: str) -> list[list[float]]:
    """Position p >= 2 gets the one-hot of w[p - 2] (the symbol at position p - 1); 0 and 1 get zeros."""
    rows = [[0.0] * len(SYMBOLS), [0.0] * len(SYMBOLS)]
    for c in word[:-1]:
        rows.append([1.0 if s == c else 0.0 for s in SYMBOLS])
    return rows[: len(word) + 1]


def first_wrong_position(model, n_pos: int) -> int | None:
    """First position i >= 1 whose lookup does not put all weight on i - 1 (None: all right)."""
    tokens = torch.zeros(1, n_pos, dtype=torch.long)
    tokens[0, 0] = len(SYMBOLS)
    _, cache = model.run_with_cache(tokens, names_filter="blocks.3.attn.hook_pattern")
    pattern = cache["blocks.3.attn.hook_pattern"][0, 0]
    i = torch.arange(1, n_pos)
    wrong = i[pattern[i, i - 1] != 1]
    return int(wrong[0]) if wrong.numel() else None


# ----------------------------------------------------------------------------- the hash


@pytest.mark.parametrize("dtype", DTYPES)
def test_hash_layer_is_the_closed_form_and_the_layer_norm_of_the_4_vector(dtype):
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(3, 50, generator=gen, dtype=torch.float64) * 10
    y = torch.rand(3, 50, generator=gen, dtype=torch.float64) * 10 + 1e-3
    model = hash_model(dtype)
    _, cache = run_on_residual(model, {"x": x, "y": y})
    got = read_hash(cache, model, "blocks.0.hook_resid_post", H.hash_labels("h"))
    direct = ln_reference(torch.stack([x, y, -x, -y], -1))
    closed = math.sqrt(2) * torch.stack([x, y, -x, -y], -1) / torch.sqrt(x * x + y * y).unsqueeze(-1)
    assert torch.allclose(H.phi(x, y), direct, atol=1e-14) and torch.allclose(closed, direct, atol=1e-14)
    tol = 2e-6 if dtype == "float32" else 1e-14
    assert torch.allclose(got, direct, atol=tol, rtol=0)
    # the LN-free layer after it changes nothing; the model is pre-LN only where selected
    assert model.cfg.per_layer("normalization") == ("pre", "none") and model.cfg.ln_select
    assert not model.cfg.final_ln


@pytest.mark.parametrize("dtype", DTYPES)
def test_hash_is_scale_invariant(dtype):
    gen = torch.Generator().manual_seed(1)
    i = torch.arange(0, 40, dtype=torch.float64).reshape(1, -1)
    n = torch.tensor([[40.0], [7.0], [1234.0]], dtype=torch.float64)
    c = torch.rand(3, 40, generator=gen, dtype=torch.float64) * 100 + 1e-2
    model = hash_model(dtype)
    _, plain = run_on_residual(model, {"x": i.expand(3, -1), "y": torch.ones(3, 40)})
    _, scaled = run_on_residual(model, {"x": i / n, "y": (1 / n).expand(3, 40)})
    _, random_scale = run_on_residual(model, {"x": c * i, "y": c})
    hook, labels = "blocks.0.hook_resid_post", H.hash_labels("h")
    want = H.phi(i.expand(3, -1))
    tol = 2e-6 if dtype == "float32" else 1e-14
    for cache in (plain, scaled, random_scale):
        assert torch.allclose(read_hash(cache, model, hook, labels), want, atol=tol, rtol=0)
    # a negative scale flips the hash (the sign of y matters)
    assert torch.allclose(H.phi(-i - 1, -torch.ones_like(i)), -H.phi(i + 1), atol=1e-15)


@pytest.mark.parametrize("dtype", DTYPES)
def test_selector_ignores_other_residual_content(dtype):
    """Random values in labels the selector does not read change nothing, bit for bit."""
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(2, 30, generator=gen, dtype=torch.float64)
    y = torch.rand(2, 30, generator=gen, dtype=torch.float64) + 0.1
    junk = {f"junk{k}": torch.randn(2, 30, generator=gen, dtype=torch.float64) * 10 ** (k - 2) for k in range(5)}
    model = hash_model(dtype, extra=tuple(junk))
    _, clean = run_on_residual(model, {"x": x, "y": y})
    _, noisy = run_on_residual(model, {"x": x, "y": y, **junk})
    labels = H.hash_labels("h")
    hook = "blocks.0.hook_resid_post"
    assert torch.equal(read_hash(clean, model, hook, labels), read_hash(noisy, model, hook, labels))


def test_general_selector_is_the_m_vector_layer_norm_whatever_d_model():
    """Slots of any mean (centering is part of W_select) and gain sqrt(m / d_model): the
    sublayer sees LN over the m slot values, for two different residual widths."""
    gen = torch.Generator().manual_seed(3)
    spec = {"s0": {"u": 1.0, "v": -2.0}, "s1": {"v": 3.0}, "s2": {"u": 0.5, "w": 1.0}}
    copy = FFN.build(
        [{s: 1.0} for s in spec],
        {s: [float(k == u) for u in range(3)] for k, s in enumerate(spec)},
        activation="identity",
    )
    vals = {k: torch.randn(2, 9, generator=gen, dtype=torch.float64) for k in ("u", "v", "w")}
    slots = torch.stack([sum(w * vals[label] for label, w in row.items()) for row in spec.values()], -1)
    for pad in (0, 17):
        program = Program(
            vocab=("t",),
            embedding={},
            layers=(Layer(ffns=(copy,), ln2=spec), Layer()),
            readout=Readout({"o": {"u": 1.0}}),
            labels=("u", "v", "w", *spec, *[f"pad{k}" for k in range(pad)]),
        )
        model = compile(program)
        _, cache = run_on_residual(model, vals)
        got = torch.stack([read(cache, model, "blocks.0.hook_resid_post", s) for s in spec], -1)
        assert torch.allclose(got, ln_reference(slots), atol=1e-13)
        assert model.cfg.metadata["cookbook"]["layers"][0]["ln"] == [list(spec), list(spec)]


# ----------------------------------------------------------------------------- the gap


def test_gap_closed_form_matches_the_score_formula_and_its_asymptote():
    t = torch.arange(0, 100, dtype=torch.float64)  # beyond, 4 - score cancels too many digits
    assert torch.allclose(H.gap(t), H.score(t, t) - H.score(t, t + 1), rtol=1e-6, atol=0)
    assert torch.allclose(H.gap(t[1:], "previous"), H.score(t[1:], t[1:]) - H.score(t[1:], t[1:] - 1), rtol=1e-6)
    getcontext().prec = 60  # 4 (1 - cos) in 60 digits for large targets
    for target in (1000, 5447, 10**5):
        a = Decimal(target * target + target + 1)
        exact = 4 * (1 - a / (a * a + 1).sqrt())
        assert float(H.gap(target)) == pytest.approx(float(exact), rel=1e-13)
    assert torch.all(H.gap(t[1:]) < H.gap(t[1:], "previous"))  # the runner-up is t + 1
    # every other integer key scores lower still
    k = torch.arange(0, 200, dtype=torch.float64)
    for target in (0, 1, 5, 50, 150):
        others = k[(k != target)]
        assert (H.score(target, target) - H.score(target, others)).min() == pytest.approx(
            float(H.gap(target)), rel=1e-6
        )
    big = torch.tensor([1e3, 1e4, 1e5], dtype=torch.float64)
    assert torch.allclose(H.gap(big) * big**4 / 2, torch.ones(3, dtype=torch.float64), rtol=3e-3)


def test_measured_scores_equal_the_derived_scores_and_gap():
    model = compile(H.predecessor_program(SYMBOLS), dtype="float64")
    n_pos = 60
    _, cache = model.run_with_cache(tokens_of(["ab" * 30][:1])[:, :n_pos])
    scores = cache["blocks.3.attn.hook_attn_scores"][0, 0]
    i = torch.arange(n_pos, dtype=torch.float64)
    want = H.score(i[:, None], i[None, :] + 1)  # query phi(i), key phi(j + 1)
    visible = i[None, :] <= i[:, None]
    assert torch.allclose(scores[visible], want[visible], atol=1e-13, rtol=0)
    for row in range(1, n_pos):
        s = scores[row, : row + 1]
        best = s[row - 1]
        assert best == s.max() and best.item() == pytest.approx(4.0, abs=1e-13)
        runner_up = torch.cat([s[: row - 1], s[row:]]).max()
        assert (best - runner_up).item() == pytest.approx(float(H.gap(row)), abs=1e-12)


# ----------------------------------------------------------------------------- lookups


@pytest.mark.parametrize("dtype", DTYPES)
def test_predecessor_by_hash_is_exact_on_all_short_strings_and_random_long_ones(dtype):
    model = compile(H.predecessor_program(SYMBOLS), dtype=dtype)
    assert model.cfg.per_layer("normalization") == ("none", "pre", "pre", "none")
    gen = torch.Generator().manual_seed(4)
    batches = [["".join(w) for w in itertools.product(SYMBOLS, repeat=n)] for n in range(11)]
    longest = 40 if dtype == "float32" else 400  # float32 breaks at position ~42 (next test)
    for length in (11, 25, longest):
        batches.append(["".join(SYMBOLS[k] for k in torch.randint(0, 2, (length,), generator=gen)) for _ in range(8)])
    for words in batches:
        out = model(tokens_of(words)).double()
        want = torch.tensor([predecessor_reference(w) for w in words], dtype=torch.float64)
        assert torch.equal(out, want), words[0]


def test_float32_breaks_where_the_gap_reaches_rounding_and_float64_does_not():
    """Measured: float32's first wrong lookup is at position 42-44 (gap(i) = 4 / (r (r + a))
    ~ 2 / i^4 is then ~ 1-4 ulps of the top score 4); float64 is exact there (it breaks
    at position 5447-5960, see the slow test)."""
    models = {dt: compile(H.predecessor_program(SYMBOLS), dtype=dt) for dt in DTYPES}
    first32 = first_wrong_position(models["float32"], 80)
    assert first32 is not None and 38 <= first32 <= 48
    assert first_wrong_position(models["float64"], 80) is None
    ulps = float(H.gap(first32)) / (4 * torch.finfo(torch.float32).eps)
    assert 0.25 <= ulps <= 16


def test_unselected_layer_norm_breaks_the_lookup():
    """Negative control: the same weights, but ln2 of both hash layers also passes the rest of
    the stream (plain pre-LN of a stream that holds [x, y, -x, -y] next to other values)."""
    model = compile(H.predecessor_program(SYMBOLS), dtype="float64")
    words = ["abbab", "bbbbbbbbaaaa", "ab" * 10]
    assert all(torch.equal(model(tokens_of([w])).double()[0], torch.tensor(predecessor_reference(w))) for w in words)
    labels = model.cfg.residual_labels
    with torch.no_grad():
        for layer in (1, 2):
            W = model.blocks[layer].ln2.W_select
            slots = [labels.index(x) for x in model.cfg.metadata["cookbook"]["layers"][layer]["ln"][1]]
            rest = [k for k in range(len(labels)) if k not in slots]
            W[rest, rest] = 1.0
    wrong = sum(
        not torch.equal(model(tokens_of([w])).double()[0], torch.tensor(predecessor_reference(w))) for w in words
    )
    assert wrong == len(words)


@pytest.mark.parametrize("dtype", DTYPES)
def test_soft_lookup_within_lemma_5_3_bound(dtype):
    n_pos = 11
    tau = H.lookup_scale(n_pos - 1, n_pos, tolerance=0.25)
    soft = compile(H.predecessor_program(SYMBOLS, weighting="softmax", scale=tau), dtype=dtype)
    word = "abbabaabba"
    out, cache = soft.run_with_cache(tokens_of([word]))
    want = torch.tensor(predecessor_reference(word), dtype=torch.float64)
    assert (out[0].double() - want).abs().max() <= 0.25
    pattern = cache["blocks.3.attn.hook_pattern"][0, 0].double()
    scores = cache["blocks.3.attn.hook_attn_scores"][0, 0].double()
    for i in range(1, n_pos):
        hard = torch.zeros(i + 1, dtype=torch.float64)
        hard[i - 1] = 1.0
        l1 = (pattern[i, : i + 1] - hard).abs().sum().item()
        derived = attention.lemma_5_3_bound(i + 1, tau * float(H.gap(i)))
        measured_gap = (scores[i, i - 1] - torch.cat([scores[i, : i - 1], scores[i, i : i + 1]]).max()).item()
        assert l1 <= derived * (1 + 1e-3) + 1e-6
        assert l1 <= attention.lemma_5_3_bound(i + 1, measured_gap) * (1 + 1e-3) + 1e-6
    # unscaled softmax (tau = 1): the gap is tiny and the error is considerable (§5.7)
    plain = compile(H.predecessor_program(SYMBOLS, weighting="softmax"), dtype=dtype)
    assert (plain(tokens_of([word]))[0].double() - want).abs().max() > 0.4


# ----------------------------------------------------------------------------- program checks


def test_selective_layers_are_checked():
    hash_layer = H.hash_layer({"x": 1.0}, {"y": 1.0}, H.hash_labels("h"))
    readout = Readout({"o": {"x": 1.0}})
    # every layer selective pre-LN: compiled without a final LN (ln_final=False), so the readout
    # reads the stream itself: here the hash, equal to the closed form
    only_hash = compile(
        Program(vocab=("t",), embedding={}, layers=(hash_layer,), readout=Readout({"o": {"h[0]": 1.0}})),
        dtype="float64",
    )
    assert only_hash.cfg.per_layer("normalization") == ("pre",) and not only_hash.cfg.final_ln
    assert not hasattr(only_hash, "ln_final")
    x, y = torch.tensor([[3.0, -2.0, 0.5]], dtype=torch.float64), torch.tensor([[1.0, 4.0, 0.25]], dtype=torch.float64)
    logits, _ = run_on_residual(only_hash, {"x": x, "y": y})
    assert torch.allclose(logits[..., 0].double(), H.phi(x, y)[..., 0], atol=1e-14, rtol=0)
    with pytest.raises(ExactLensError, match="normalization='none'"):
        compile(Program(vocab=("t",), embedding={}, layers=(hash_layer, Layer()), readout=readout, normalization="pre"))
    with pytest.raises(ExactLensError, match="eps = 0"):
        compile(Program(vocab=("t",), embedding={}, layers=(hash_layer, Layer()), readout=readout, ln_eps=1e-5))
    with pytest.raises(ExactLensError, match="does not select"):
        Layer(heads=(attention.uniform_average({"m": "x"}),), ln1={"p": {"x": 1.0}, "q": {"y": 1.0}})
    with pytest.raises(ExactLensError, match="give ln1"):
        replace(hash_layer, heads=(attention.uniform_average({"m": "x"}),))
    with pytest.raises(ExactLensError, match="serially"):
        parallel(hash_layer, Layer(heads=(attention.uniform_average({"m": "x"}),)))
    with pytest.raises(ExactLensError, match="fresh"):
        H.hash_layer({"x": 1.0}, {"y": 1.0}, ("x", "b", "c", "d"))
    # a program without selectors compiles as before (no ln_select, one normalization string)
    plain = compile(Program(vocab=("t",), embedding={}, layers=(Layer(),), readout=readout))
    assert plain.cfg.normalization == "none" and not plain.cfg.ln_select


@pytest.mark.slow
def test_float64_hash_lookup_limit_by_injected_counts():
    """float64's first wrong lookup, measured with inv = 1/(i+1) injected for windows of 8
    positions (the full model needs n^2 memory): 5447, where gap(i) ~ 2.3e-15 (the full
    model, one 9000-position run, 2.4 GB: first wrong at 5960; rounding paths differ)."""
    program = H.predecessor_program(("a",))
    model = compile(replace(program, layers=program.layers[1:]), dtype="float64")
    start = torch.arange(0, 8000, 7, dtype=torch.float64)[:, None]
    pos = start + torch.arange(8, dtype=torch.float64)
    inv = 1.0 / (pos + 1)
    _, cache = run_on_residual(model, {"one": torch.ones_like(inv), "inv": inv, "bos": torch.zeros_like(inv)})
    pattern = cache["blocks.2.attn.hook_pattern"][:, 0]
    k = torch.arange(1, 8)
    bad = pos[:, 1:][pattern[:, k, k - 1] != 1]
    first = int(bad.min())
    assert 4000 <= first <= 7000
    assert 0.25 <= float(H.gap(first)) / (4 * torch.finfo(torch.float64).eps) <= 16

"""Cookbook §5 attention recipes through the real ExactTransformer: residual values are
injected at hook_embed (positional features from the model itself), results read from
hook_resid_mid / hook_pattern and compared with references computed here."""

from __future__ import annotations

import math

import pytest
import torch
from cookbook_helpers import single_layer_model

from exactlens.constructions.cookbook import Layer, Program, Readout, attention, compile, read, run_on_residual
from exactlens.errors import ExactLensError

DTYPES = ("float32", "float64")


def t64(values) -> torch.Tensor:
    return torch.as_tensor(values, dtype=torch.float64)


def layer_model(layers, positions=None, labels=None, dtype="float64", tol=0.0):
    layers = layers if isinstance(layers, tuple) else (layers,)
    first = layers[0].labels()[0] if layers[0].labels() else "x"
    program = Program(
        vocab=("x",),
        embedding={},
        layers=layers,
        positions=positions or {},
        readout=Readout({"out": {first: 1.0}}),
        labels=labels,
        hard_tie_tolerance=tol,
    )
    return compile(program, dtype=dtype)


def test_identity_head_changes_nothing():
    model = single_layer_model(heads=[attention.identity(), attention.uniform_average({"m": "v"})])
    v = torch.randn(3, 6, dtype=torch.float64)
    _, cache = run_on_residual(model, {"v": v})
    assert torch.equal(read(cache, model, "blocks.0.hook_resid_mid", "v"), v)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("weighting", ["softmax", "average_hard"])
def test_uniform_average_unmasked_and_causal_with_padding(dtype, weighting):
    gen = torch.Generator().manual_seed(1)
    v = torch.randn(4, 9, generator=gen, dtype=torch.float64)
    n_positions = torch.tensor([9, 5, 1, 7])
    atol = 1e-6 if dtype == "float32" else 1e-13
    for mask in ("none", "causal"):
        model = single_layer_model(
            heads=[attention.uniform_average({"m": "v"})], dtype=dtype, mask=mask, weighting=weighting
        )
        _, cache = run_on_residual(model, {"v": v}, n_positions=n_positions)
        got = read(cache, model, "blocks.0.hook_resid_mid", "m").double()
        for b, n in enumerate(n_positions.tolist()):
            for i in range(n):
                keys = range(n) if mask == "none" else range(i + 1)
                want = sum(v[b, j].item() for j in keys) / len(keys)
                assert got[b, i].item() == pytest.approx(want, abs=atol)


@pytest.mark.parametrize("dtype", DTYPES)
def test_first_position_predicate_is_exact(dtype):
    program = Program(
        vocab=("[BOS]", "a", "b"),
        embedding={"[BOS]": {"bos": 1.0}, "a": {"sym": 1.0}, "b": {"sym": -1.0}},
        layers=(attention.first_position("bos", "first", "inv"),),
        readout=Readout({"first": {"first": 1.0}}),
    )
    model = compile(program, dtype=dtype)
    gen = torch.Generator().manual_seed(0)
    for length in (0, 1, 2, 5, 40, 300):
        tokens = torch.cat([torch.zeros(1, 1, dtype=torch.long), torch.randint(1, 3, (1, length), generator=gen)], 1)
        out, cache = model.run_with_cache(tokens)
        i = torch.arange(length + 1, dtype=torch.float64)
        assert torch.equal(out[0, :, 0].double(), (i == 0).double())
        inv = read(cache, model, "blocks.0.hook_resid_mid", "inv")[0].double()
        assert torch.allclose(inv, 1 / (i + 1), atol=1e-6 if dtype == "float32" else 1e-14)


def one_hot(index: torch.Tensor, size: int, prefix: str) -> dict[str, torch.Tensor]:
    return {f"{prefix}{k}": (index == k).double() for k in range(size)}


@pytest.mark.parametrize("dtype", DTYPES)
def test_one_hot_lookup_hard_exact_and_soft_scaled_then_rounded(dtype):
    N = 24
    gen = torch.Generator().manual_seed(3)
    q = torch.randint(0, N, (2, N), generator=gen)
    bits = torch.randint(0, 2, (2, N), generator=gen).double()
    values = {**one_hot(q, N, "q="), **one_hot(torch.arange(N).expand(2, N), N, "pos="), "v": bits}
    head = attention.lookup_one_hot([f"q={k}" for k in range(N)], [f"pos={k}" for k in range(N)], {"got": "v"})
    want = torch.gather(bits, 1, q)
    hard = single_layer_model(heads=[head], dtype=dtype, weighting="average_hard")
    _, cache = run_on_residual(hard, values)
    assert torch.equal(read(cache, hard, "blocks.0.hook_resid_mid", "got").double(), want)
    # softmax: unscaled the lookup is badly wrong; scaled by §5.7 and rounded it is exact
    soft = single_layer_model(heads=[head], dtype=dtype)
    _, cache = run_on_residual(soft, values)
    assert (read(cache, soft, "blocks.0.hook_resid_mid", "got").double() - want).abs().max() > 0.3
    tau = attention.softmax_scale_for_hard(gap=1.0, max_length=N)
    scaled = single_layer_model(heads=[head.scaled(tau)], ffns=[attention.round_to_bit("got", "bit")], dtype=dtype)
    _, cache = run_on_residual(scaled, values)
    raw = read(cache, scaled, "blocks.0.hook_resid_mid", "got").double()
    assert (raw - want).abs().max() <= 0.25
    assert torch.equal(read(cache, scaled, "blocks.0.hook_resid_post", "bit").double(), want)


def test_almost_orthogonal_sizing_and_lookup():
    N, eps, failure = 64, 0.3, 0.05
    d = attention.almost_orthogonal_dimension(N, eps, failure)
    assert d == math.ceil(2 / eps**2 * math.log(N * (N - 1) / failure))
    assert d < N * N  # the point: width O(log N / eps^2), here compared with a one-hot's N per vector
    failures = 0
    for seed in range(20):
        u = attention.almost_orthogonal_vectors(N, d, seed)
        gram = u @ u.T
        assert torch.allclose(gram.diagonal(), torch.ones(N, dtype=torch.float64))
        failures += int((gram - torch.eye(N, dtype=torch.float64)).abs().max() >= eps)
    assert failures <= 1  # the bound promises failure rate <= 5%
    u = attention.almost_orthogonal_vectors(N, d, seed=0)
    assert (u @ u.T - torch.eye(N, dtype=torch.float64)).abs().max() < eps
    gen = torch.Generator().manual_seed(5)
    q = torch.randint(0, N, (1, N), generator=gen)
    bits = torch.randint(0, 2, (1, N), generator=gen).double()
    values = {f"q{c}": u[q[0], c].unsqueeze(0) for c in range(d)}
    values.update({f"k{c}": u[:, c].unsqueeze(0) for c in range(d)})
    values["v"] = bits
    head = attention.match([f"q{c}" for c in range(d)], [f"k{c}" for c in range(d)], {"got": "v"})
    model = single_layer_model(heads=[head], weighting="average_hard")
    _, cache = run_on_residual(model, values)
    assert torch.equal(read(cache, model, "blocks.0.hook_resid_mid", "got"), torch.gather(bits, 1, q))
    with pytest.raises(ExactLensError):
        attention.almost_orthogonal_dimension(1, 0.1, 0.1)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("scaled_positions", [False, True])
def test_quadratic_maximization_lookup(dtype, scaled_positions):
    pos, sq = ("i/n", "(i/n)^2") if scaled_positions else ("i", "i^2")
    head = attention.lookup_quadratic("q", "p", "p2", {"got": "v"})
    model = layer_model(
        Layer(heads=(head,), weighting="average_hard"), positions={pos: {"p": 1.0}, sq: {"p2": 1.0}}, dtype=dtype
    )
    gen = torch.Generator().manual_seed(2)
    for n in (1, 7, 60):
        q = torch.randint(0, n, (3, n), generator=gen)
        v = torch.randn(3, n, generator=gen, dtype=torch.float64)
        q_val = q.double() / n if scaled_positions else q.double()
        _, cache = run_on_residual(model, {"q": q_val, "v": v})
        got = read(cache, model, "blocks.0.hook_resid_mid", "got").double()
        assert torch.allclose(got, torch.gather(v, 1, q), atol=1e-6)  # f32 scaled: fails from n ~ 4000 (gap 1/n^2)


@pytest.mark.parametrize("weighting", ["unique_hard_right", "average_hard", "softmax"])
def test_predecessor_and_successor(weighting):
    N = 40
    scale = 1.0 if weighting != "softmax" else attention.softmax_scale_for_hard(1.0, N, 0.25)
    pred = attention.predecessor("p", {"prev": "v"}, weighting=weighting, scale=scale)
    succ = attention.successor("p", {"next": "v"}, weighting=weighting.replace("right", "left"), scale=scale)
    rounding = Layer(ffns=(attention.round_to_bit("prev", "prev_bit"), attention.round_to_bit("next", "next_bit")))
    model = layer_model((pred, succ, rounding), positions={"i": {"p": 1.0}})
    gen = torch.Generator().manual_seed(4)
    bits = torch.randint(0, 2, (2, N), generator=gen).double()
    _, cache = run_on_residual(model, {"v": bits})
    prev = torch.cat([torch.zeros(2, 1, dtype=torch.float64), bits[:, :-1]], 1)
    nxt = torch.cat([bits[:, 1:], torch.zeros(2, 1, dtype=torch.float64)], 1)
    assert torch.equal(read(cache, model, "blocks.2.hook_resid_post", "prev_bit"), prev)
    assert torch.equal(read(cache, model, "blocks.2.hook_resid_post", "next_bit"), nxt)


@pytest.mark.parametrize("weighting", ["unique_hard_right", "softmax"])
def test_predecessor_alone(weighting):
    N = 30
    scale = 1.0 if weighting != "softmax" else attention.softmax_scale_for_hard(1.0, N, 0.25)
    layer = attention.predecessor("p", {"prev": "v"}, weighting=weighting, scale=scale)
    layer = Layer(
        heads=layer.heads, ffns=(attention.round_to_bit("prev", "bit"),), mask=layer.mask, weighting=layer.weighting
    )
    model = layer_model(layer, positions={"i": {"p": 1.0}})
    bits = torch.randint(0, 2, (3, N), generator=torch.Generator().manual_seed(6)).double()
    _, cache = run_on_residual(model, {"v": bits})
    prev = torch.cat([torch.zeros(3, 1, dtype=torch.float64), bits[:, :-1]], 1)
    assert torch.equal(read(cache, model, "blocks.0.hook_resid_post", "bit"), prev)
    pattern = cache["blocks.0.attn.hook_pattern"][0, 0]
    assert torch.all(pattern.argmax(-1)[1:] == torch.arange(N - 1))


def test_multi_head_as_single_heads():
    gen = torch.Generator().manual_seed(7)
    h1 = attention.match(["a"], ["b"], {"o1": "c"}, name="h1")
    h2 = attention.lookup_quadratic("a", "b", "c", {"o2": "d"}, name="h2").scaled(0.3)
    layer = Layer(heads=(h1, h2), mask="causal")
    values = {k: torch.randn(2, 11, generator=gen, dtype=torch.float64) for k in "abcd"}
    labels = ("a", "b", "c", "d", "o1", "o2")
    multi = layer_model(layer, labels=labels)
    single = layer_model(attention.split_heads(layer), labels=labels)
    assert multi.cfg.n_heads == 2 and single.cfg.n_heads == 1 and single.cfg.n_layers == 2
    out_m, cache_m = run_on_residual(multi, values)
    out_s, cache_s = run_on_residual(single, values)
    assert torch.allclose(cache_m["blocks.0.hook_resid_post"], cache_s["blocks.1.hook_resid_post"], atol=1e-13)
    clash = Layer(heads=(h1, attention.match(["o1"], ["b"], {"o3": "c"})))
    with pytest.raises(ExactLensError, match="reads"):
        attention.split_heads(clash)


@pytest.mark.parametrize("side", ["left", "right"])
def test_tie_breaking_emulates_unique_hard_with_average_hard(side):
    """Symbols with many repeats: match scores tie; with the tie-break term average-hard
    picks the leftmost/rightmost match, exactly as unique-hard attention does."""
    N, K = 30, 3
    gen = torch.Generator().manual_seed(8)
    sym = torch.randint(0, K, (4, N), generator=gen)
    values = {**one_hot(sym, K, "s="), "v": torch.randn(4, N, generator=gen, dtype=torch.float64)}
    head = attention.match([f"s={k}" for k in range(K)], [f"s={k}" for k in range(K)], {"got": "v"})
    broken = attention.break_ties(head, "p", gap=1.0, side=side)
    ours = layer_model(Layer(heads=(broken,), weighting="average_hard"), positions={"i/n": {"p": 1.0}})
    reference = layer_model(Layer(heads=(head,), weighting=f"unique_hard_{side}"))
    _, c1 = run_on_residual(ours, values)
    _, c2 = run_on_residual(reference, values)
    got = read(c1, ours, "blocks.0.hook_resid_mid", "got")
    want = read(c2, reference, "blocks.0.hook_resid_mid", "got")
    assert torch.equal(got, want)
    # and independently: the chosen key is the first/last position holding the query's symbol
    for b in range(4):
        for i in range(N):
            js = [j for j in range(N) if sym[b, j] == sym[b, i]]
            j = js[0] if side == "left" else js[-1]
            assert got[b, i] == values["v"][b, j]


def test_lemma_5_3_bound_against_measured_softmax():
    """Scores s_j = x_j (key label), maxima tied, the rest >= gap below: the L1 distance
    between softmax and average-hard patterns never exceeds 2(n-1)e^{-gap}."""
    head = attention.match(["one"], ["s"], {"got": "v"})
    soft = single_layer_model(heads=[head])
    hard = single_layer_model(heads=[head], weighting="average_hard")
    gen = torch.Generator().manual_seed(9)
    worst_ratio = 0.0
    for n in (2, 5, 20, 100):
        for gap in (0.5, 2.0, 5.0):
            scores = -gap - torch.rand(8, n, generator=gen, dtype=torch.float64) * 3
            scores[:, 0] = 0.0
            scores[:4, -1] = 0.0  # ties in half the rows
            scores[4:, 1 % n] = -gap  # the tightest case
            values = {
                "one": torch.ones(8, n, dtype=torch.float64),
                "s": scores,
                "v": torch.rand(8, n, generator=gen, dtype=torch.float64),
            }
            _, cs = run_on_residual(soft, values)
            _, ch = run_on_residual(hard, values)
            dist = (cs["blocks.0.attn.hook_pattern"] - ch["blocks.0.attn.hook_pattern"]).abs().sum(-1)
            bound = attention.lemma_5_3_bound(n, gap)
            assert dist.max() <= bound * (1 + 1e-12)
            worst_ratio = max(worst_ratio, float(dist.max()) / bound)
    assert worst_ratio > 0.05  # the bound is not vacuous on these cases


def test_bad_arguments():
    with pytest.raises(ExactLensError):
        attention.softmax_scale_for_hard(0.0, 10)
    with pytest.raises(ExactLensError):
        attention.round_to_bit("x", "y", tolerance=0.6)
    with pytest.raises(ExactLensError):
        attention.break_ties(attention.identity(), "p", 1.0, side="middle")
    with pytest.raises(ExactLensError):
        attention.match(["a"], [], {"o": "v"})

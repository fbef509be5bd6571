"""Cookbook §5.4 predecessor, both constructions, through the real ExactTransformer forward,
against plain Python indexing: position i gets the one-hot of w[i-1], position 0 gets zeros.

strict: strict future mask, score j. non_strict: causal mask, rightmost unique-hard attention,
scores +-(-1)^j in two heads (one layer or two layers) and the FFN select of §4.9."""

from __future__ import annotations

import pytest
import torch
from cookbook_helpers import single_layer_model

from exactlens.constructions.cookbook import (
    Layer,
    Program,
    Readout,
    attention,
    compile,
    predecessor,
    read,
    run_on_residual,
    serial,
)
from exactlens.errors import ExactLensError

DTYPES = ("float32", "float64")
VARIANTS = ("strict", "one_layer", "two_layers")
SYMBOLS = "abcdefg"


def layers_for(variant: str, values: dict[str, str], bound: float = 1.0):
    """(layers, positions) of one predecessor construction."""
    if variant == "strict":
        return (predecessor.strict("pos", values),), {"i": {"pos": 1.0}}
    return predecessor.non_strict(values, bound=bound, layout=variant), predecessor.parity_positions()


def symbol_model(variant: str, k: int, dtype: str):
    """Tokens = k symbols, one-hot values v_s; the per-position readout is the prev one-hot."""
    syms = tuple(SYMBOLS[:k])
    layers, positions = layers_for(variant, {f"prev_{s}": f"v_{s}" for s in syms})
    program = Program(
        vocab=syms,
        embedding={s: {f"v_{s}": 1.0} for s in syms},
        positions=positions,
        layers=layers,
        readout=Readout({s: {f"prev_{s}": 1.0} for s in syms}, kind="per_position"),
        name=f"predecessor-{variant}",
    )
    return compile(program, dtype)


def python_predecessor(words: list[list[int]], k: int) -> torch.Tensor:
    """Plain indexing: row i is the one-hot of w[i - 1]; row 0 is all zeros."""
    out = []
    for w in words:
        rows = [[0.0] * k]
        for i in range(1, len(w)):
            rows.append([1.0 if s == w[i - 1] else 0.0 for s in range(k)])
        out.append(rows)
    return torch.tensor(out, dtype=torch.float64)


def all_words(k: int, n: int) -> torch.Tensor:
    """Every word of length n over k symbols, [k^n, n] (base-k digits)."""
    index = torch.arange(k**n)
    return torch.stack([(index // k**p) % k for p in range(n - 1, -1, -1)], 1)


def check_words(model, words: torch.Tensor, k: int, chunk: int = 32768) -> None:
    for part in words.split(chunk):
        got = model(part).double()
        want = python_predecessor(part.tolist(), k)
        assert torch.equal(got, want), part[(got != want).any(-1).any(-1)][0].tolist()


# ----------------------------------------------------------------------------- exhaustive and random


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("variant", VARIANTS)
def test_every_short_word_matches_python_indexing(variant, dtype):
    """Exhaustive: all words over 2 symbols of length 1..12 and over 3 symbols of length 1..8
    (the slow test goes to length 12 over 3 symbols)."""
    for k, longest in ((2, 12), (3, 8)):
        model = symbol_model(variant, k, dtype)
        for n in range(1, longest + 1):
            check_words(model, all_words(k, n), k)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("variant", VARIANTS)
def test_every_word_over_three_symbols_up_to_length_12(variant, dtype):
    model = symbol_model(variant, 3, dtype)
    for n in range(9, 13):
        check_words(model, all_words(3, n), 3)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("variant", VARIANTS)
def test_random_words_up_to_length_1000(variant, dtype):
    k = 5
    model = symbol_model(variant, k, dtype)
    gen = torch.Generator().manual_seed(11)
    for n, batch in ((13, 64), (100, 16), (333, 4), (1000, 2)):
        check_words(model, torch.randint(0, k, (batch, n), generator=gen), k)


@pytest.mark.slow
@pytest.mark.parametrize("variant", VARIANTS)
def test_float32_still_exact_at_20000_positions(variant):
    """Scores are +-1 or integers j < 2^24, and (-1)^i is computed exactly: float32 cannot fail
    before i ~ 2^24 (positions themselves stop being exact integers there)."""
    model = symbol_model(variant, 3, "float32")
    check_words(model, torch.randint(0, 3, (1, 20000), generator=torch.Generator().manual_seed(3)), 3)


@pytest.mark.parametrize("variant", ("one_layer", "two_layers"))
def test_hard_patterns_pick_i_minus_1_in_the_head_the_ffn_selects(variant):
    model = symbol_model(variant, 2, "float64")
    n = 9
    _, cache = model.run_with_cache(torch.zeros(1, n, dtype=torch.long))
    if variant == "one_layer":
        even, odd = cache["blocks.0.attn.hook_pattern"][0, 0], cache["blocks.0.attn.hook_pattern"][0, 1]
    else:
        even, odd = cache["blocks.0.attn.hook_pattern"][0, 0], cache["blocks.1.attn.hook_pattern"][0, 0]
    picked_even, picked_odd = even.argmax(-1).tolist(), odd.argmax(-1).tolist()
    assert picked_even == [i - 1 if i % 2 else i for i in range(n)]  # rightmost even j <= i
    assert picked_odd == [0] + [i - 1 if i % 2 == 0 else i for i in range(1, n)]  # rightmost odd j <= i
    assert torch.equal(even.sum(-1), torch.ones(n, dtype=torch.float64))  # one key each (unique-hard)


# ----------------------------------------------------------------------------- real values and the bound


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("variant", ("one_layer", "two_layers"))
def test_bounded_real_values_are_copied_within_one_ulp_of_2B(variant, dtype):
    """Values in [-B, B] (both ends included). The select FFN computes (v + B) - B, so the
    float error is at most ulp(2B) (measured: ulp(2B)/2, i.e. 2.4e-7 in float32 and 4.4e-16 in
    float64 for B = 3.5); integers and values with few bits come through exactly."""
    B = 3.5
    layers, positions = layers_for(variant, {"y": "v"}, bound=B)
    model = compile(Program(("x",), {}, layers, Readout({"o": {"y": 1.0}}), positions=positions), dtype)
    gen = torch.Generator().manual_seed(5)
    v = (torch.rand(4, 1000, generator=gen, dtype=torch.float64) * 2 - 1) * B
    v[:, ::7], v[:, 3::7] = B, -B
    v[0, :50] = torch.arange(50) % 8 - 3.5  # few bits: exact
    _, cache = run_on_residual(model, {"v": v})
    y = read(cache, model, f"blocks.{model.cfg.n_layers - 1}.hook_resid_post", "y").double()
    v_in = v.to(model.cfg.torch_dtype).double()
    want = torch.cat([torch.zeros(4, 1, dtype=torch.float64), v_in[:, :-1]], 1)
    ulp_2b = 4 * torch.finfo(model.cfg.torch_dtype).eps  # 2B = 7 lies in [4, 8)
    assert (y - want).abs().max().item() <= ulp_2b
    assert torch.equal(y[0, :51], want[0, :51])


@pytest.mark.parametrize("variant", ("one_layer", "two_layers"))
def test_values_beyond_the_bound_leak(variant):
    """Negative control: |v| > B breaks the select (relu(v - B) no longer vanishes)."""
    layers, positions = layers_for(variant, {"y": "v"}, bound=1.0)
    model = compile(Program(("x",), {}, layers, Readout({"o": {"y": 1.0}}), positions=positions))
    v = torch.tensor([[3.0, 3.0, 3.0, 3.0]], dtype=torch.float64)
    _, cache = run_on_residual(model, {"v": v})
    y = read(cache, model, f"blocks.{model.cfg.n_layers - 1}.hook_resid_post", "y")
    assert not torch.equal(y, torch.tensor([[0.0, 3.0, 3.0, 3.0]], dtype=torch.float64))


def test_leftmost_tie_breaking_would_fail():
    """The non-strict construction needs rightmost ties: with leftmost unique-hard attention
    every even query copies position 0 (checked, so the exhaustive tests can fail)."""
    (layer,) = predecessor.non_strict({"y": "v"})
    left = Layer(heads=layer.heads, ffns=layer.ffns, mask="causal", weighting="unique_hard_left")
    model = compile(Program(("x",), {}, (left,), Readout({"o": {"y": 1.0}}), positions=predecessor.parity_positions()))
    v = torch.tensor([[1.0, 0.0, 0.0, 1.0, 0.0, 1.0]], dtype=torch.float64)
    _, cache = run_on_residual(model, {"v": v})
    assert not torch.equal(read(cache, model, "blocks.0.hook_resid_post", "y"), torch.cat([v[:, :1] * 0, v[:, :-1]], 1))


def test_first_position_from_section_5_2_instead_of_a_positional_feature():
    """F = I[i=0] computed by §5.2 (causal uniform attention over a bos marker) composes serially."""
    first = attention.first_position("bos", "F")
    pred = predecessor.non_strict({"y": "v"}, parity="P", first="F")
    program = Program(
        vocab=("x",),
        embedding={},
        layers=serial(first, pred),
        readout=Readout({"o": {"y": 1.0}}),
        positions={predecessor.PARITY_FEATURE: {"P": 1.0}},
    )
    model = compile(program)
    gen = torch.Generator().manual_seed(2)
    v = torch.randint(0, 2, (3, 40), generator=gen).double()
    bos = torch.zeros(3, 40, dtype=torch.float64)
    bos[:, 0] = 1.0
    _, cache = run_on_residual(model, {"v": v, "bos": bos})
    assert torch.equal(read(cache, model, "blocks.0.hook_resid_post", "F"), bos)
    want = torch.cat([torch.zeros(3, 1, dtype=torch.float64), v[:, :-1]], 1)
    assert torch.equal(read(cache, model, "blocks.1.hook_resid_post", "y"), want)


def test_strict_is_attention_predecessor_and_successor_mirrors_it():
    assert attention.predecessor is predecessor.strict and attention.successor is predecessor.strict_successor
    model = single_layer_model(heads=predecessor.strict_successor("p", {"next": "v"}).heads, mask="strict_past",
                               weighting="unique_hard_left")
    v = torch.randn(2, 17, generator=torch.Generator().manual_seed(9), dtype=torch.float64)
    i = torch.arange(17, dtype=torch.float64).expand(2, 17)
    _, cache = run_on_residual(model, {"v": v, "p": i})
    want = torch.cat([v[:, 1:], torch.zeros(2, 1, dtype=torch.float64)], 1)
    assert torch.equal(read(cache, model, "blocks.0.hook_resid_post", "next"), want)


def test_bad_arguments_name_the_problem():
    with pytest.raises(ExactLensError, match="bound"):
        predecessor.non_strict({"y": "v"}, bound=0.0)
    with pytest.raises(ExactLensError, match="bound"):
        predecessor.non_strict({"y": "v"}, bound=float("inf"))
    with pytest.raises(ExactLensError, match="layout"):
        predecessor.non_strict({"y": "v"}, layout="three_layers")
    with pytest.raises(ExactLensError, match="at least one value"):
        predecessor.non_strict({})

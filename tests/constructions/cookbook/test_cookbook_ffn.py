"""Cookbook §4 FFN recipes, run through the real ExactTransformer (hook_embed injection,
readings from blocks.0.hook_resid_post / hook_mlp_out), against references written here."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from cookbook_helpers import grid, run_ffn, single_layer_model

from exactlens.constructions.cookbook import ffn, read, run_on_residual
from exactlens.errors import ExactLensError

DTYPES = ("float32", "float64")
TOL = {"float32": 2e-5, "float64": 1e-12}


def t64(values) -> torch.Tensor:
    return torch.as_tensor(values, dtype=torch.float64)


def cpwl_reference(x: torch.Tensor, knots, values, left, right) -> torch.Tensor:
    out = torch.empty_like(x)
    for idx, v in enumerate(x.flatten().tolist()):
        if v <= knots[0]:
            y = values[0] + left * (v - knots[0])
        elif v >= knots[-1]:
            y = values[-1] + right * (v - knots[-1])
        else:
            k = max(i for i in range(len(knots)) if knots[i] <= v)
            k = min(k, len(knots) - 2)
            y = values[k] + (values[k + 1] - values[k]) * (v - knots[k]) / (knots[k + 1] - knots[k])
        out.view(-1)[idx] = y
    return out


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("seed", range(4))
def test_cpwl_matches_piecewise_reference(dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    n_knots = 1 + seed * 2
    knots = sorted(torch.randn(n_knots, generator=gen, dtype=torch.float64).mul(3).tolist())
    values = torch.randn(n_knots, generator=gen, dtype=torch.float64).tolist()
    left, right = torch.randn(2, generator=gen, dtype=torch.float64).tolist()
    piece = ffn.cpwl("x", "y", knots, values, left, right)
    assert piece.d_hidden == n_knots + 1
    mids = [(a + b) / 2 for a, b in zip(knots, knots[1:], strict=False)]
    xs = t64(knots + mids + [-1e3, -10.0, 10.0, 1e3] + torch.linspace(-8, 8, 101).tolist()).reshape(1, -1)
    got = run_ffn(piece, {"x": xs}, dtype)["y"]
    want = cpwl_reference(xs, knots, values, left, right)
    scale = want.abs().clamp(min=1)
    assert torch.allclose(got.double() / scale, want / scale, atol=TOL[dtype] * 10, rtol=0)


def test_cpwl_rejects_unsorted_knots():
    with pytest.raises(ExactLensError, match="increase"):
        ffn.cpwl("x", "y", [1.0, 0.0], [0.0, 0.0], 0.0, 0.0)


@pytest.mark.parametrize("dtype", DTYPES)
def test_cancel_residual_and_identity(dtype):
    xs = torch.linspace(-5, 5, 41, dtype=torch.float64).reshape(1, -1)
    garbage = torch.linspace(7, -3, 41, dtype=torch.float64).reshape(1, -1)
    # x + FFN(x) = 0 for the cancelling FFN
    out = run_ffn(ffn.cancel_residual(["x"]), {"x": xs}, dtype)
    assert torch.all(out["x"] == 0)
    # identity without residual: FFN(x) = x (read from hook_mlp_out), copies into y over garbage
    model = single_layer_model(ffns=[ffn.without_residual(ffn.identity(["x"], ["y"]))], dtype=dtype)
    _, cache = run_on_residual(model, {"x": xs, "y": garbage})
    assert torch.allclose(read(cache, model, "blocks.0.hook_resid_post", "y").double(), xs, atol=TOL[dtype] * 10)
    ident = single_layer_model(ffns=[ffn.identity(["x"])], dtype=dtype)
    _, cache = run_on_residual(ident, {"x": xs})
    assert torch.equal(read(cache, ident, "blocks.0.hook_mlp_out", "x").double(), xs)
    # identity with a residual: the zero FFN leaves the stream as it is
    zero = single_layer_model(ffns=[ffn.zero(), ffn.identity(["x"], ["y"])], dtype=dtype)
    assert zero.cfg.d_mlp == 2


@pytest.mark.parametrize("dtype", DTYPES)
def test_min_max_add_sub_on_random_inputs(dtype):
    gen = torch.Generator().manual_seed(0)
    x, y = (torch.randn(1, 500, generator=gen, dtype=torch.float64) * 10 for _ in range(2))
    x[0, :50] = y[0, :50]  # ties
    piece = ffn.join(
        ffn.minimum("x", "y", "min"),
        ffn.maximum("x", "y", "max"),
        ffn.linear({"x": 1.0, "y": 1.0}, "sum"),
        ffn.linear({"x": 1.0, "y": -1.0}, "diff"),
        ffn.linear({"x": 2.5}, "scaled", bias=-1.0),
    )
    out = run_ffn(piece, {"x": x, "y": y}, dtype)
    atol = TOL[dtype] * 100
    assert torch.allclose(out["min"].double(), torch.minimum(x, y), atol=atol)
    assert torch.allclose(out["max"].double(), torch.maximum(x, y), atol=atol)
    assert torch.allclose(out["sum"].double(), x + y, atol=atol)
    assert torch.allclose(out["diff"].double(), x - y, atol=atol)
    assert torch.allclose(out["scaled"].double(), 2.5 * x - 1.0, atol=atol)
    assert torch.allclose(out["x"].double(), x, atol=0)  # inputs untouched


def test_gelu_multiplication_error_against_bounds():
    """Measured |FFN(x, y) - xy| vs the Lagrange bounds (float64), and the leading error
    term eps^2 xy (x^2 + y^2)/3 predicts the measurement (a wrong constant would not)."""
    vals = torch.linspace(-2, 2, 17, dtype=torch.float64)
    x, y = grid(vals, vals)
    for eps in (0.3, 0.1, 0.03):
        out = run_ffn(ffn.multiply("x", "y", "xy", scale=eps), {"x": x, "y": y})["xy"]
        err = (out - x * y).abs().flatten()
        for k, (a, b) in enumerate(zip(x.flatten().tolist(), y.flatten().tolist(), strict=False)):
            bounds = ffn.multiply_error_bounds(a, b, eps)
            assert err[k] <= bounds["lagrange4"] * (1 + 1e-9) + 1e-12
            assert bounds["lagrange4"] <= bounds["lagrange3"] or abs(a) + abs(b) > 1 / eps
            if bounds["leading"] > 1e-6:
                assert 0.8 < err[k] / bounds["leading"] < 1.2, (a, b, eps)


def test_gelu_multiplication_float32_has_an_optimal_scale():
    """In float32, cancellation makes small eps worse: error ~ eps^2 + u/eps (measured)."""
    vals = torch.linspace(-1, 1, 9, dtype=torch.float64)
    x, y = grid(vals, vals)
    errs = {}
    for eps in (1e-1, 1e-2, 1e-4):
        out = run_ffn(ffn.multiply("x", "y", "xy", scale=eps), {"x": x, "y": y}, "float32")["xy"]
        errs[eps] = float((out.double() - x * y).abs().max())
    assert errs[1e-2] < errs[1e-1] and errs[1e-2] < errs[1e-4]


@pytest.mark.parametrize("dtype", DTYPES)
def test_fixed_tolerance_comparators_exact_outside_gray_and_monotone_inside(dtype):
    tol = 0.25
    outside = t64([-10, -1, -0.25, -1e-9, 0.0, 0.25, 0.25 + 1e-9, 1, 10])
    gray = torch.linspace(-0.24, 0.24, 49, dtype=torch.float64)
    xs = torch.cat([outside, gray]).reshape(1, -1)
    piece = ffn.join(
        ffn.greater_than("x", "gt", tol), ffn.greater_equal("x", "ge", tol), ffn.equal_zero("x", "eq", tol)
    )
    out = {k: v.double() for k, v in run_ffn(piece, {"x": xs}, dtype).items()}
    x = xs[0]
    atol = TOL[dtype] * 10
    checks = {
        "gt": ((x <= 0) | (x >= tol), (x > 0).double()),
        "ge": ((x >= 0) | (x <= -tol), (x >= 0).double()),
        "eq": ((x == 0) | (x.abs() >= tol), (x == 0).double()),
    }
    for name, (exact_where, want) in checks.items():
        got = out[name][0]
        assert torch.allclose(got[exact_where], want[exact_where], atol=atol), name
        assert torch.all((got >= -atol) & (got <= 1 + atol)), name
    # gray region: strictly between (this is where the paper warns the recipe is inexact)
    inner = (x > 0) & (x < tol)
    assert torch.all((out["gt"][0][inner] > 0) & (out["gt"][0][inner] < 1))


@pytest.mark.parametrize("dtype", DTYPES)
def test_input_dependent_comparators_on_multiples_of_one_over_n(dtype):
    for n in (1, 2, 7, 50, 333):
        k = torch.arange(-n, n + 1, dtype=torch.float64)
        xs = (k / n).reshape(1, -1)
        tol = torch.full_like(xs, 1.0 / n)
        piece = ffn.join(
            ffn.greater_than_by("x", "tol", "gt"),
            ffn.greater_equal_by("x", "tol", "ge"),
            ffn.equal_zero_by("x", "tol", "eq"),
        )
        out = run_ffn(piece, {"x": xs, "tol": tol}, dtype)
        atol = TOL[dtype] * 10
        assert torch.allclose(out["gt"].double(), (k > 0).double() / n, atol=atol)
        assert torch.allclose(out["ge"].double(), (k >= 0).double() / n, atol=atol)
        assert torch.allclose(out["eq"].double(), (k == 0).double() / n, atol=atol)


@pytest.mark.parametrize("encodings", [("pm1", "01"), ("01", "pm1")])
def test_every_boolean_function_of_three_bits(encodings):
    inp, outp = encodings
    bits = list(itertools.product((False, True), repeat=3))
    enc = {"pm1": (-1.0, 1.0), "01": (0.0, 1.0)}
    values = {f"b{j}": t64([[enc[inp][b[j]] for b in bits]]) for j in range(3)}
    tables = range(256) if inp == "pm1" else range(0, 256, 5)  # every function once, a sample again
    for table in tables:

        def fn(*args, table=table):
            return bool(table >> bits.index(tuple(args)) & 1)

        piece = ffn.boolean(fn, ["b0", "b1", "b2"], "f", inputs_encoding=inp, output_encoding=outp)
        got = run_ffn(piece, values)["f"][0]
        want = t64([enc[outp][fn(*b)] for b in bits])
        assert torch.equal(got, want), table


@pytest.mark.parametrize("dtype", DTYPES)
def test_conditional_selects_on_bounded_values(dtype):
    B = 3.0
    vals = torch.cat([t64([-B, B, 0.0]), torch.linspace(-B, B, 13, dtype=torch.float64)])
    c, a, b = grid(t64([0.0, 1.0]), vals, vals)
    out = run_ffn(ffn.conditional("c", "a", "b", "o", bound=B), {"c": c, "a": a, "b": b}, dtype)["o"].double()
    want = torch.where(c == 1, a, b)
    assert torch.allclose(out, want, atol=TOL[dtype] * 10)
    # out of bounds the recipe is wrong, as expected: |a| > B with c = 0 leaks a
    leak = run_ffn(
        ffn.conditional("c", "a", "b", "o", bound=B), {"c": t64([[0.0]]), "a": t64([[B + 1]]), "b": t64([[0.0]])}
    )
    assert float(leak["o"]) == pytest.approx(1.0)


def test_clip_and_bad_arguments():
    xs = t64([[-5.0, -0.5, 0.0, 0.3, 7.0]])
    out = run_ffn(ffn.clip(["x"], 0.4), {"x": xs})["x"]
    assert torch.allclose(out, xs.clamp(-0.4, 0.4), atol=1e-15, rtol=0)
    with pytest.raises(ExactLensError, match="tolerance"):
        ffn.greater_than("x", "y", 0.0)
    with pytest.raises(ExactLensError, match="scale"):
        ffn.multiply("x", "y", "z", scale=-1)
    with pytest.raises(ExactLensError, match="activation"):
        ffn.join(ffn.multiply("x", "y", "z"), ffn.minimum("x", "y", "m"))
    assert math.isfinite(ffn.multiply_error_bounds(1.0, 1.0, 0.1)["lagrange3"])

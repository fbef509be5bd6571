"""Cookbook §6: circumventing layer norm with [x, -x], and amplification with eps = 0."""

from __future__ import annotations

import pytest
import torch

from exactlens.constructions.cookbook import Layer, Program, Readout, attention, compile, read, run_on_residual
from exactlens.constructions.cookbook import layer_norm as cln
from exactlens.errors import ExactLensError


def sign_average_program() -> Program:
    """Positive-homogeneous: the prefix mean of +-1 symbols, read at every position."""
    return Program(
        vocab=("a", "b"),
        embedding={"a": {"sym": 1.0}, "b": {"sym": -1.0}},
        layers=(Layer(heads=(attention.uniform_average({"mean": "sym"}),), mask="causal"),),
        readout=Readout({"mean": {"mean": 1.0}}),
    )


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_paired_residual_makes_post_ln_a_pure_rescaling(dtype):
    plain = compile(sign_average_program(), dtype=dtype)
    paired = cln.pair_for_layer_norm(plain, eps=0.0)
    assert paired.cfg.residual_labels == ("sym", "mean", "-(sym)", "-(mean)")
    tokens = torch.randint(0, 2, (5, 17), generator=torch.Generator().manual_seed(0))
    out_plain, cache_plain = plain.run_with_cache(tokens)
    out_paired, cache_paired = paired.run_with_cache(tokens)
    x = cache_plain["blocks.0.hook_resid_mid"].double()  # [sym, mean]
    both = torch.cat([x, -x], -1)
    rms = both.pow(2).mean(-1, keepdim=True).sqrt()  # mean is 0, so LN only divides by this
    atol = 1e-6 if dtype == "float32" else 1e-14
    assert torch.allclose(cache_paired["blocks.0.ln1.hook_normalized"].double(), both / rms, atol=atol)
    assert torch.allclose(cache_paired["blocks.0.hook_resid_mid"].double(), both / rms, atol=atol)
    # the decision (sign of the prefix mean) survives, the magnitude does not
    assert torch.equal(torch.sign(out_paired[..., 0]), torch.sign(out_plain[..., 0]))
    with pytest.raises(ExactLensError):
        cln.pair_for_layer_norm(paired)


def amplify_model(eps: float, delta: float, dtype: str = "float64"):
    labels = ("a", "-(a)", "b", "-(b)")
    program = Program(
        vocab=("x",),
        embedding={},
        layers=(cln.amplify(labels, delta),),
        readout=Readout({"a": {"a": 1.0}}),
        labels=labels,
        normalization="post",
        ln_eps=eps,
    )
    return compile(program, dtype=dtype)


@pytest.mark.parametrize("tiny", [1e-3, 1e-6, 1e-9])
def test_amplification_with_eps_zero(tiny):
    """[a, -a, b, -b] with |a| tiny next to |b| = 5: LN alone keeps the ratio; clip + LN
    (eps = 0) maps a to +-1 whatever its size (float64). delta must not exceed the smallest
    nonzero |component| after the attention sublayer's LN (here a / rms >= 0.2 a); the
    clipped value is written by cancellation, so the error is about ulp(max |c|) / delta."""
    delta = 0.2 * tiny
    model = amplify_model(eps=0.0, delta=delta)
    a = torch.tensor([[tiny, -tiny, 0.0, tiny]], dtype=torch.float64)
    b = torch.tensor([[5.0, 5.0, 5.0, -5.0]], dtype=torch.float64)
    _, cache = run_on_residual(model, {"a": a, "-(a)": -a, "b": b, "-(b)": -b})
    mid = read(cache, model, "blocks.0.hook_resid_mid", "a")
    assert mid.abs().max() < 2 * tiny  # attention's LN did not amplify
    out = read(cache, model, "blocks.0.hook_resid_post", "a")
    nonzero = (a != 0).double()
    m = 2 * (nonzero + 1)  # nonzero components among the 4
    assert torch.allclose(out, torch.sign(a) * torch.sqrt(4 / m), atol=1e-15 / delta)


def test_amplification_fails_with_positive_eps():
    model = amplify_model(eps=1e-5, delta=1e-9)
    a = torch.full((1, 1), 1e-6, dtype=torch.float64)
    b = torch.full((1, 1), 5.0, dtype=torch.float64)
    _, cache = run_on_residual(model, {"a": a, "-(a)": -a, "b": b, "-(b)": -b})
    assert read(cache, model, "blocks.0.hook_resid_post", "a").abs().max() < 1e-3

"""The cookbook's program representation: pieces over labels, compile, routing (§8.2),
serial and parallel composition (§8.3), and the errors for what cannot be assembled."""

from __future__ import annotations

import pytest
import torch
from cookbook_helpers import run_ffn

from exactlens.constructions.cookbook import (
    FFN,
    Head,
    Layer,
    Program,
    Readout,
    attention,
    compile,
    ffn,
    parallel,
    read,
    rename,
    run_on_residual,
    serial,
)
from exactlens.errors import ExactLensError


def t64(values) -> torch.Tensor:
    return torch.as_tensor(values, dtype=torch.float64)


def test_compiled_weights_sit_at_the_named_dimensions():
    f = FFN.build([{"x": 2.0, "y": -1.0}], {"z": [3.0]}, b_in=[0.5], b_out={"z": -1.0}, name="f")
    h = Head.build(query={"x": [1.0, 2.0]}, key={"y": [0.0, 1.0]}, value={("z", "x"): 4.0}, name="h")
    program = Program(
        vocab=("t",),
        embedding={"t": {"y": 1.0}},
        layers=(Layer(heads=(h,), ffns=(f,)),),
        readout=Readout({"o": {"z": 1.0}}),
        labels=("z", "y", "x"),
    )
    model = compile(program)
    assert model.cfg.residual_labels == ("z", "y", "x")
    assert model.cfg.attn_scale == 1.0
    mlp, att = model.blocks[0].mlp, model.blocks[0].attn
    assert mlp.W_in[2, 0] == 2.0 and mlp.W_in[1, 0] == -1.0 and mlp.b_in[0] == 0.5
    assert mlp.W_out[0, 0] == 3.0 and mlp.b_out[0] == -1.0 and mlp.W_out[0, 1:].abs().sum() == 0
    assert att.W_Q[0, 2].tolist() == [1.0, 2.0] and att.W_K[0, 1].tolist() == [0.0, 1.0]
    ov = att.W_V[0] @ att.W_O[0]
    assert ov[2, 0] == 4.0 and ov.abs().sum() == 4.0
    assert model.cfg.metadata["cookbook"]["layers"][0] == {"heads": {"h": 0}, "ffns": {"f": [0, 1]}}
    # scores are exactly q . k: query x=1 -> q=[1,2]; key y=1 -> k=[0,1]; score 2
    _, cache = run_on_residual(model, {"x": t64([[1.0, 0.0]]), "y": t64([[1.0, 1.0]])})
    assert torch.equal(cache["blocks.0.attn.hook_attn_scores"][0, 0, 0], t64([2.0, 2.0]))


def test_routing_lemma_matches_composed_linear_maps():
    """route(B, C) computes C f(B x): checked against the unrouted piece on B x."""
    base = ffn.join(ffn.minimum("x", "y", "m"), ffn.maximum("x", "y", "M"))
    routed = base.route(inputs={"x": {"a": 2.0, "b": -1.0}, "y": {"b": 3.0}}, outputs={"m": {"u": 1.0, "w": -2.0}})
    gen = torch.Generator().manual_seed(0)
    a, b = (torch.randn(1, 50, generator=gen, dtype=torch.float64) for _ in range(2))
    out = run_ffn(routed, {"a": a, "b": b})
    x, y = 2 * a - b, 3 * b
    assert torch.allclose(out["u"], torch.minimum(x, y), atol=1e-12)
    assert torch.allclose(out["w"], -2 * torch.minimum(x, y), atol=1e-12)
    assert torch.allclose(out["M"], torch.maximum(x, y), atol=1e-12)
    renamed = base.relabel({"x": "p", "M": "q"})
    assert renamed.inputs == ("p", "y") and "q" in renamed.outputs
    with pytest.raises(ExactLensError, match="does not use"):
        base.route(inputs={"nope": {"a": 1.0}})


def test_serial_composition_is_a_straight_line_program():
    """Layer 1: mean of sym into m (uniform attention); layer 2: |m| via max(m, -m)."""
    l1 = Layer(heads=(attention.uniform_average({"m": "sym"}),), mask="causal")
    l2 = Layer(ffns=(ffn.maximum("m", "neg", "abs"), ffn.linear({"m": -1.0}, "neg")))
    # neg is written in the same layer as it is read: it is 0 there, so abs = max(m, 0)
    l3 = Layer(ffns=(ffn.maximum("m", "neg", "abs2"),))
    program = Program(
        vocab=("a", "b"),
        embedding={"a": {"sym": 1.0}, "b": {"sym": -1.0}},
        layers=serial(l1, l2, l3),
        readout=Readout({"abs2": {"abs2": 1.0}}),
    )
    model = compile(program)
    assert model.cfg.n_layers == 3 and model.cfg.n_heads == 1 and model.cfg.d_mlp == 5
    tokens = torch.randint(0, 2, (3, 12), generator=torch.Generator().manual_seed(1))
    out, cache = model.run_with_cache(tokens)
    sym = 1 - 2 * tokens.double()
    mean = sym.cumsum(1) / torch.arange(1, 13)
    assert torch.allclose(read(cache, model, "blocks.0.hook_resid_post", "m"), mean, atol=1e-14)
    assert torch.allclose(read(cache, model, "blocks.1.hook_resid_post", "abs"), mean.clamp(min=0), atol=1e-14)
    assert torch.allclose(out[..., 0], mean.abs(), atol=1e-14)


def test_parallel_composition_runs_two_programs_side_by_side():
    prog_a = (
        Layer(heads=(attention.uniform_average({"m": "v"}),), mask="causal"),
        Layer(ffns=(ffn.linear({"m": 2.0}, "r"),)),
    )
    prog_b = (Layer(ffns=(ffn.minimum("v", "w", "r"),)),)
    left, right = rename(prog_a, "A."), rename(prog_b, {"r": "B.r"})
    merged = parallel(left, right)
    assert len(merged) == 2 and len(merged[0].heads) == 1 and len(merged[0].ffns) == 1
    program = Program(
        vocab=("t",),
        embedding={},
        layers=merged,
        readout=Readout({"A": {"A.r": 1.0}, "B": {"B.r": 1.0}}, kind="per_position"),
    )
    model = compile(program)
    gen = torch.Generator().manual_seed(2)
    v, w = (torch.randn(2, 9, generator=gen, dtype=torch.float64) for _ in range(2))
    out, _ = run_on_residual(model, {"A.v": v, "v": v, "w": w})
    assert torch.allclose(out[..., 0], 2 * v.cumsum(1) / torch.arange(1, 10), atol=1e-13)
    assert torch.allclose(out[..., 1], torch.minimum(v, w), atol=1e-13)
    # different masks cannot share a layer
    other = (Layer(heads=(attention.uniform_average({"n": "v"}),), mask="none"),)
    with pytest.raises(ExactLensError, match="attention settings"):
        parallel(left, other)
    with pytest.raises(ExactLensError, match="activation"):
        parallel((Layer(ffns=(ffn.multiply("x", "y", "p"),)),), (Layer(ffns=(ffn.minimum("x", "y", "q"),)),))


def test_per_layer_switches_and_padding():
    layers = (
        Layer(heads=(attention.uniform_average({"m": "v"}), attention.identity()), mask="causal"),
        Layer(ffns=(ffn.multiply("m", "m", "sq", 0.01),)),
        Layer(heads=(attention.uniform_average({"g": "v"}),), mask="none", weighting="average_hard"),
    )
    program = Program(vocab=("t",), embedding={}, layers=layers, readout=Readout({"o": {"sq": 1.0}}))
    model = compile(program)
    cfg = model.cfg
    assert cfg.per_layer("attention_mask")[0] == "causal" and cfg.per_layer("attention_mask")[2] == "none"
    assert cfg.per_layer("act_fn")[1] == "gelu"
    assert cfg.n_heads == 2 and cfg.d_mlp == 4
    assert model.blocks[2].attn.W_V[1].abs().sum() == 0  # padding head adds nothing
    v = torch.randn(1, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    _, cache = run_on_residual(model, {"v": v})
    assert torch.allclose(read(cache, model, "blocks.2.hook_resid_post", "g"), v.mean().expand(1, 6), atol=1e-14)


def test_bad_programs_and_pieces_are_refused():
    with pytest.raises(ExactLensError, match="repeat"):
        FFN(("x", "x"), torch.zeros(2, 1), torch.zeros(1), ("y",), torch.zeros(1, 1), torch.zeros(1))
    with pytest.raises(ExactLensError, match="shape"):
        FFN(("x",), torch.zeros(2, 1), torch.zeros(1), ("y",), torch.zeros(1, 1), torch.zeros(1))
    with pytest.raises(ExactLensError, match="NaN"):
        FFN.build([{"x": float("nan")}], {"y": [1.0]})
    with pytest.raises(ExactLensError, match="one length"):
        Head.build(query={"x": [1.0]}, key={"y": [1.0, 2.0]}, value={})
    with pytest.raises(ExactLensError, match="misses"):
        Program(
            vocab=("t",),
            embedding={"t": {"x": 1.0}},
            layers=(Layer(),),
            readout=Readout({"o": {"x": 1.0}}),
            labels=("y",),
        ).residual_labels()
    with pytest.raises(ExactLensError, match="outside the vocab"):
        Program(vocab=("t",), embedding={"u": {"x": 1.0}}, layers=(Layer(),), readout=Readout({"o": {"x": 1.0}}))
    with pytest.raises(ExactLensError, match="mask"):
        Layer(mask="sideways")
    with pytest.raises(ExactLensError, match="one output"):
        Readout({"a": {"x": 1.0}, "b": {"x": 1.0}}, kind="sigmoid")

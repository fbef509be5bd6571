"""Cookbook §7: rounding as a mechanism (§7.1, ``rounding``) and the error bounds of §7.2
(Props 7.1-7.5, ``error_bounds``), through the real ExactTransformer modules.

§7.1: exact on the fixed-point grid (exhaustively), exact for any real input once the model
rounds its activations (fixed_point_hooks), wrong off the grid without rounding (negative
control), and the float range where the grid stops being exact (measured).
§7.2: every bound holds on random and gradient-sign adversarial inputs, and designed worst
cases reach it (so a smaller constant would fail)."""

from __future__ import annotations

import math
import operator

import pytest
import torch
from cookbook_helpers import single_layer_model

from exactlens.constructions.cookbook import (
    Head,
    Layer,
    Program,
    Readout,
    compile,
    error_bounds,
    read,
    residual_tensor,
    rounding,
    run_on_residual,
)
from exactlens.errors import ExactLensError
from exactlens.model import ExactConfig, ExactTransformer
from exactlens.model.components import visible_keys

DTYPES = ("float32", "float64")
F64 = torch.float64
PYTHON = {">": operator.gt, ">=": operator.ge, "<": operator.lt, "<=": operator.le, "=": operator.eq}


def run_with_fixed_point(model, values: dict[str, torch.Tensor], bits: int | None, mode: str = "nearest"):
    """Forward on raw values injected at hook_embed, then (bits given) every activation rounded."""
    x = residual_tensor(model, values)
    hooks = [("hook_embed", lambda act, hook: x)]
    if bits is not None:
        hooks += rounding.fixed_point_hooks(model, bits, mode)  # after the injection: it rounds x too
    with model.hooks(fwd_hooks=hooks):
        _, cache = model.run_with_cache(torch.zeros(x.shape[:2], dtype=torch.long))
    return cache


# ----------------------------------------------------------------------------- §7.1 on the grid


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("bits", [0, 3, 10, 23])
def test_step_is_exact_on_every_grid_point(bits, dtype):
    """x = k delta for every k in [-4096, 4096]: out = [k > 0] exactly, incl. the worst
    cases x = 0 and x = delta at the edges of the §4.7 gray region."""
    delta = rounding.resolution(bits)
    model = single_layer_model(ffns=[rounding.step("x", "y", bits)], dtype=dtype)
    k = torch.arange(-4096, 4097, dtype=F64)
    _, cache = run_on_residual(model, {"x": (k * delta).unsqueeze(1)})  # one position per row: cheap attention
    got = read(cache, model, "blocks.0.hook_resid_post", "y")[:, 0].double()
    assert torch.equal(got, (k > 0).double())


def test_off_the_grid_the_step_is_not_exact():
    """Negative control: inside the gray region 0 < x < delta the §4.7 FFN interpolates."""
    model = single_layer_model(ffns=[rounding.step("x", "y", 4)])
    x = torch.tensor([[1 / 64, 1 / 32, 3 / 64]], dtype=F64)  # delta = 1/16
    _, cache = run_on_residual(model, {"x": x})
    assert torch.equal(read(cache, model, "blocks.0.hook_resid_post", "y"), x * 16)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("relation", rounding.RELATIONS)
def test_compare_is_exact_for_every_pair_of_grid_values(relation, dtype):
    bits, K = 2, 40
    delta = rounding.resolution(bits)
    model = single_layer_model(ffns=[rounding.compare("x", "y", "out", relation, bits)], dtype=dtype)
    grid = torch.arange(-K, K + 1, dtype=F64) * delta
    x, y = (m.reshape(-1, 1) for m in torch.meshgrid(grid, grid, indexing="ij"))
    _, cache = run_on_residual(model, {"x": x, "y": y})
    got = read(cache, model, "blocks.0.hook_resid_post", "out").double()
    pairs = zip(x[:, 0].tolist(), y[:, 0].tolist(), strict=True)
    want = torch.tensor([[float(PYTHON[relation](a, b))] for a, b in pairs])
    assert torch.equal(got, want.double())


def test_the_grid_is_exact_in_float32_up_to_2_pow_24_steps_and_float64_beyond():
    """Measured limit: step(k delta) is exact for every k <= 2^24 in float32; the first wrong
    representable input is x = (2^24 + 2) delta (x - delta rounds to 2^24 delta: output 2).
    float64 is exact there; its first failure is at 2^53 + 2."""
    results = {}
    for dtype in DTYPES:
        model = single_layer_model(ffns=[rounding.step("x", "y", 0)], dtype=dtype)
        beyond = torch.tensor([2.0**24 + 2, 2.0**53 + 2], dtype=F64)
        k = torch.cat([torch.arange(2**24 - 1000, 2**24 + 1, dtype=F64), beyond])
        _, cache = run_on_residual(model, {"x": k.unsqueeze(1)})
        results[dtype] = read(cache, model, "blocks.0.hook_resid_post", "y")[:, 0].double()
    assert torch.equal(results["float32"][:1001], torch.ones(1001, dtype=F64))
    assert results["float32"][1001].item() == 2.0
    assert torch.equal(results["float64"][:1002], torch.ones(1002, dtype=F64))
    assert results["float64"][1002].item() == 2.0


# ----------------------------------------------------------------------------- §7.1 with rounding inside the model


def special_reals(delta: float, gen: torch.Generator) -> torch.Tensor:
    edges = [0.0, 1e-30, delta / 2, delta * (1 - 1e-9), delta, delta * (1 + 1e-9), 1.5 * delta, 2.5 * delta]
    x = torch.tensor(edges + [-e for e in edges], dtype=F64)
    return torch.cat([x, torch.randn(2000, generator=gen, dtype=F64) * 4 * delta])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mode", rounding.MODES)
def test_fixed_point_hooks_make_the_step_exact_for_every_real_input(mode, dtype):
    """§7.1.1: with activations rounded to the grid (toward zero: "values smaller than delta
    rounded down to 0"), the step FFN computes [q(x) > 0] exactly for arbitrary reals x, q =
    the rounding; without the rounding it is not even 0/1 (negative control)."""
    bits = 6
    x = special_reals(rounding.resolution(bits), torch.Generator().manual_seed(1)).unsqueeze(1)
    model = single_layer_model(ffns=[rounding.step("x", "y", bits)], dtype=dtype)
    cache = run_with_fixed_point(model, {"x": x}, bits, mode)
    got = read(cache, model, "blocks.0.hook_resid_post", "y").double()
    x_model = x.to(model.cfg.torch_dtype).double()
    assert torch.equal(got, (rounding.quantize(x_model, bits, mode) > 0).double())
    raw = read(run_with_fixed_point(model, {"x": x}, None), model, "blocks.0.hook_resid_post", "y")
    assert not torch.equal(raw, raw.round())


@pytest.mark.parametrize("mode", rounding.MODES)
@pytest.mark.parametrize("relation", rounding.RELATIONS)
def test_fixed_point_hooks_make_comparisons_exact_for_every_real_input(relation, mode):
    bits = 3
    gen = torch.Generator().manual_seed(2)
    x = special_reals(rounding.resolution(bits), gen).unsqueeze(1)
    y = torch.cat([x[1:], x[:1]]) + torch.randn(x.shape, generator=gen, dtype=F64) * 0.01
    model = single_layer_model(ffns=[rounding.compare("x", "y", "out", relation, bits)])
    got = read(run_with_fixed_point(model, {"x": x, "y": y}, bits, mode), model, "blocks.0.hook_resid_post", "out")
    qx, qy = rounding.quantize(x, bits, mode), rounding.quantize(y, bits, mode)
    assert torch.equal(got, PYTHON[relation](qx, qy).double())


def test_quantize_reference():
    x = torch.tensor([0.3, 0.5, 0.7, 1.5, 2.5, -0.3, -0.7], dtype=F64)
    assert rounding.quantize(x, 0).tolist() == [0.0, 0.0, 1.0, 2.0, 2.0, -0.0, -1.0]  # ties to even
    assert rounding.quantize(x, 0, "toward_zero").tolist() == [0.0, 0.0, 0.0, 1.0, 2.0, -0.0, -0.0]
    assert rounding.quantize(x, 1).tolist() == [0.5, 0.5, 0.5, 1.5, 2.5, -0.5, -0.5]


def test_rounding_arguments_are_checked():
    for bits in (-1, 61, 2.0, True):
        with pytest.raises(ExactLensError, match="fraction_bits"):
            rounding.step("x", "y", bits)
    with pytest.raises(ExactLensError, match="mode"):
        rounding.quantize(torch.zeros(1), 3, "up")
    with pytest.raises(ExactLensError, match="relation"):
        rounding.compare("x", "y", "o", "!=", 3)
    with pytest.raises(ExactLensError, match="two different labels"):
        rounding.compare("x", "x", "o", ">", 3)


# ----------------------------------------------------------------------------- §7.2 helpers


def random_model(seed: int, scale: float = 0.7, **switches) -> ExactTransformer:
    settings = dict(
        d_model=6, n_layers=2, d_vocab=4, n_heads=2, d_head=3, d_mlp=8, dtype="float64",
        positional_features=("i/n", "1/(i+1)", "cos(i*pi)"),
    )
    settings.update(switches)
    model = ExactTransformer(ExactConfig(**settings))
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=gen, dtype=p.dtype) * scale)
    return model


def attention_output(attn, x: torch.Tensor) -> torch.Tensor:
    batch, n = x.shape[0], x.shape[1]
    n_positions = torch.full((batch,), n)
    return attn(x, visible_keys(attn.mask, n, n_positions, padded=False), n_positions)


def worst_ratio(f, x: torch.Tensor, eps: float, bound: float, trials: int, gen: torch.Generator) -> float:
    """max over gradient-sign perturbations (one per random output component) and random
    sign perturbations of ||f(x') - f(x)||_inf / (bound eps)."""
    worst = 0.0
    base = f(x).detach()
    for t in range(trials):
        if t % 2:
            direction = torch.randint(0, 2, x.shape, generator=gen).to(F64) * 2 - 1
        else:
            probe = x.clone().requires_grad_(True)
            out = f(probe)
            flat = int(torch.randint(0, out.numel(), (1,), generator=gen))
            out.flatten()[flat].backward()
            direction = probe.grad.sign()
        moved = f(x + eps * direction).detach()
        worst = max(worst, (moved - base).abs().max().item() / (bound * eps))
    return worst


# ----------------------------------------------------------------------------- Prop 7.1


SWITCHES = [
    {},
    {"normalization": "post", "ln_eps": 0.0},
    {"normalization": "pre", "ln_eps": 1e-5},
    {"attention_mask": "strict_causal", "attention_weighting": "unique_hard_right"},
    {"attention_mask": "causal", "attention_weighting": "average_hard", "act_fn": "gelu"},
    {"attention_mask": "strict_past", "attn_length_scale": "log_n", "positional_features": ("i",)},
]


@pytest.mark.parametrize("switches", SWITCHES, ids=lambda s: ",".join(f"{k}={v}" for k, v in s.items()) or "plain")
def test_every_activation_lies_in_its_box(switches):
    model = random_model(0, **switches)
    N = 16
    boxes = error_bounds.activation_boxes(model, N)
    gen = torch.Generator().manual_seed(1)
    for n in range(1, N + 1):
        tokens = torch.cat([torch.randint(0, 4, (100, n), generator=gen), torch.arange(4).unsqueeze(1).expand(4, n)])
        logits, cache = model.run_with_cache(tokens)
        for name, (lo, hi) in boxes.items():
            act = logits if name == "logits" else cache[name]
            slack = 1e-12 * (1 + torch.maximum(lo.abs(), hi.abs()))
            assert bool(((act >= lo - slack) & (act <= hi + slack)).all()), (name, n)


def averaging_model():
    """Tokens a (x = 1), b (x = -2); uniform causal average m of x; FFN r = relu(m) - 2 relu(-m)."""
    from exactlens.constructions.cookbook import FFN, attention

    layer = Layer(
        heads=(attention.uniform_average({"m": "x"}),),
        ffns=(FFN.build([{"m": 1.0}, {"m": -1.0}], {"r": [1.0, -2.0]}),),
        mask="causal",
    )
    program = Program(("a", "b"), {"a": {"x": 1.0}, "b": {"x": -2.0}}, (layer,), Readout({"o": {"r": 3.0}}))
    return compile(program)


def test_boxes_are_attained_by_extreme_inputs():
    """Tight case: constant words reach every box edge exactly, so a smaller box would fail."""
    model = averaging_model()
    boxes = error_bounds.activation_boxes(model, 7)
    logits, cache = model.run_with_cache(torch.tensor([[0] * 7, [1] * 7]))
    for name, (lo, hi) in boxes.items():
        act = logits if name == "logits" else cache[name]
        assert torch.equal(act.amin((0, 1)), lo) and torch.equal(act.amax((0, 1)), hi), name


def test_bounded_positional_features_give_length_free_boxes_and_unbounded_ones_do_not():
    """Features i/n, 1/(i+1) in [0, 1] and (-1)^i in [-1, 1]: every box for any N lies in the box
    propagated from those ranges (independent of N); with the feature i the boxes grow with N."""
    model = random_model(4)
    tokens = model.embed.W_E.detach()
    features = (torch.tensor([0.0, 0.0, -1.0], dtype=F64), torch.tensor([1.0, 1.0, 1.0], dtype=F64))
    positions = error_bounds.affine_box(features, model.pos_embed.W_feat.detach())
    limit = error_bounds.activation_boxes(
        model, 1, start=(tokens.amin(0) + positions[0], tokens.amax(0) + positions[1])
    )
    for N in (10, 1000):
        for name, (lo, hi) in error_bounds.activation_boxes(model, N).items():
            assert bool((lo >= limit[name][0] - 1e-12).all() and (hi <= limit[name][1] + 1e-12).all()), (N, name)
    grows = random_model(4, positional_features=("i",))
    short, long = (error_bounds.activation_boxes(grows, n)["blocks.0.hook_resid_pre"] for n in (10, 1000))
    assert (long[1] - long[0]).max() > 50 * (short[1] - short[0]).max()


def test_scores_as_weights_have_no_activation_bound():
    with pytest.raises(ExactLensError, match="convex combination"):
        error_bounds.activation_boxes(random_model(0, attention_weighting="none"), 5)


def test_learned_positions_are_bounded_by_their_table():
    model = random_model(2, positional_features=("learned",), n_ctx=8)
    boxes = error_bounds.activation_boxes(model, 8)
    _, cache = model.run_with_cache(torch.randint(0, 4, (50, 8), generator=torch.Generator().manual_seed(3)))
    for name, (lo, hi) in boxes.items():
        if name != "logits":
            assert bool(((cache[name] >= lo - 1e-12) & (cache[name] <= hi + 1e-12)).all()), name
    with pytest.raises(ExactLensError, match="n_ctx=8"):
        error_bounds.activation_boxes(model, 9)


# ----------------------------------------------------------------------------- Prop 7.2


@pytest.mark.parametrize("act_fn", ["relu", "gelu"])
def test_ffn_bound_holds_and_is_reached_when_units_align(act_fn):
    gen = torch.Generator().manual_seed(5)
    model = random_model(5, act_fn=act_fn)
    mlp = model.blocks[0].mlp
    C = error_bounds.ffn_lipschitz(mlp.W_in, mlp.W_out, act_fn)
    x = torch.randn(1, 50, 6, generator=gen, dtype=F64)
    assert worst_ratio(mlp, x, 1e-3, C, 40, gen) <= 1.0
    # worst case: nonnegative weights, every unit active (relu) or at GELU's steepest point sqrt 2
    with torch.no_grad():
        mlp.W_in.abs_()
        mlp.W_out.abs_()
        mlp.b_in.fill_(math.sqrt(2.0) if act_fn == "gelu" else 100.0)
    C = error_bounds.ffn_lipschitz(mlp.W_in, mlp.W_out, act_fn)
    # ReLU: linear while every unit stays active, so the ratio is 1 for any eps (0.5 here: float
    # rounding of the ~1e3-sized sums is < 1e-13 relative); GELU: 1 - O(eps^2) at its steepest point
    eps = 1e-4 if act_fn == "gelu" else 0.5
    x0 = torch.zeros(1, 1, 6, dtype=F64)
    ratio = (mlp(x0 + eps) - mlp(x0)).abs().max().item() / (C * eps)
    assert (1 - 1e-6 if act_fn == "gelu" else 1 - 1e-12) <= ratio <= 1 + 1e-12


# ----------------------------------------------------------------------------- Prop 7.3


@pytest.mark.parametrize(
    "switches", [{"attention_mask": "causal"}, {"attention_mask": "none", "attn_length_scale": "log_n"},
                 {"attention_mask": "strict_causal"}],
)
def test_attention_bound_holds_against_adversarial_perturbations(switches):
    model = random_model(3, **switches)
    attn = model.blocks[0].attn
    gen = torch.Generator().manual_seed(6)
    N, eps = 12, 1e-4
    box = (-torch.ones(6, dtype=F64), torch.ones(6, dtype=F64))
    C = error_bounds.attention_lipschitz(attn, box, N, perturbation=eps)
    for _ in range(10):
        x = torch.rand(1, N, 6, generator=gen, dtype=F64) * 2 - 1
        assert worst_ratio(lambda t: attention_output(attn, t), x, eps, C, 20, gen) <= 1.0


def test_attention_bound_is_reached_by_a_two_key_worst_case():
    """q from label a, k from b, v from c. Query 1 has a = 0 (equal weights on keys b = +-1,
    values c = +-1). Moving a by eps and every c by eps changes the output by eps + tanh(eps);
    the bound is (1 + (1 + eps) * 1) eps."""
    head = Head.build(query={"a": [1.0]}, key={"b": [1.0]}, value={("o", "c"): 1.0})
    model = single_layer_model(heads=[head], mask="causal")
    labels = model.cfg.residual_labels
    x = torch.zeros(1, 2, len(labels), dtype=F64)
    x[0, :, labels.index("b")] = torch.tensor([1.0, -1.0])
    x[0, :, labels.index("c")] = torch.tensor([1.0, -1.0])
    box = (x.amin((0, 1)), x.amax((0, 1)))
    eps = 1e-6
    C = error_bounds.attention_lipschitz(model.blocks[0].attn, box, 2, perturbation=eps)
    assert C == pytest.approx(2 + eps, abs=1e-12)
    moved = x.clone()
    moved[0, 1, labels.index("a")] += eps
    moved[0, :, labels.index("c")] += eps
    attn = model.blocks[0].attn
    change = (attention_output(attn, moved) - attention_output(attn, x)).abs().max().item()
    assert change == pytest.approx(eps + math.tanh(eps), rel=1e-9)
    assert 1 - 1e-6 <= change / (C * eps) <= 1.0


def test_hard_attention_has_no_lipschitz_constant():
    """A 1e-9 move of one key flips unique-hard attention: the output jumps by O(1)."""
    head = Head.build(query={}, key={"b": [1.0]}, value={("o", "c"): 1.0}, q_bias=[1.0])
    model = single_layer_model(heads=[head], mask="causal", weighting="unique_hard_right")
    labels = model.cfg.residual_labels
    x = torch.zeros(1, 2, len(labels), dtype=F64)
    x[0, :, labels.index("b")] = torch.tensor([1.0, 1.0 - 1e-9], dtype=F64)
    x[0, :, labels.index("c")] = torch.tensor([1.0, -1.0])
    moved = x.clone()
    moved[0, 1, labels.index("b")] = 1.0
    attn = model.blocks[0].attn
    assert (attention_output(attn, moved) - attention_output(attn, x)).abs().max().item() == 2.0
    with pytest.raises(ExactLensError, match="softmax attention only"):
        error_bounds.attention_lipschitz(attn, (x.amin((0, 1)), x.amax((0, 1))), 2)


# ----------------------------------------------------------------------------- Prop 7.5


@pytest.mark.parametrize("d_model", [2, 4, 6])
@pytest.mark.parametrize("center", [True, False])
def test_layer_norm_bound_holds_and_its_tightness_at_the_centre(d_model, center):
    """Measured ||LN(x') - LN(x)|| / (C eps) over adversarial x (constant vectors, where
    |J| is largest, and random ones at every scale): <= 1; at a constant x it is
    2(d-1)/d / k (centered: 0.71 for d = 2, 0.75 for d = 4, 0.68 for d = 6)."""
    model = random_model(7, d_model=d_model, d_head=2, normalization="pre", ln_eps=1e-2, ln_center=center)
    ln = model.blocks[0].ln1
    C = error_bounds.layer_norm_lipschitz(ln)
    gen = torch.Generator().manual_seed(8)
    scales = 10 ** torch.linspace(-3, 1, 9, dtype=F64)
    x = torch.randn(1, 9, d_model, generator=gen, dtype=F64) * scales.view(1, 9, 1)
    x[0, 0] = 0.3  # a constant vector: centered c = 0
    assert worst_ratio(ln, x, 1e-6, C, 60, gen) <= 1.0
    if center:
        eps = 1e-8
        direction = -torch.ones(d_model, dtype=F64)
        direction[0] = 1.0
        w = ln.w.detach().abs()
        at_centre = w[0] * 2 * (d_model - 1) / d_model / math.sqrt(1e-2)  # ||J e|| at c = 0 along +-1
        change = (ln(x[:, :1] + eps * direction) - ln(x[:, :1])).abs().max().item()
        assert change >= at_centre * eps * (1 - 1e-5)
        assert change / (C * eps) <= 1.0


def test_layer_norm_without_eps_has_no_lipschitz_constant():
    model = random_model(7, normalization="post", ln_eps=0.0)
    with pytest.raises(ExactLensError, match="eps = 0"):
        error_bounds.layer_norm_lipschitz(model.blocks[0].ln1)


# ----------------------------------------------------------------------------- Props 7.4 + chain


@pytest.mark.parametrize(
    "switches",
    [{"attention_mask": "causal"}, {"normalization": "pre", "ln_eps": 1e-2, "act_fn": "gelu"},
     {"normalization": "post", "ln_eps": 1e-1, "attention_mask": "none"}],
)
def test_chained_bound_holds_at_every_hook(switches):
    """Embeddings moved by <= eps (adversarially for one output, or random signs): every
    hook moves by at most perturbation_bounds' value (Prop 7.4 adds, 7.2/7.3/7.5 multiply)."""
    model = random_model(9, scale=0.4, **switches)
    N, eps = 10, 1e-6
    bounds = error_bounds.perturbation_bounds(model, eps, N)
    gen = torch.Generator().manual_seed(10)
    tokens = torch.randint(0, 4, (3, N), generator=gen)
    _, clean = model.run_with_cache(tokens)
    for t in range(12):
        if t % 2:
            shift = (torch.randint(0, 2, clean["hook_embed"].shape, generator=gen).to(F64) * 2 - 1) * eps
        else:
            probe = torch.zeros_like(clean["hook_embed"], requires_grad=True)
            with model.hooks(fwd_hooks=[("hook_embed", lambda act, hook, probe=probe: act + probe)]):
                out = model(tokens)
            out.flatten()[int(torch.randint(0, out.numel(), (1,), generator=gen))].backward()
            shift = probe.grad.sign() * eps
        with model.hooks(fwd_hooks=[("hook_embed", lambda act, hook, shift=shift: act + shift)]):
            logits, moved = model.run_with_cache(tokens)
        for name, bound in bounds.items():
            change = (logits - model(tokens)) if name == "logits" else (moved[name] - clean[name])
            # slack: a few ulps of the O(1) activations (the clean and moved runs round differently)
            assert change.abs().max().item() <= bound * (1 + 1e-9) + 1e-15, name


def test_chained_bound_refuses_what_has_no_constant():
    with pytest.raises(ExactLensError, match="softmax attention only"):
        error_bounds.perturbation_bounds(random_model(0, attention_weighting="average_hard"), 1e-3, 5)
    with pytest.raises(ExactLensError, match="eps = 0"):
        error_bounds.perturbation_bounds(random_model(0, normalization="pre", ln_eps=0.0), 1e-3, 5)
    assert error_bounds.residual_error(0.25, 0.5) == 0.75

"""The hand-written readout (exactlens.model.fastpath) computes what the model's own forward computes.

Each case builds a randomly initialized model of one configuration the path covers (post- and pre-LN, ReLU and
GELU, learned positions or features, a final LN, several heads, a log n factor, a logits readout at another
position, frozen biases) and compares the readout and the gradient of a weighted sum of it with respect to every
parameter against ``ExactTransformer.run`` with the fused kernels (the training loop's reference path): in float64
to 1e-12 (the arithmetic itself) and in float32 to float32 rounding. Then: the one gradient a flat leaf gets equals
the per-parameter ones, every condition it does not cover falls back to the model's own forward (hooks fire), and a
float32 training run gives the weights and history of the same run with the path turned off.
"""

from __future__ import annotations

import pytest
import torch

from exactlens.model import ExactConfig, ExactTransformer, fastpath
from exactlens.model.fastpath import FastPath, fast_plan, fast_readout, parameters_of
from exactlens.model.stacked import FlatLeaves, SingleRun
from exactlens.train import train

BASE = dict(d_model=16, n_layers=2, d_vocab=3, n_heads=1, d_head=16, d_mlp=64, d_vocab_out=1,
            attention_weighting="softmax", normalization="post", act_fn="relu", positional_features=["I[i=1]"],
            readout="sigmoid", readout_position=0, attn_bias=True, mlp_bias=True)
CASES = {
    "first (post-LN, ReLU, features)": {},
    "pre-LN, GELU, final LN, learned positions": dict(normalization="pre", act_fn="gelu",
                                                       positional_features=["learned"], n_ctx=12),
    "3 layers, 2 heads, log n, no attention bias": dict(n_layers=3, n_heads=2, d_head=8, attn_length_scale="log_n",
                                                        attn_bias=False, attn_scale=2.0),
    "logits readout at position 2, one layer": dict(n_layers=1, readout="logits", d_vocab_out=3, readout_position=2,
                                                    positional_features=["I[i=1]", "i/n"]),
}
TOLERANCE = {torch.float64: 1e-12, torch.float32: 2e-5}


def model_of(case: str, dtype: torch.dtype, seed: int = 0) -> ExactTransformer:
    cfg = ExactConfig(**{**BASE, **CASES[case]}, dtype="float64" if dtype == torch.float64 else "float32")
    model = ExactTransformer(cfg).init_weights(seed)
    with torch.no_grad():  # LN gains and biases away from 1 and 0, so that their gradients are tested too
        for p in model.parameters():
            if p.requires_grad and p.ndim == 1:
                p.add_(0.3 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel()), dtype=dtype))
    return model.train().set_fused(True)


def words(n_pos: int, batch: int = 37, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, 3, (batch, n_pos), generator=torch.Generator().manual_seed(seed))


def reference(model: ExactTransformer, tokens: torch.Tensor) -> torch.Tensor:
    n = torch.full((tokens.shape[0],), tokens.shape[1])
    return model.select_readout(model.run(tokens, n, False, readout_only=True), n)


def close(a: torch.Tensor, b: torch.Tensor, tol: float) -> bool:
    a, b = a.detach(), b.detach()
    return bool((a - b).abs().max() <= tol * max(1.0, float(b.abs().max())))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["float64", "float32"])
@pytest.mark.parametrize("case", CASES)
def test_values_and_gradients_equal_the_model(case, dtype):
    model = model_of(case, dtype)
    tokens = words(9)
    plan = fast_plan(model, 9, False, dtypes=(dtype,))
    assert not isinstance(plan, str), plan
    params = [p for p in parameters_of(model) if p.requires_grad]
    expected = reference(model, tokens)
    weights = torch.randn(expected.shape, generator=torch.Generator().manual_seed(2), dtype=dtype)
    expected_grads = torch.autograd.grad((expected * weights).sum(), params)
    out = fast_readout(model, plan, tokens)
    grads = torch.autograd.grad((out * weights).sum(), params)
    tol = TOLERANCE[dtype]
    assert out.shape == expected.shape and close(out, expected, tol), float((out - expected).abs().max())
    names = {id(p): name for name, p in model.named_parameters()}
    for p, g, e in zip(params, grads, expected_grads, strict=True):
        assert close(g, e, tol), f"{case}, {dtype}: gradient of {names[id(p)]} off by {float((g - e).abs().max()):.2e}"


def test_one_flat_gradient_equals_the_per_parameter_ones():
    model = model_of("3 layers, 2 heads, log n, no attention bias", torch.float32)
    tokens = words(7)
    trainable = [p for p in model.parameters() if p.requires_grad]
    plan = fast_plan(model, 7, False)
    per_parameter = torch.autograd.grad(fast_readout(model, plan, tokens).sum(), trainable)
    flat = FlatLeaves(trainable)
    path = FastPath(model)
    path.use_flat(flat.flat, flat.leaves)
    assert path.flat is not None
    path.readout(tokens, False, True).sum().backward()
    assert torch.equal(flat.flat.grad, torch.cat([g.reshape(-1) for g in per_parameter]))
    for leaf, g in zip(flat.leaves, per_parameter, strict=True):
        assert torch.equal(leaf.grad, g)
    flat.release()


@pytest.mark.parametrize("change, reason", [
    (lambda m: m.to(torch.float64), "float32 on the CPU only"),
    (lambda m: setattr(m.cfg, "attention_mask", "causal"), "attention_mask other than ['none']"),
    (lambda m: setattr(m.cfg, "readout", "per_position"), "a readout at one fixed position only"),
])
def test_what_it_does_not_cover_is_said(change, reason):
    model = model_of("first (post-LN, ReLU, features)", torch.float32)
    change(model)
    plan = fast_plan(model, 9, False)
    assert isinstance(plan, str) and plan.startswith(reason), plan
    unchanged = model_of("first (post-LN, ReLU, features)", torch.float32)
    assert fast_plan(unchanged, 9, True) == "padded words (keys masked)"


def test_a_config_field_it_was_not_written_for_is_refused(monkeypatch):
    model = model_of("first (post-LN, ReLU, features)", torch.float32)
    assert not isinstance(fast_plan(model, 9, False), str)
    monkeypatch.setattr(fastpath, "KNOWN_FIELDS", fastpath.KNOWN_FIELDS - {"use_attn_result"})
    assert fast_plan(model, 9, False) == "config fields it was not written for: use_attn_result"


def test_falls_back_to_the_model_where_it_does_not_apply(monkeypatch):
    model = model_of("first (post-LN, ReLU, features)", torch.float32)
    runs = SingleRun(model)
    tokens = words(9)[None]
    n = torch.full((1, tokens.shape[1]), 9)
    calls = []
    monkeypatch.setattr(fastpath.FastReadout, "apply", lambda *a: _counted(calls, *a))
    expected = reference(model, tokens[0])
    assert torch.allclose(runs.readout(tokens, n), expected[None], atol=1e-6) and len(calls) == 1
    seen = []
    handle = model.blocks[0].attn.hook_pattern.add_hook(lambda t, hook: seen.append(t.shape))
    try:  # a hook is attached: the model's own forward runs and the hook fires
        assert torch.allclose(runs.readout(tokens, n), expected[None], atol=1e-6)
    finally:
        model.reset_hooks()
    assert seen and len(calls) == 1, "with a hook attached the model's own forward runs"
    del handle
    padded = n.clone()
    padded[0, 0] = 5
    runs.readout(tokens, padded)  # padded words: the model's forward
    model.set_fused(False)
    runs.readout(tokens, n)  # fused kernels off: the model's forward
    model.set_fused(True)
    monkeypatch.setattr(fastpath, "ENABLED", False)
    runs.readout(tokens, n)
    monkeypatch.setattr(fastpath, "ENABLED", True)
    runs.readout(tokens, n)
    assert len(calls) == 2, "only the unpadded, fused, hook-free calls with the path enabled use it"


_APPLY = fastpath.FastReadout.apply


def _counted(calls: list, *args):
    calls.append(1)
    return _APPLY(*args)


_FORWARD = fastpath._forward


def test_training_with_and_without_it_agree(monkeypatch):
    options = dict(epochs=12, train_length=8, strings_per_epoch=50, batch_size=25, test_strings=20, eval_every=4)
    calls = []
    monkeypatch.setattr(fastpath, "_forward", lambda *a: calls.append(1) or _FORWARD(*a))
    fast = train("first", seed=5, **options)
    assert len(calls) == 24, "every step (2 per epoch) through the hand-written readout"
    monkeypatch.setattr(fastpath, "ENABLED", False)
    plain = train("first", seed=5, **options)
    assert len(calls) == 24
    for (name, p), q in zip(fast.model.named_parameters(), plain.model.parameters(), strict=True):
        assert torch.allclose(p, q, atol=1e-5, rtol=1e-5), f"{name} off by {float((p - q).abs().max()):.2e}"
    for a, b in zip(fast.history, plain.history, strict=True):
        assert a["epoch"] == b["epoch"] and abs(a["train_loss_bits"] - b["train_loss_bits"]) < 1e-5


@pytest.mark.parametrize("case", [c for c in CASES if "logits" not in c])
def test_by_hand_gives_the_autograd_paths_outputs_and_flat_gradient_bit_for_bit(case):
    """FastPath.by_hand (no autograd: the training loop's step for a membership task) against FastPath.readout
    (one autograd node) on the same flat leaf: the same outputs, and add_gradient adds exactly the gradient that
    backward() gives, for every parameter."""
    model = model_of(case, torch.float32)
    tokens = words(9)
    trainable = [p for p in model.parameters() if p.requires_grad]
    flat = FlatLeaves(trainable)
    path = FastPath(model)
    path.use_flat(flat.flat, flat.leaves)
    weights = torch.randn(tokens.shape[0], generator=torch.Generator().manual_seed(3))
    out = path.readout(tokens, False, True)
    (out * weights).sum().backward()
    expected = flat.flat.grad.clone()
    flat.zero_grad()
    hand = path.by_hand(tokens, False)
    assert hand is not None and not hand.outputs.requires_grad
    assert torch.equal(hand.outputs, out.detach())
    hand.add_gradient(weights)
    assert torch.equal(flat.flat.grad, expected)
    hand.add_gradient(weights)  # added, as autograd accumulates into an existing gradient
    assert torch.equal(flat.flat.grad, expected + expected)
    flat.release()


def test_by_hand_is_none_where_the_path_does_not_apply():
    model = model_of("first (post-LN, ReLU, features)", torch.float32)
    tokens = words(9)
    path = FastPath(model)
    assert path.by_hand(tokens, False) is None, "no flat leaf: the gradient has nowhere to go"
    flat = FlatLeaves([p for p in model.parameters() if p.requires_grad])
    path.use_flat(flat.flat, flat.leaves)
    assert path.by_hand(tokens, False) is not None
    assert path.by_hand(tokens, True) is None  # padded words
    model.blocks[1].hook_resid_mid.add_hook(lambda t, hook: t)
    try:
        assert path.by_hand(tokens, False) is None  # a hook is attached
    finally:
        model.reset_hooks()
    flat.release()

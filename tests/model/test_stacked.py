"""StackedRuns equals the model: every construction and every switch, outputs and gradients.

``StackedRuns`` (torch.vmap of ExactTransformer.run over a run axis) is the training loop's only
fast path; its docstring claims it computes exactly what each model computes. Each case here builds
R models of one configuration that differ (a construction and a perturbed copy, or random inits),
runs them on right-padded batches of mixed lengths (some rows shorter than the tensor, one run with
no full-width row) and compares the stacked readout and the gradients of a scalar loss with respect
to ``stacked.params`` against each model's own, in float64.
"""

from __future__ import annotations

import copy

import pytest
import torch
from samples import construction_sample

from exactlens import constructions, tasks
from exactlens.errors import ExactLensError
from exactlens.model import ExactConfig, ExactTransformer, StackedRuns

ATOL = 1e-10
RTOL = 1e-10


# ---- helpers ------------------------------------------------------------------------------------


def perturbed(model: ExactTransformer, seed: int, scale: float = 1e-3) -> ExactTransformer:
    """A copy with small random changes to every float parameter (so that runs differ)."""
    out = copy.deepcopy(model)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in out.parameters():
            if p.is_floating_point():
                p.add_(scale * torch.randn(p.shape, generator=gen, dtype=p.dtype))
    return out


def task_batches(task: tasks.Task, lo: int, runs: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded words of the task, tokens [R, B, pos] and n_positions [R, B].

    Run 0 has words of lengths lo..lo+4 (its longest fills the tensor); run r > 0 has other lengths,
    none of them the longest, so every row of that run is padded."""
    gen = torch.Generator().manual_seed(seed)
    table = [
        [lo, lo + 4, lo + 1, lo + 3, lo + 2],
        [lo + 2, lo, lo + 3, lo + 1, lo + 3],
        [lo + 1, lo + 1, lo, lo + 3, lo],
    ]
    width = lo + 4 + task.n_specials
    tokens = torch.zeros(runs, len(table[0]), width, dtype=torch.long)
    n_positions = torch.zeros(runs, len(table[0]), dtype=torch.long)
    for r in range(runs):
        for row, length in enumerate(table[r % len(table)]):
            encoded = task.encode(task.sample(length, 1, gen)).tokens[0]
            tokens[r, row, : len(encoded)] = encoded
            n_positions[r, row] = len(encoded)
    return tokens, n_positions


def random_batches(cfg: ExactConfig, runs: int, seed: int, width: int = 6) -> tuple[torch.Tensor, torch.Tensor]:
    """Random token ids [R, 5, width] with n_positions [R, 5] in [1, width] (run 0 has a full row)."""
    gen = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, cfg.d_vocab, (runs, 5, width), generator=gen)
    n_positions = torch.randint(1, width + 1, (runs, 5), generator=gen)
    n_positions[0, 0] = width
    n_positions[0, 1] = 1  # a one-position row (a query that sees itself only)
    if runs > 1:
        n_positions[1] = n_positions[1].clamp(max=width - 1)  # every row padded
    return tokens, n_positions


def loss_weights(model: ExactTransformer, out: torch.Tensor, n_positions: torch.Tensor, seed: int) -> torch.Tensor:
    """Fixed random weights of the scalar loss sum(weights * outputs); per-position readouts weigh
    real positions only (padded positions' outputs are meaningless, see evaluate_features)."""
    gen = torch.Generator().manual_seed(seed)
    weights = torch.randn(out.shape, generator=gen, dtype=out.dtype)
    if model.cfg.readout == "per_position":
        real = torch.arange(out.shape[-2]) < n_positions.unsqueeze(-1)  # [..., pos]
        weights = weights * real.unsqueeze(-1)
    return weights


def check_stacked(
    models: list[ExactTransformer],
    tokens: torch.Tensor,
    n_positions: torch.Tensor,
    *,
    fused: bool = False,
    atol: float = ATOL,
    rtol: float = RTOL,
) -> None:
    """The stacked readout (readout_only on and off) and the gradients of a scalar loss w.r.t.
    ``stacked.params`` equal each (unfused) model's own. With ``fused`` the stacked runs use fused
    kernels (on copies, so that the reference models stay unfused)."""
    runs = len(models)
    for model in models:
        model.set_fused(False)
    stacked = StackedRuns([copy.deepcopy(m) for m in models] if fused else models)
    if fused:
        stacked.set_fused(True)
    assert len(stacked) == runs
    names = [name for name, _ in models[0].named_parameters()]
    assert list(stacked.params) == names
    for name, param in models[0].named_parameters():
        assert stacked.params[name].shape == (runs, *param.shape), name
        assert stacked.params[name].requires_grad == param.requires_grad, name
        for r, model in enumerate(models):
            assert torch.equal(stacked.params[name][r], dict(model.named_parameters())[name]), name

    expected = [m.readout(tokens[r], n_positions[r]) for r, m in enumerate(models)]
    for r, want in enumerate(expected):  # the reference itself: readout_only changes nothing
        only = models[r].readout(tokens[r], n_positions[r], readout_only=True)
        torch.testing.assert_close(only, want, atol=atol, rtol=rtol)

    for readout_only in (True, False):
        out = stacked.readout(tokens, n_positions, readout_only=readout_only)
        assert out.shape == (runs, *expected[0].shape)
        for r, want in enumerate(expected):
            torch.testing.assert_close(out[r].detach(), want.detach(), atol=atol, rtol=rtol,
                                       msg=lambda m, r=r, ro=readout_only: f"run {r}, readout_only={ro}: {m}")

    trainable = {name: p for name, p in stacked.params.items() if p.requires_grad}
    for readout_only in (True, False):
        # the same readout_only on both sides: with it off, positions the readout never reads are computed
        # too, and their gradients can be NaN (post-LN with eps = 0 on a zero-variance row, parity-ln-eta)
        out = stacked.readout(tokens, n_positions, readout_only=readout_only)
        weights = loss_weights(models[0], out, n_positions, seed=11)
        grads = torch.autograd.grad((weights * out).sum(), list(trainable.values()), allow_unused=True)
        stacked_grads = dict(zip(trainable, grads, strict=True))
        for r, model in enumerate(models):
            own = {name: p for name, p in model.named_parameters() if p.requires_grad}
            assert list(own) == list(trainable)
            want_out = model.readout(tokens[r], n_positions[r], readout_only=readout_only)
            want = torch.autograd.grad((weights[r] * want_out).sum(), list(own.values()), allow_unused=True)
            for name, g in zip(own, want, strict=True):
                got = stacked_grads[name]
                if g is None:  # unused by the model: unused (or zero) in the stacked runs too
                    assert got is None or not got[r].any(), name
                    continue
                assert got is not None, name
                torch.testing.assert_close(
                    got[r], g, atol=atol, rtol=rtol, equal_nan=True,
                    msg=lambda m, r=r, name=name, ro=readout_only: f"d/d{name}, run {r}, readout_only={ro}: {m}",
                )


# ---- every construction -------------------------------------------------------------------------

CONSTRUCTIONS = construction_sample()


@pytest.mark.parametrize("runs", [2, 1], ids=["R2", "R1"])
@pytest.mark.parametrize("name", CONSTRUCTIONS)
def test_every_construction_stacked_equals_the_model(name, runs):
    construction = constructions.get(name)
    model = constructions.build(name, dtype="float64")
    task = tasks.of_model(model)
    lo, _ = construction.length_range(model)
    models = [model, perturbed(model, seed=1)][:runs]
    tokens, n_positions = task_batches(task, lo, runs, seed=len(name))
    assert bool((n_positions < tokens.shape[-1]).any())  # padded rows
    check_stacked(models, tokens, n_positions)


def test_constructions_are_covered():
    # the papers' plug-ins register at least these; a construction added later is covered automatically
    assert {"parity", "first", "one", "palindrome", "majority", "dyck1", "induction-recent", "sm-solution1"} <= set(
        CONSTRUCTIONS
    )


# ---- every switch, on small random models -------------------------------------------------------

BASE = dict(d_model=8, n_layers=2, d_vocab=5, n_heads=2, d_mlp=6, d_vocab_out=3, dtype="float64",
            positional_features=("i/n",))

SWITCHES = {
    # normalization
    "norm-none": dict(normalization="none"),
    "norm-post": dict(normalization="post"),
    "norm-pre": dict(normalization="pre"),
    "norm-pre-rms": dict(normalization="pre", ln_center=False),
    "norm-post-rms": dict(normalization="post", ln_center=False),
    "norm-post-eps0": dict(normalization="post", ln_eps=0.0),
    "norm-scale-only-off": dict(normalization="pre", ln_scale=False),
    "norm-mixed-final": dict(normalization=("pre", "none"), ln_final=True),
    "norm-no-affine": dict(normalization="pre", ln_affine=False),
    "ln-select": dict(normalization="pre", ln_select=True),
    # attention weighting
    "softmax": dict(attention_weighting="softmax"),
    "weighting-none": dict(attention_weighting="none"),
    "average-hard": dict(attention_weighting="average_hard"),
    "unique-hard-left": dict(attention_weighting="unique_hard_left"),
    "unique-hard-right": dict(attention_weighting="unique_hard_right"),
    "hard-tolerance": dict(attention_weighting="average_hard", hard_tie_tolerance=0.5),
    "weighting-mixed": dict(attention_weighting=("unique_hard_right", "softmax")),
    # masks and length scales
    "mask-causal": dict(attention_mask="causal"),
    "mask-strict": dict(attention_mask=("strict_causal", "strict_past")),
    "mask-past": dict(attention_mask="past", attention_weighting="average_hard"),
    "log-n": dict(attn_length_scale="log_n"),
    "log-visible": dict(attn_length_scale="log_visible", attention_mask="causal"),
    "attn-scale": dict(attn_scale=0.5, d_head=3),
    # positions
    "positions-none": dict(positional_features=()),
    "positions-learned": dict(positional_features=("learned",), n_ctx=9),
    "positions-named": dict(positional_features=("1", "i", "n", "1/n", "cos(i*pi)", "I[i=0]", "I[i=n-1]",
                                                 "I[i<n/2]", "I[i<=(n-1)/2]", "(i/n)^2", "1/(i+1)")),
    "positions-sinusoidal": dict(positional_features=("sin[0/4]", "cos[0/4]", "sin[1/4]", "cos[1/4]")),
    # readouts
    "sigmoid": dict(readout="sigmoid", d_vocab_out=1),
    "sigmoid-last": dict(readout="sigmoid", d_vocab_out=1, readout_position=-1, attention_mask="causal"),
    "logits-last": dict(readout="logits", readout_position=-1),
    "logits-second": dict(readout="logits", readout_position=1),
    "per-position": dict(readout="per_position", attention_mask="causal"),
    # feed-forward
    "no-mlp": dict(d_mlp=0),
    "mlp-no-residual": dict(mlp_residual=False),
    "mlp-no-residual-post": dict(mlp_residual=False, normalization="post"),
    "mlp-no-residual-pre": dict(mlp_residual=False, normalization="pre", readout="per_position"),
    "act-gelu-identity": dict(act_fn=("gelu", "identity")),
    "no-biases": dict(attn_bias=False, mlp_bias=False),
    "attn-result": dict(use_attn_result=True),
    "one-layer-one-head": dict(n_layers=1, n_heads=1),
}


def random_models(switches: dict, runs: int, seed: int = 0) -> list[ExactTransformer]:
    cfg = ExactConfig(**{**BASE, **switches})
    models = [ExactTransformer(copy.deepcopy(cfg)).init_weights(seed=seed + r) for r in range(runs)]
    gen = torch.Generator().manual_seed(seed + 99)
    for model in models:  # LN gains and biases start at 1 and 0: perturb them too, so every path is exercised
        with torch.no_grad():
            for name, p in model.named_parameters():
                if name.endswith((".w", ".b")):
                    p.add_(0.1 * torch.randn(p.shape, generator=gen, dtype=p.dtype))
    return models


@pytest.mark.parametrize("case", list(SWITCHES))
def test_every_switch_stacked_equals_the_model(case):
    models = random_models(SWITCHES[case], runs=2)
    tokens, n_positions = random_batches(models[0].cfg, runs=2, seed=3)
    check_stacked(models, tokens, n_positions)


@pytest.mark.parametrize("case", ["softmax", "sigmoid-last", "per-position", "norm-post-rms", "positions-learned"])
def test_one_run(case):
    models = random_models(SWITCHES[case], runs=1)
    tokens, n_positions = random_batches(models[0].cfg, runs=1, seed=4)
    check_stacked(models, tokens, n_positions)


def test_unpadded_batches():
    """No row shorter than the tensor: the model's unpadded path (no key mask, features once)."""
    models = random_models(dict(normalization="pre"), runs=2)
    tokens, _ = random_batches(models[0].cfg, runs=2, seed=5)
    check_stacked(models, tokens, torch.full(tokens.shape[:2], tokens.shape[-1], dtype=torch.long))


FUSED = {
    "fused-pre": dict(normalization="pre"),
    "fused-post": dict(normalization="post"),
    "fused-rms": dict(normalization="pre", ln_center=False),
    "fused-causal-log-n": dict(attention_mask="causal", attn_length_scale="log_n", normalization="post"),
    "fused-per-position": dict(normalization="pre", attention_mask="causal", readout="per_position"),
    "fused-mixed": dict(attention_weighting=("softmax", "average_hard"), attention_mask=("none", "strict_causal"),
                        normalization=("pre", "post"), ln_final=True),
    "fused-learned": dict(positional_features=("learned",), n_ctx=6, normalization="pre"),
}


@pytest.mark.parametrize("case", list(FUSED))
@pytest.mark.parametrize("padded", [True, False], ids=["padded", "full"])
def test_fused_stacked_equals_the_unfused_model(case, padded):
    models = random_models(FUSED[case], runs=2)
    tokens, n_positions = random_batches(models[0].cfg, runs=2, seed=6)
    if not padded:
        n_positions = torch.full_like(n_positions, tokens.shape[-1])
    check_stacked(models, tokens, n_positions, fused=True, atol=1e-9, rtol=1e-9)


def test_fused_stacked_construction():
    # Perturbed copies only: the exact construction sits on ReLU kinks (parity's FFN reads k/n - i/n + j/n,
    # exactly 0 at i = k - j), where the gradient is 0 or 1 by the sign of a rounding error, and fused
    # kernels round differently from the formulas.
    model = constructions.build("parity-ln", dtype="float64")
    models = [perturbed(model, seed=2), perturbed(model, seed=3)]
    tokens, n_positions = task_batches(tasks.of_model(model), 0, 2, seed=7)
    check_stacked(models, tokens, n_positions, fused=True, atol=1e-9, rtol=1e-9)


def _fused_attention_tensors() -> int:
    import gc

    gc.collect()
    return sum(1 for o in gc.get_objects()
               if torch.is_tensor(o) and "FusedAttention" in type(getattr(o, "grad_fn", None)).__name__)


@pytest.mark.filterwarnings("ignore::FutureWarning")  # gc.get_objects meets deprecated torch objects
@pytest.mark.parametrize("stacked", [False, True], ids=["model", "stacked"])
def test_fused_attention_training_steps_free_their_graph(stacked):
    """Nothing of a step's graph outlives it: the fused kernel's mask bias was once kept on the autograd
    context while also being an output of the node, a cycle through the C++ graph that no collector
    frees (every training step leaked its [b, 1, q, k] bias: GBs at 1024 positions)."""
    models = random_models({"attention_mask": "causal"}, runs=2)
    tokens, n_positions = random_batches(models[0].cfg, runs=2, seed=4)
    runner = StackedRuns(models) if stacked else models[0]
    runner.set_fused(True)
    before = _fused_attention_tensors()
    for _ in range(3):
        out = runner.readout(tokens, n_positions) if stacked else runner.readout(tokens[0], n_positions[0])
        out.sum().backward()
        del out
    assert _fused_attention_tensors() == before


# ---- what StackedRuns refuses, and sync --------------------------------------------------------


def test_mismatched_configs_raise():
    a, b = random_models({}, runs=2)
    for change in (dict(normalization="pre"), dict(d_mlp=4), dict(attention_mask="causal"), dict(readout="sigmoid",
                   d_vocab_out=1), dict(dtype="float32"), dict(positional_features=("i",))):
        other = ExactTransformer(a.cfg.replace(**change))
        with pytest.raises(ExactLensError, match="one configuration"):
            StackedRuns([a, other])
    with pytest.raises(ExactLensError, match="one configuration"):
        StackedRuns([a, b, constructions.build("first", dtype="float64")])
    with pytest.raises(ExactLensError, match="at least one model"):
        StackedRuns([])


def test_bad_stacked_inputs_raise():
    models = random_models({}, runs=2)
    stacked = StackedRuns(models)
    tokens, n_positions = random_batches(models[0].cfg, runs=2, seed=8)
    with pytest.raises(ExactLensError, match="stacked input"):
        stacked.readout(tokens[0], n_positions[0])  # no run axis
    with pytest.raises(ExactLensError, match="stacked input"):
        stacked.readout(tokens[:1], n_positions[:1])  # one run for two models
    with pytest.raises(ExactLensError, match="stacked input"):
        stacked.readout(tokens, n_positions[:, :2])
    with pytest.raises(ExactLensError, match="token ids"):
        stacked.readout(tokens + models[0].cfg.d_vocab, n_positions)
    with pytest.raises(ExactLensError, match="n_positions"):
        stacked.readout(tokens, n_positions + tokens.shape[-1])


def test_sync_copies_each_run_into_its_model():
    models = random_models({}, runs=2)
    stacked = StackedRuns(models)
    with torch.no_grad():
        for p in stacked.params.values():
            p.add_(torch.arange(2, dtype=p.dtype).view(-1, *[1] * (p.ndim - 1)) + 0.5)
    stacked.sync()
    for r, model in enumerate(models):
        for name, p in model.named_parameters():
            assert torch.equal(p, stacked.params[name][r]), name
    tokens, n_positions = random_batches(models[0].cfg, runs=2, seed=9)
    check_stacked(models, tokens, n_positions)

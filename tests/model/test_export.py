"""Exports to TransformerLens: HookedTransformer (TL < 4) and TransformerBridge (TL >= 4).

The same file runs in both environments: with TL 4.x the bridge tests run and
the HookedTransformer tests skip; in the TL 3.9 environment (.venv-tl39) it is
the other way round. Tests that only look at configs run in both.
"""

from __future__ import annotations

import pytest
import torch

from exactlens.errors import ExactLensError
from exactlens.model import ExactConfig, ExactTransformer
from exactlens.model.export import export_problems, to_bridge, to_hooked_transformer, transformer_lens_major

pytestmark = pytest.mark.export

TL_MAJOR = transformer_lens_major()
needs_bridge = pytest.mark.skipif(TL_MAJOR < 4, reason="TransformerBridge exports need TransformerLens >= 4")
needs_ht = pytest.mark.skipif(TL_MAJOR >= 4, reason="HookedTransformer exports need TransformerLens < 4")

EXPORTS = {"bridge": to_bridge, "hooked_transformer": to_hooked_transformer}
TARGET_PARAMS = [
    pytest.param("bridge", marks=needs_bridge, id="bridge"),
    pytest.param("hooked_transformer", marks=needs_ht, id="hooked_transformer"),
]
INSTALLED_TARGET = "bridge" if TL_MAJOR >= 4 else "hooked_transformer"
OTHER_TARGET = "hooked_transformer" if TL_MAJOR >= 4 else "bridge"

TOL = {"float32": 1e-5, "float64": 1e-10}

# Each case: ExactConfig fields, weight scale, the input length, and the length passed to the export.
CASES = {
    "preLN_causal_relu_learned_f32": dict(
        cfg=dict(
            normalization="pre",
            attention_mask="causal",
            d_mlp=16,
            act_fn="relu",
            positional_features=("learned",),
            n_ctx=9,
        ),
        std=1.0,
        n_pos=7,
        length=None,
    ),
    "preLN_bidir_gelu_features_f64_scale": dict(
        cfg=dict(
            normalization="pre",
            attention_mask="none",
            d_mlp=12,
            act_fn="gelu",
            dtype="float64",
            attn_scale=2.5,
            positional_features=("i/n", "I[i=n-1]", "1", "sin[0/4]", "cos[1/4]"),
        ),
        std=1.0,
        n_pos=6,
        length=6,
    ),
    "noLN_causal_attnonly_f64_scale1": dict(
        cfg=dict(
            normalization="none",
            attention_mask="causal",
            d_mlp=0,
            dtype="float64",
            attn_scale=1.0,
            positional_features=("i", "1/(i+1)"),
        ),
        std=0.6,
        n_pos=5,
        length=5,
    ),
    "RMS_bidir_relu_learned_f32": dict(
        cfg=dict(
            normalization="pre",
            ln_center=False,
            attention_mask="none",
            d_mlp=16,
            act_fn="relu",
            positional_features=("learned",),
            n_ctx=8,
        ),
        std=1.0,
        n_pos=8,
        length=None,
    ),
    "noLN_bidir_gelu_dhead5_f32": dict(
        cfg=dict(
            normalization="none",
            attention_mask="none",
            d_mlp=10,
            act_fn="gelu",
            n_heads=3,
            d_head=5,
            positional_features=("learned",),
            n_ctx=6,
            attn_scale=1.5,
        ),
        std=0.8,
        n_pos=6,
        length=None,
    ),
    "preLN_causal_eps0_noaffine_nopos_f64": dict(
        cfg=dict(
            normalization="pre",
            attention_mask="causal",
            d_mlp=0,
            dtype="float64",
            ln_eps=0.0,
            ln_affine=False,
            positional_features=(),
        ),
        std=1.0,
        n_pos=4,
        length=4,
    ),
    "preLN_causal_gelu_sigmoid_f32": dict(
        cfg=dict(
            normalization="pre",
            attention_mask="causal",
            d_mlp=8,
            act_fn="gelu",
            readout="sigmoid",
            d_vocab_out=1,
            positional_features=("i/(n-1)", "I[i=0]"),
        ),
        std=1.0,
        n_pos=5,
        length=5,
    ),
}


def build(cfg_fields: dict, std: float, seed: int = 0) -> ExactTransformer:
    fields = dict(d_model=8, n_layers=2, d_vocab=5, n_heads=2, d_vocab_out=3)
    fields.update(cfg_fields)
    model = ExactTransformer(ExactConfig(**fields)).init_weights(seed=seed, scale=std)
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim != 1 or not p.requires_grad:
                continue  # matrices from init_weights; ln_affine=False keeps w=1, b=0
            noise = torch.randn(p.shape, generator=gen, dtype=torch.float64).to(p.dtype)
            p.copy_(1 + 0.3 * noise if name.endswith(".w") else 0.5 * noise)
    return model


def compared_hooks(cfg: ExactConfig) -> list[str]:
    names = ["hook_embed", "hook_pos_embed"]
    for layer in range(cfg.n_layers):
        names += [
            f"blocks.{layer}.hook_resid_pre",
            f"blocks.{layer}.hook_resid_post",
            f"blocks.{layer}.attn.hook_pattern",
        ]
        if cfg.d_mlp > 0:
            names += [f"blocks.{layer}.mlp.hook_post", f"blocks.{layer}.hook_mlp_out"]
    return names


def tokens_for(cfg: ExactConfig, n_pos: int, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed + 2)
    return torch.randint(0, cfg.d_vocab, (4, n_pos), generator=gen)


def assert_close(ours: torch.Tensor, theirs: torch.Tensor, dtype: str, what: str) -> None:
    tol = TOL[dtype]
    assert theirs.dtype == ours.dtype, f"{what}: dtype {theirs.dtype} != {ours.dtype}"
    assert theirs.shape == ours.shape, f"{what}: shape {tuple(theirs.shape)} != {tuple(ours.shape)}"
    torch.testing.assert_close(theirs, ours, atol=tol, rtol=tol, msg=lambda m: f"{what}: {m}")


@pytest.mark.parametrize("target", TARGET_PARAMS)
@pytest.mark.parametrize("case", list(CASES))
def test_export_matches_logits_and_hooks(target: str, case: str) -> None:
    spec = CASES[case]
    model = build(spec["cfg"], spec["std"])
    cfg = model.cfg
    before = {k: v.clone() for k, v in model.state_dict().items()}
    exported = EXPORTS[target](model, length=spec["length"])

    assert not exported.training
    assert all(p.dtype == cfg.torch_dtype for p in exported.parameters())
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items()), "export changed our weights"

    tokens = tokens_for(cfg, spec["n_pos"])
    with torch.no_grad():
        ours, our_cache = model.run_with_cache(tokens)
        theirs, their_cache = exported.run_with_cache(tokens)
    assert ours.shape == (4, spec["n_pos"], cfg.d_vocab_out)
    assert_close(ours, theirs, cfg.dtype, "logits")

    for name in compared_hooks(cfg):
        assert_close(our_cache[name], their_cache[name], cfg.dtype, name)

    # the random weights give attention that is neither uniform nor one-hot everywhere
    last_row = our_cache["blocks.0.attn.hook_pattern"][:, :, -1, :]
    assert last_row.std(-1).max() > 0.02
    assert last_row.max() < 1 - 1e-6


@pytest.mark.parametrize("target", TARGET_PARAMS)
def test_learned_table_export_holds_at_shorter_lengths(target: str) -> None:
    model = build(CASES["preLN_causal_relu_learned_f32"]["cfg"], 1.0)
    exported = EXPORTS[target](model)
    assert exported.cfg.n_ctx == model.cfg.n_ctx
    for n_pos in (1, 3, model.cfg.n_ctx):
        tokens = tokens_for(model.cfg, n_pos, seed=n_pos)
        with torch.no_grad():
            assert_close(model(tokens), exported(tokens), "float32", f"logits at {n_pos} positions")


@pytest.mark.parametrize("target", TARGET_PARAMS)
def test_learned_table_truncated_to_length(target: str) -> None:
    model = build(CASES["preLN_causal_relu_learned_f32"]["cfg"], 1.0)
    exported = EXPORTS[target](model, length=4)
    assert exported.cfg.n_ctx == 4
    tokens = tokens_for(model.cfg, 4)
    with torch.no_grad():
        assert_close(model(tokens), exported(tokens), "float32", "logits")


@pytest.mark.parametrize("target", TARGET_PARAMS)
def test_length_dependent_features_hold_only_at_the_export_length(target: str) -> None:
    spec = CASES["preLN_bidir_gelu_features_f64_scale"]
    model = build(spec["cfg"], spec["std"])
    exported = EXPORTS[target](model, length=6)
    assert exported.cfg.n_ctx == 6
    short = tokens_for(model.cfg, 4)
    with torch.no_grad(), pytest.raises(ExactLensError, match="for 6 positions.*got 4"):
        exported(short)  # i/n and I[i=n-1] at n=4 differ from the table built for n=6: refused, not wrong
    with torch.no_grad():
        assert (model(tokens_for(model.cfg, 6)) - exported(tokens_for(model.cfg, 6))).abs().max() < 1e-9


@pytest.mark.parametrize("target", TARGET_PARAMS)
def test_export_does_not_move_the_global_rng(target: str) -> None:
    model = build(CASES["preLN_causal_relu_learned_f32"]["cfg"], 1.0)
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    EXPORTS[target](model)
    assert torch.equal(torch.rand(3), expected)


@pytest.mark.parametrize("target", TARGET_PARAMS)
def test_exact_transformer_methods_delegate(target: str) -> None:
    model = build(CASES["preLN_causal_relu_learned_f32"]["cfg"], 1.0)
    exported = getattr(model, f"to_{target}")()
    tokens = tokens_for(model.cfg, 5)
    with torch.no_grad():
        assert_close(model(tokens), exported(tokens), "float32", "logits")


# ---- what cannot be exported ------------------------------------------------

UNSUPPORTED = [
    (dict(normalization="post"), "normalization='post'"),
    (dict(attention_weighting="average_hard"), "attention_weighting='average_hard'"),
    (dict(attention_weighting="unique_hard_left"), "attention_weighting='unique_hard_left'"),
    (dict(attention_weighting="none"), "attention_weighting='none'"),
    (dict(attn_length_scale="log_n"), "attn_length_scale='log_n'"),
    (dict(attn_length_scale="log_visible"), "attn_length_scale='log_visible'"),
    (dict(attention_mask="strict_causal"), "attention_mask='strict_causal'"),
    (dict(attention_mask="past"), "attention_mask='past'"),
    (dict(d_mlp=4, act_fn="identity"), "act_fn='identity'"),
    (dict(attention_mask=("causal", "none")), "attention_mask=('causal', 'none')"),
    (dict(d_mlp=4, act_fn=("relu", "gelu")), "act_fn=('relu', 'gelu')"),
    (dict(normalization="pre", ln_scale=False), "ln_scale=False"),
    (dict(normalization=("pre", "none")), "normalization=('pre', 'none')"),
    (dict(normalization="pre", ln_select=True), "ln_select=True"),
    (dict(normalization="pre", ln_final=False), "ln_final=False"),
    (dict(normalization="none", ln_final=True), "ln_final=True"),
]


@pytest.mark.parametrize("target", ["hooked_transformer", "bridge"])
@pytest.mark.parametrize(("fields", "named"), UNSUPPORTED, ids=[u[1] for u in UNSUPPORTED])
def test_export_problems_name_the_feature(target: str, fields: dict, named: str) -> None:
    cfg = ExactConfig(d_model=4, n_layers=2, d_vocab=3, positional_features=("learned",), n_ctx=4, **fields)
    problems = export_problems(cfg, target)
    assert len(problems) == 1 and named in problems[0], problems
    assert "allowed" in problems[0]


@pytest.mark.parametrize("target", ["hooked_transformer", "bridge"])
def test_per_layer_values_that_agree_export(target: str) -> None:
    cfg = ExactConfig(
        d_model=4,
        n_layers=2,
        d_vocab=3,
        d_mlp=4,
        positional_features=("learned",),
        n_ctx=4,
        attention_mask=("causal", "causal"),
        act_fn=("gelu", "gelu"),
        normalization=("pre", "pre"),
    )
    assert export_problems(cfg, target) == []


@pytest.mark.parametrize("target", ["hooked_transformer", "bridge"])
def test_supported_configs_have_no_problems(target: str) -> None:
    for spec in CASES.values():
        cfg = build(spec["cfg"], spec["std"]).cfg
        assert export_problems(cfg, target, spec["length"]) == []
    # identity is fine without an MLP; ln_affine=False exports w=1, b=0
    cfg = ExactConfig(
        d_model=4,
        n_layers=1,
        d_vocab=3,
        act_fn="identity",
        normalization="pre",
        ln_affine=False,
        positional_features=("learned",),
        n_ctx=4,
    )
    assert export_problems(cfg, target) == []


def test_rms_float64_only_a_problem_for_the_bridge() -> None:
    cfg = ExactConfig(
        d_model=4,
        n_layers=1,
        d_vocab=3,
        normalization="pre",
        ln_center=False,
        dtype="float64",
        positional_features=("learned",),
        n_ctx=4,
    )
    assert export_problems(cfg, "hooked_transformer") == []
    (problem,) = export_problems(cfg, "bridge")
    assert "ln_center=False" in problem and "float64" in problem


@pytest.mark.parametrize("target", ["hooked_transformer", "bridge"])
def test_features_need_a_length(target: str) -> None:
    cfg = ExactConfig(d_model=4, n_layers=1, d_vocab=3, positional_features=("i/n",))
    (problem,) = export_problems(cfg, target)
    assert "length" in problem and "i/n" in problem
    assert export_problems(cfg, target, length=5) == []
    learned = ExactConfig(d_model=4, n_layers=1, d_vocab=3, positional_features=("learned",), n_ctx=4)
    (problem,) = export_problems(learned, target, length=5)
    assert "n_ctx=4" in problem


def test_unknown_target() -> None:
    cfg = ExactConfig(d_model=4, n_layers=1, d_vocab=3, positional_features=("learned",), n_ctx=4)
    with pytest.raises(ExactLensError, match="hooked_transformer, bridge"):
        export_problems(cfg, "huggingface")


def test_export_lists_all_problems_at_once() -> None:
    model = ExactTransformer(
        ExactConfig(
            d_model=4,
            n_layers=1,
            d_vocab=3,
            normalization="post",
            attention_weighting="average_hard",
            attn_length_scale="log_n",
            attention_mask="strict_causal",
            positional_features=("i/n",),
        )
    )
    with pytest.raises(ExactLensError) as info:
        EXPORTS[INSTALLED_TARGET](model)
    message = str(info.value)
    for named in ("normalization='post'", "average_hard", "log_n", "strict_causal", "length"):
        assert named in message, message


def test_the_other_major_version_is_refused() -> None:
    model = build(CASES["preLN_causal_relu_learned_f32"]["cfg"], 1.0)
    with pytest.raises(ExactLensError, match=f"use to_{INSTALLED_TARGET}"):
        EXPORTS[OTHER_TARGET](model)


RMS_F64 = dict(
    normalization="pre",
    ln_center=False,
    attention_mask="causal",
    d_mlp=8,
    act_fn="relu",
    dtype="float64",
    positional_features=("learned",),
    n_ctx=6,
)


@needs_ht
def test_rms_float64_exports_to_hooked_transformer() -> None:
    model = build(RMS_F64, 1.0)
    assert model.blocks[0].ln1.b.abs().max() > 0.1  # the LN biases are folded into b_Q/b_K/b_V, b_in, b_U
    exported = to_hooked_transformer(model)
    tokens = tokens_for(model.cfg, 6)
    with torch.no_grad():
        ours, our_cache = model.run_with_cache(tokens)
        theirs, their_cache = exported.run_with_cache(tokens)
    assert_close(ours, theirs, "float64", "logits")
    for name in compared_hooks(model.cfg):
        assert_close(our_cache[name], their_cache[name], "float64", name)


@needs_bridge
def test_rms_float64_is_refused_by_the_bridge() -> None:
    with pytest.raises(ExactLensError, match="RMSNorm computes in float32"):
        to_bridge(build(RMS_F64, 1.0))


@needs_bridge
def test_bridge_divisor_one_is_moved_into_W_Q() -> None:
    spec = CASES["noLN_causal_attnonly_f64_scale1"]
    model = build(spec["cfg"], spec["std"])
    bridge = to_bridge(model, length=spec["length"])
    tokens = tokens_for(model.cfg, spec["n_pos"])
    with torch.no_grad():
        _, ours = model.run_with_cache(tokens)
        _, theirs = bridge.run_with_cache(tokens)
    assert_close(2 * ours["blocks.0.attn.hook_q"], theirs["blocks.0.attn.hook_q"], "float64", "hook_q")
    assert_close(ours["blocks.0.attn.hook_k"], theirs["blocks.0.attn.hook_k"], "float64", "hook_k")
    assert_close(ours["blocks.0.attn.hook_pattern"], theirs["blocks.0.attn.hook_pattern"], "float64", "pattern")

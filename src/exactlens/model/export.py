"""Exports of an ExactTransformer to TransformerLens's own model classes.

Two targets, one per TransformerLens major version:

* ``"hooked_transformer"`` (TransformerLens < 4): a ``HookedTransformer`` built
  from a ``HookedTransformerConfig`` with the weights loaded into it.
* ``"bridge"`` (TransformerLens >= 4): a ``TransformerBridge`` built with
  ``TransformerBridge.boot_native`` around TransformerLens's native pre-LN
  model, with the weights converted by
  ``transformer_lens.utilities.tl_checkpoint_conversion.convert_tl_checkpoint``.

Both are plain pre-LN (or normalization-free) softmax transformers with learned
position tables, so only the part of :class:`ExactConfig` they can express is
exported; :func:`export_problems` lists every feature of a model that a target
cannot express, and the exports raise :class:`ExactLensError` listing all of
them at once. The exported model keeps the dtype (float32 or float64) and is
returned in eval mode; its ``forward(tokens)`` gives the same logits as ours
(for a sigmoid readout: the logits before the sigmoid).

Positions. A learned table ``pos_embed.W_pos`` is exported as it is (its first
``length`` rows if ``length`` is given). Positional *features* of (i, n) are
materialized at one length: the exported table is
``evaluate_features(names, length, [length])[0] @ W_feat`` with
``n_ctx = length``. The exported model is therefore only equivalent to ours on
inputs of exactly ``length`` positions (features that do not depend on n, such
as ``i`` or sinusoids, also agree on shorter inputs, but features such as
``i/n`` or ``I[i=n-1]`` do not). Our ``n_positions`` (right padding) has no
counterpart: pass unpadded sequences of ``length`` positions.

Conversions that keep the function but move a number from one weight to another:

* RMS normalization (``ln_center=False``): TransformerLens's RMSNorm has a gain
  and no bias, so a nonzero LN bias ``b`` is folded into the biases of what
  reads the normalized stream (``b_Q, b_K, b_V += b @ W``; ``b_in += b @ W_in``;
  ``b_U += b @ W_U``). The LN output hooks then exclude ``b``.
* Bridge only: the native attention refuses a divisor of 1.0 when
  ``d_head > 1``; such a model is exported with divisor 2.0 and ``W_Q, b_Q``
  doubled (both exact in floating point, so the scores are bit-identical), and
  the bridge's ``hook_q`` is then twice ours.

Hook names agree for ``hook_embed``, ``hook_pos_embed``,
``blocks.{l}.hook_resid_pre/mid/post``, ``hook_attn_out``, ``hook_mlp_out``,
``attn.hook_q/k/v/z``, ``attn.hook_pattern`` and ``mlp.hook_pre/post``. The
bridge's ``attn.hook_attn_scores`` is the post-softmax pattern (ours and
HookedTransformer's are the pre-softmax scores); never call the bridge's
``enable_compatibility_mode()`` on an export, it processes the weights.
"""

from __future__ import annotations

import math
import warnings
from importlib import metadata
from typing import Any

import torch

from exactlens.errors import ExactLensError
from exactlens.model.config import ExactConfig
from exactlens.model.positional import evaluate_features

# A model here is an ExactTransformer, annotated as its base class torch.nn.Module: exactlens.model.transformer
# imports this module, so this one does not import it.

TARGETS = ("hooked_transformer", "bridge")
TARGET_NAMES = {
    "hooked_transformer": "HookedTransformer (TransformerLens < 4)",
    "bridge": "TransformerBridge (TransformerLens >= 4)",
}


def transformer_lens_major() -> int:
    """The major version of the installed TransformerLens."""
    try:
        version = metadata.version("transformer-lens")
    except metadata.PackageNotFoundError:  # pragma: no cover - TL is a dependency
        import transformer_lens

        version = getattr(transformer_lens, "__version__", "0")
    head = version.split(".")[0]
    return int(head) if head.isdigit() else 0


def _config_of(model: Any) -> ExactConfig:
    cfg = model if isinstance(model, ExactConfig) else getattr(model, "cfg", None)
    if not isinstance(cfg, ExactConfig):
        raise ExactLensError(f"expected an ExactTransformer (or ExactConfig), got {type(model).__name__}")
    return cfg


def _bridge_rejects_scale(cfg: ExactConfig) -> bool:
    """TL 4's native attention refuses a divisor close to 1.0 when d_head > 1."""
    return cfg.d_head > 1 and math.isclose(cfg.scale_divisor, 1.0, abs_tol=1e-9)


def export_problems(model: Any, target: str, length: int | None = None) -> list[str]:
    """Every feature of the model that ``target`` cannot express, one sentence each.

    ``target`` is ``"hooked_transformer"`` (TransformerLens < 4) or ``"bridge"``
    (TransformerLens >= 4). ``model`` may be an ExactTransformer or its
    ExactConfig. ``length`` is the number of positions the export is built for
    (needed for positional features of (i, n)); an empty list means the export
    is possible.
    """
    if target not in TARGETS:
        raise ExactLensError(f"target={target!r} is not an export target; choose one of {', '.join(TARGETS)}")
    cfg = _config_of(model)
    name = TARGET_NAMES[target]
    problems: list[str] = []
    norm = cfg.uniform("normalization")
    if norm is None:
        problems.append(
            f"normalization={cfg.normalization!r} (different per layer) cannot be exported: {name} has one "
            "normalization for all layers; allowed: one of 'pre' or 'none' for every layer"
        )
    if "post" in cfg.per_layer("normalization"):
        problems.append(
            f"normalization='post' (post-LN) cannot be exported: {name} blocks are pre-LN; "
            "allowed: normalization='pre' or 'none'"
        )
    if cfg.uniform("attention_weighting") != "softmax":
        problems.append(
            f"attention_weighting={cfg.attention_weighting!r} cannot be exported: {name} attention is softmax; "
            "allowed: attention_weighting='softmax'"
        )
    if cfg.uniform("attn_length_scale") != "none":
        problems.append(
            f"attn_length_scale={cfg.attn_length_scale!r} cannot be exported: {name} scores are divided by a "
            "constant only; allowed: attn_length_scale='none'"
        )
    if cfg.uniform("attention_mask") not in ("none", "causal"):
        problems.append(
            f"attention_mask={cfg.attention_mask!r} cannot be exported: {name} attention is causal or "
            "bidirectional in every layer alike; allowed: attention_mask='causal' or 'none'"
        )
    if cfg.d_mlp > 0 and cfg.uniform("act_fn") not in ("relu", "gelu"):
        problems.append(
            f"act_fn={cfg.act_fn!r} cannot be exported: {name} has one activation for all layers and no "
            "identity; allowed: act_fn='relu' or 'gelu'"
        )
    if cfg.d_mlp > 0 and not cfg.mlp_residual:
        problems.append(
            f"mlp_residual=False (an FFN whose output replaces the stream) cannot be exported: {name} FFNs "
            "always add to the residual stream; allowed: mlp_residual=True"
        )
    if norm is not None and not cfg.standard_final_ln:
        problems.append(
            f"ln_final={cfg.ln_final!r} with normalization={norm!r} cannot be exported: {name} has a final LN "
            "exactly when its blocks are pre-LN; allowed: ln_final=None (the standard choice)"
        )
    if cfg.ln_select:
        problems.append(
            f"ln_select=True (LN(x @ W_select), Cookbook §5.3.3) cannot be exported: {name} layer norms read "
            "the residual stream itself; allowed: ln_select=False"
        )
    if norm != "none" and not cfg.ln_scale:
        problems.append(
            f"ln_scale=False (layer norm without its scaling) cannot be exported: {name} normalizations "
            "always scale; allowed: ln_scale=True"
        )
    if target == "bridge" and norm == "pre" and not cfg.ln_center and cfg.dtype == "float64":
        problems.append(
            "normalization='pre' with ln_center=False (RMS) in dtype='float64' cannot be exported: the bridge's "
            "RMSNorm computes in float32, so the export would lose float64 precision; allowed: ln_center=True "
            "(LayerNorm) or dtype='float32'"
        )
    if cfg.learned_positions:
        if length is not None and not 1 <= length <= cfg.n_ctx:
            problems.append(
                f"length={length} does not fit the learned positional table: allowed: 1 <= length <= n_ctx={cfg.n_ctx}"
            )
    elif length is None:
        features = ", ".join(cfg.positional_features) if cfg.positional_features else "no positional features"
        problems.append(
            f"positional_features ({features}) are exported as a table for one sequence length: pass length "
            "(the number of positions, >= 1); the export is equivalent only at that length"
        )
    elif not (isinstance(length, int) and length >= 1):
        problems.append(f"length={length!r} is not a number of positions; allowed: an integer >= 1")
    return problems


def _raise_problems(problems: list[str], target: str) -> None:
    if problems:
        items = "; ".join(f"({k}) {p}" for k, p in enumerate(problems, 1))
        raise ExactLensError(f"cannot export to {TARGET_NAMES[target]}: {items}")


def exported_state_dict(model: torch.nn.Module, length: int | None = None) -> tuple[dict[str, torch.Tensor], int]:
    """HookedTransformer-format weights of the export and its n_ctx.

    The positional table is materialized (see the module docstring); for RMS
    normalization the LN biases are folded into the following biases and
    dropped, since TransformerLens's RMSNorm has no bias.
    """
    cfg = model.cfg
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    if cfg.learned_positions:
        n_ctx = cfg.n_ctx if length is None else length
        state["pos_embed.W_pos"] = state["pos_embed.W_pos"][:n_ctx].clone()
    else:
        assert length is not None
        n_ctx = length
        w_feat = state.pop("pos_embed.W_feat")
        feats = evaluate_features(cfg.positional_features, length, torch.tensor([length]), w_feat.dtype)[0]
        state["pos_embed.W_pos"] = (
            feats @ w_feat if feats.shape[-1] else torch.zeros(length, cfg.d_model, dtype=w_feat.dtype)
        )
    if cfg.uniform("normalization") == "pre" and not cfg.ln_center:
        for layer in range(cfg.n_layers):
            pre = f"blocks.{layer}."
            b1 = state.pop(pre + "ln1.b")
            for x in ("Q", "K", "V"):
                state[pre + f"attn.b_{x}"] = state[pre + f"attn.b_{x}"] + torch.einsum(
                    "m,hmd->hd", b1, state[pre + f"attn.W_{x}"]
                )
            if cfg.d_mlp > 0:
                b2 = state.pop(pre + "ln2.b")
                state[pre + "mlp.b_in"] = state[pre + "mlp.b_in"] + b2 @ state[pre + "mlp.W_in"]
        bf = state.pop("ln_final.b")
        state["unembed.b_U"] = state["unembed.b_U"] + bf @ state["unembed.W_U"]
    return state, n_ctx


def _normalization_type(cfg: ExactConfig) -> str | None:
    if cfg.uniform("normalization") == "pre":
        return "LN" if cfg.ln_center else "RMS"
    return None


def _common_fields(cfg: ExactConfig, n_ctx: int) -> dict[str, Any]:
    return dict(
        d_model=cfg.d_model,
        d_head=cfg.d_head,
        n_heads=cfg.n_heads,
        n_layers=cfg.n_layers,
        n_ctx=n_ctx,
        d_vocab=cfg.d_vocab,
        d_vocab_out=cfg.d_vocab_out,
        d_mlp=cfg.d_mlp if cfg.d_mlp > 0 else None,
        attn_only=cfg.d_mlp == 0,
        act_fn=cfg.uniform("act_fn") if cfg.d_mlp > 0 else "relu",
        normalization_type=_normalization_type(cfg),
        eps=cfg.ln_eps,
        attention_dir="causal" if cfg.uniform("attention_mask") == "causal" else "bidirectional",
        use_attn_scale=True,
        positional_embedding_type="standard",
        default_prepend_bos=False,
        init_weights=False,
        dtype=cfg.torch_dtype,
        model_name=cfg.model_name,
    )


def export_positions(model: torch.nn.Module, length: int | None = None, positions: int | None = None,
                     symbols: int | None = None) -> int | None:
    """The number of positions an export is built for, from ``positions`` (``length`` is its older name:
    positions, special tokens included) or ``symbols`` (a word's length: the task's [CLS]/[EOS] are added)."""
    given = {k: v for k, v in (("length", length), ("positions", positions), ("symbols", symbols)) if v is not None}
    if len(given) > 1:
        raise ExactLensError(f"give one of positions= (length=, its older name) or symbols=, got {sorted(given)}")
    if symbols is None:
        return positions if positions is not None else length
    if isinstance(symbols, bool) or not isinstance(symbols, int) or symbols < 0:
        raise ExactLensError(f"symbols= is a word length (an integer >= 0), got {symbols!r}")
    if model.cfg.task is None:
        raise ExactLensError("symbols= needs the model's task (cfg.task) to add its special tokens; give positions=")
    from exactlens import tasks

    return symbols + tasks.of_model(model).n_specials


def guard_positions(exported: Any, model: torch.nn.Module, n_ctx: int) -> Any:
    """An export of positional features (a table for one length) refuses tokens of a number of positions at
    which the table's rows differ from the features (e.g. i/n), which it would answer silently wrong; shorter
    inputs whose features do not depend on n (e.g. I[i=1]) are kept."""
    cfg = model.cfg
    if cfg.learned_positions:
        return exported
    names = cfg.positional_features
    dtype = torch.float64
    table = evaluate_features(names, n_ctx, torch.tensor([n_ctx]), dtype)[0]
    exact_at = {m for m in range(1, n_ctx + 1)
                if torch.equal(evaluate_features(names, m, torch.tensor([m]), dtype)[0], table[:m])}

    def check(module: Any, args: tuple) -> None:
        tokens = args[0] if args else None
        if isinstance(tokens, torch.Tensor) and tokens.shape[-1] not in exact_at:
            raise ExactLensError(
                f"this export of {cfg.model_name} holds its positional features ({', '.join(names)}) for {n_ctx} "
                f"positions (special tokens included), got {tokens.shape[-1]}, where they differ: export again with "
                f"positions= (or symbols=) for that length (exact here at {sorted(exact_at)} positions)")

    exported.register_forward_pre_hook(check)
    return exported


def to_hooked_transformer(model: torch.nn.Module, length: int | None = None, *, positions: int | None = None,
                          symbols: int | None = None) -> Any:
    """A TransformerLens < 4 ``HookedTransformer`` computing the same logits.

    ``positions`` (``length``, its older name): number of positions the export is built for, special tokens
    included; or ``symbols``: a word's length, the task's special tokens added (one of them is required for
    positional features of (i, n); the export is then equivalent only at exactly that length, and refuses
    tokens of another length). Raises ExactLensError listing every unsupported feature.
    """
    length = export_positions(model, length, positions, symbols)
    major = transformer_lens_major()
    if major >= 4:
        raise ExactLensError(
            f"to_hooked_transformer needs TransformerLens < 4 (HookedTransformer), but TransformerLens {major}.x is "
            "installed; use to_bridge (a TransformerBridge) instead"
        )
    _raise_problems(export_problems(model, "hooked_transformer", length), "hooked_transformer")
    from transformer_lens import HookedTransformer, HookedTransformerConfig

    cfg = model.cfg
    state, n_ctx = exported_state_dict(model, length)
    fields = _common_fields(cfg, n_ctx)
    fields.update(attn_scale=cfg.scale_divisor, device="cpu")
    with torch.random.fork_rng(devices=[]), warnings.catch_warnings():  # keep the caller's RNG where it was
        warnings.filterwarnings("ignore", message="HookedTransformer is deprecated", category=DeprecationWarning)
        tl_model = HookedTransformer(HookedTransformerConfig(**fields))
    target = tl_model.state_dict()
    missing = sorted(k for k in target if k not in state and not k.endswith((".mask", ".IGNORE")))
    unexpected = sorted(k for k in state if k not in target)
    if missing or unexpected:  # pragma: no cover - a mismatch is a bug in this module
        raise ExactLensError(f"internal export error: missing {missing}, unexpected {unexpected}")
    for key, value in state.items():
        if target[key].shape != value.shape:  # pragma: no cover
            raise ExactLensError(f"internal export error: {key} {tuple(value.shape)} vs {tuple(target[key].shape)}")
        target[key] = value.to(target[key].dtype)
    tl_model.load_state_dict(target, strict=True)
    return guard_positions(tl_model.eval(), model, n_ctx)


def to_bridge(model: torch.nn.Module, length: int | None = None, *, positions: int | None = None,
              symbols: int | None = None) -> Any:
    """A TransformerLens >= 4 ``TransformerBridge`` computing the same logits.

    Built with ``TransformerBridge.boot_native`` and loaded with
    ``convert_tl_checkpoint``. ``positions``/``length``/``symbols`` as for :func:`to_hooked_transformer`.
    Raises ExactLensError listing every unsupported feature. Do not call the
    bridge's ``enable_compatibility_mode()``: it would process (fold, center)
    the weights.
    """
    major = transformer_lens_major()
    if major < 4:
        raise ExactLensError(
            f"to_bridge needs TransformerLens >= 4 (TransformerBridge.boot_native), but TransformerLens {major}.x is "
            "installed; use to_hooked_transformer (a HookedTransformer) instead"
        )
    length = export_positions(model, length, positions, symbols)
    _raise_problems(export_problems(model, "bridge", length), "bridge")
    from transformer_lens.config import TransformerBridgeConfig
    from transformer_lens.model_bridge import TransformerBridge
    from transformer_lens.model_bridge.sources import boot_native
    from transformer_lens.utilities.tl_checkpoint_conversion import convert_tl_checkpoint

    cfg = model.cfg
    state, n_ctx = exported_state_dict(model, length)
    divisor = cfg.scale_divisor
    if _bridge_rejects_scale(cfg):
        divisor *= 2.0
        for layer in range(cfg.n_layers):
            for key in (f"blocks.{layer}.attn.W_Q", f"blocks.{layer}.attn.b_Q"):
                state[key] = state[key] * 2.0
    fields = _common_fields(cfg, n_ctx)
    fields.update(attn_scale=divisor, architecture="TransformerLensNative")
    tl_cfg = TransformerBridgeConfig(**fields)
    with torch.random.fork_rng(devices=[]):
        bridge = boot_native(tl_cfg, dtype=cfg.torch_dtype, device="cpu", model_name=cfg.model_name)
    assert isinstance(bridge, TransformerBridge)
    converted = convert_tl_checkpoint(state, tl_cfg)
    result = bridge.load_state_dict(converted, strict=True)
    if getattr(result, "missing_keys", None) or getattr(result, "unexpected_keys", None):  # pragma: no cover
        raise ExactLensError(f"internal export error: {result}")
    return guard_positions(bridge.eval(), model, n_ctx)

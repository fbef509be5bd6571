"""A model in another residual basis: the same function, every residual vector rotated.

``rotate_residual(model, Q)`` returns a copy whose residual stream is x Q wherever the original's
is x (Q orthogonal, d_model x d_model): writers to the stream (embeddings, W_O, b_O, W_out, b_out,
layer-norm biases) are multiplied by Q on the right, readers (W_Q, W_K, W_V, W_in, W_U, a layer
norm's selector) by Q^T on the left. Outputs and attention patterns are unchanged; every
residual-stream activation is the original's times Q. Such a copy is the test of a method that
claims to find *where* a model keeps a variable without assuming the basis: probes and
distributed alignment search must score it as the original.

Layer norm commutes with the rotation when (Brody et al. 2023 §3: LN = projection onto the
complement of the all-ones vector 1, then scaling) the rotation maps 1 to 1 (centering) and the
gains are one number (``w`` uniform): ``random_rotation(d, fix_ones=True)`` draws such a Q.
Anything else is refused with the reason.
"""

from __future__ import annotations

import torch

from exactlens.errors import ExactLensError
from exactlens.model.config import ExactConfig
from exactlens.model.transformer import ExactTransformer

WRITERS = ("embed.W_E", "pos_embed.W_feat", "pos_embed.W_pos", "attn.W_O", "attn.b_O", "mlp.W_out", "mlp.b_out")
READERS = ("attn.W_Q", "attn.W_K", "attn.W_V", "mlp.W_in", "unembed.W_U")
APART = ("attn.b_Q", "attn.b_K", "attn.b_V", "mlp.b_in", "unembed.b_U")  # live in head / hidden / output space


def random_rotation(d: int, generator: torch.Generator | None = None, *, fix_ones: bool = False,
                    dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """A Haar-random orthogonal d x d matrix; ``fix_ones``: one that maps the all-ones vector to itself
    (a random rotation of the complement of 1), which layer norm's centering commutes with."""
    if not isinstance(d, int) or d < 1:
        raise ExactLensError(f"d must be an integer >= 1, got {d!r}")
    if not fix_ones or d == 1:
        return _haar(d, generator).to(dtype)
    # An orthonormal basis B whose first column is 1/sqrt(d); Q = B diag(1, Haar(d-1)) B^T fixes 1.
    ones = torch.ones(d, 1, dtype=torch.float64) / d**0.5
    basis, _ = torch.linalg.qr(torch.cat([ones, torch.eye(d, dtype=torch.float64)[:, : d - 1]], 1))
    inner = torch.eye(d, dtype=torch.float64)
    inner[1:, 1:] = _haar(d - 1, generator)
    return (basis @ inner @ basis.T).to(dtype)


def _haar(d: int, generator: torch.Generator | None) -> torch.Tensor:
    q, r = torch.linalg.qr(torch.randn(d, d, generator=generator, dtype=torch.float64))
    return q * torch.sign(torch.diagonal(r))  # sign fix: Haar measure (Mezzadri 2007)


def rotate_residual(model: ExactTransformer, rotation: torch.Tensor, *, tie_tolerance: float | None = None
                    ) -> ExactTransformer:
    """A copy of ``model`` computing the same function in the residual basis x -> x Q.

    Hard attention picks the maximal scores; scores that tie exactly in the original (the
    constructions rely on such ties) differ by rounding after a rotation, so a model with hard
    attention gets ``hard_tie_tolerance`` = ``tie_tolerance`` (default: 1e-9 in float64, 1e-4 in
    float32; never below the model's own), recorded in its metadata."""
    cfg = model.cfg
    d = cfg.d_model
    q = torch.as_tensor(rotation, dtype=torch.float64)
    if q.shape != (d, d):
        raise ExactLensError(f"the rotation must be d_model x d_model = {d} x {d}, got {tuple(q.shape)}")
    if not torch.allclose(q @ q.T, torch.eye(d, dtype=torch.float64), atol=1e-10):
        raise ExactLensError("the rotation must be orthogonal (Q Q^T = I)")
    state = model.state_dict()
    roles = residual_roles(model)
    for name, value in state.items():
        if not name.endswith(".w") or roles[name] == "selected":
            continue
        if not torch.all(value == value.reshape(-1)[0]):
            raise ExactLensError(f"{name}: layer-norm gains differ across dimensions; a rotation does not commute "
                                 "with them")
        if cfg.ln_center and not torch.allclose(torch.ones(d, dtype=torch.float64) @ q,
                                                torch.ones(d, dtype=torch.float64), atol=1e-10):
            raise ExactLensError("the model has layer norm with centering: the rotation must map the all-ones vector "
                                 "to itself (random_rotation(d, fix_ones=True))")
    rotate = {"writer": lambda v: v @ q, "reader": lambda v: q.T @ v, "absorbed selector": lambda v: q.T @ v,
              "selector": lambda v: q.T @ v @ q, "selected": lambda v: v, "apart": lambda v: v}
    new_state = {name: rotate[roles[name]](value.double()).to(value.dtype) for name, value in state.items()}
    copy = ExactTransformer(ExactConfig.from_dict(cfg.to_dict()))
    if any(w != "softmax" and "hard" in w for w in cfg.per_layer("attention_weighting")):
        default = 1e-9 if cfg.dtype == "float64" else 1e-4
        copy.cfg.hard_tie_tolerance = max(cfg.hard_tie_tolerance, default if tie_tolerance is None else tie_tolerance)
        copy.cfg.metadata["hard_tie_tolerance_after_rotation"] = copy.cfg.hard_tie_tolerance
    copy.load_state_dict(new_state)
    copy.cfg.metadata["rotated_residual"] = True
    copy.cfg.residual_labels = None
    return copy.train(model.training)


def residual_roles(model: ExactTransformer) -> dict[str, str]:
    """How each parameter meets the residual stream, by name: "writer" (its last axis is the residual:
    embeddings, W_O, b_O, W_out, b_out, layer-norm biases), "reader" (its second-to-last axis is: W_Q, W_K,
    W_V, W_in, W_U), "selector" (a layer norm's W_select), "absorbed selector" and "selected" (a pre-LN
    layer norm with a selector and what reads its output: the selected space, not the residual), "apart"
    (gains and the biases of head, hidden and output spaces). Anything else is an error."""
    cfg, d = model.cfg, model.cfg.d_model
    norms = cfg.per_layer("normalization")
    # A pre-LN layer norm with a selector reads x W_select: a rotation is absorbed there
    # (W_select -> Q^T W_select) and the norm and its readers stay in the unrotated selected space.
    absorbed = {f"blocks.{layer}." for layer, norm in enumerate(norms) if norm == "pre" and cfg.ln_select}
    state = model.state_dict()
    roles = {}
    for name, value in state.items():
        block = next((b for b in absorbed if name.startswith(b)), None)
        if block is not None and name.endswith("W_select"):
            roles[name] = "absorbed selector"
        elif block is not None and (
            name.endswith((".w", ".b"))
            or (name.endswith(("attn.W_Q", "attn.W_K", "attn.W_V")) and f"{block}ln1.w" in state)
            or (name.endswith("mlp.W_in") and f"{block}ln2.w" in state)
        ):
            roles[name] = "selected"
        elif name.endswith(WRITERS) or name.endswith(".b"):
            roles[name] = "writer"
        elif name.endswith(READERS):
            roles[name] = "reader"
        elif name.endswith("W_select"):
            roles[name] = "selector"
        elif name.endswith((".w", *APART)) or d not in value.shape:
            roles[name] = "apart"
        else:
            raise ExactLensError(f"rotate_residual does not know how parameter {name} {tuple(value.shape)} meets the "
                                 "residual stream")
    return roles


def residual_rows(model: ExactTransformer) -> dict[str, torch.Tensor]:
    """Each writer's rows and each reader's columns (:func:`residual_roles`) as vectors of the residual space,
    [n, d_model] float64, by parameter name. For a copy in another basis, ``rotate_residual(model, Q)``, each is
    the original's times Q: with the activations they pin Q down on every direction the model writes or reads,
    where the activations of a few words may span less (tracr-shuffle_dyck's words of lengths 4 and 6: the
    length one-hot takes two values, and 'token is (' plus 'token is )' equals a sum of other labels there)."""
    d = model.cfg.d_model
    out = {}
    for name, role in residual_roles(model).items():
        value = model.state_dict()[name].detach().double()
        if role == "writer":
            out[name] = value.reshape(-1, d)
        elif role == "reader":
            out[name] = value.transpose(-1, -2).reshape(-1, d)
    return out

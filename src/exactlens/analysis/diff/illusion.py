"""The interpretability-illusion check on a DAS subspace (Makelov, Lange & Nanda 2023).

A learned subspace Q can give the counterfactual answer without the model computing the variable
there: Q = (a + b)/sqrt 2 with a *dormant* direction a (it varies with the variable on the data but
nothing later reads it) and a *disconnected* direction b (later components read it, but it does
not vary at this site). Patching along Q moves b by half of a's difference, which the readers of b
turn into the counterfactual answer, though neither direction alone carries the variable causally.

The check splits Q into

* its part in the subspace where the site's activations *vary* on the data (the span of the
  centred activations at the patched positions; singular values below VARY_TOL of the largest
  count as none), and
* its part in the subspace that *later components read*: the column spaces of the downstream
  W_Q, W_K, W_V (of the site's own layer when the site is its residual input), W_in and W_U. With a
  layer norm downstream every centred direction is read through the norm's scale, so the read part
  is then all of Q but the all-ones direction (the check cannot split there);

and re-scores the test IIA with a projector onto each part alone. A row whose IIA needs both parts
(neither part alone reaches the "computed" IIA) is flagged ``illusion suspected``.
"""

from __future__ import annotations

from typing import Any

import torch

VARY_TOL = 1e-5  # relative singular value below which a direction does not vary on the data
READ_TOL = 1e-9  # relative singular value below which a reader matrix does not read a direction


def orthonormal_basis(matrix: torch.Tensor, tol: float) -> torch.Tensor:
    """[d, r] orthonormal basis of the column space of ``matrix`` [d, m] (relative tolerance)."""
    if matrix.numel() == 0:
        return matrix.new_zeros(matrix.shape[0], 0)
    u, s, _ = torch.linalg.svd(matrix, full_matrices=False)
    if not len(s) or float(s[0]) == 0.0:
        return matrix.new_zeros(matrix.shape[0], 0)
    return u[:, s > tol * s[0]]


def subspace_of(projector: torch.Tensor) -> torch.Tensor:
    """[d, k] orthonormal basis of a projector's range."""
    values, vectors = torch.linalg.eigh(projector.double())
    return vectors[:, values > 0.5]


def varying_basis(acts: list[torch.Tensor]) -> torch.Tensor:
    """The span of the centred activations [N, d] at the patched positions."""
    x = torch.cat([a.reshape(-1, a.shape[-1]) for a in acts]).double()
    return orthonormal_basis((x - x.mean(0)).T, VARY_TOL)


def read_basis(model: Any, site: str) -> torch.Tensor | None:
    """The directions later components read at ``site`` (module docstring); None for a model whose
    weights are not an ExactTransformer's."""
    from exactlens.model import ExactTransformer

    if not isinstance(model, ExactTransformer):
        return None
    layer, kind = int(site.split(".")[1]), site.split(".")[-1]
    cfg = model.cfg
    d = cfg.d_model
    first_attention = layer if kind == "hook_resid_pre" else layer + 1
    first_mlp = layer if kind in ("hook_resid_pre", "hook_attn_out", "hook_resid_mid") else layer + 1
    norms = cfg.per_layer("normalization")
    if any(norms[i] != "none" for i in range(min(first_attention, first_mlp), cfg.n_layers)) or cfg.ln_final:
        eye = torch.eye(d, dtype=torch.float64)
        return eye - 1.0 / d if cfg.ln_center else eye  # every (centred) direction is read through the norm
    readers = []
    for i in range(cfg.n_layers):
        block = model.blocks[i]
        if i >= first_attention:
            for name in ("W_Q", "W_K", "W_V"):
                w = getattr(block.attn, name).detach().double()  # [heads, d, d_head]
                readers.append(w.permute(1, 0, 2).reshape(d, -1))
        if i >= first_mlp and block.mlp is not None:
            readers.append(block.mlp.W_in.detach().double())
    readers.append(model.unembed.W_U.detach().double())
    bases = [orthonormal_basis(w, READ_TOL) for w in readers]
    return orthonormal_basis(torch.cat(bases, 1), 1e-9)


def split_projectors(projector: torch.Tensor, vary: torch.Tensor, read: torch.Tensor) -> torch.Tensor:
    """[2, d, d]: projectors onto the span of Q's part in the varying subspace and in the read subspace."""
    q = subspace_of(projector)
    out = []
    for basis in (vary, read):
        part = basis @ (basis.T @ q)  # Q projected into the subspace
        b = orthonormal_basis(part, 1e-6)
        out.append(b @ b.T)
    return torch.stack(out).to(projector.dtype)


def verdict(full: float | None, varying: float | None, read: float | None, threshold: float) -> dict[str, Any]:
    parts = [v for v in (varying, read) if v is not None]
    suspected = bool(full is not None and full >= threshold and parts and max(parts) < threshold)
    return {"iia_varying_part": varying, "iia_read_part": read, "suspected": suspected}

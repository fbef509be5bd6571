"""Running a model with rows patched at one site: the interchange h + ((h_src - h) Q) Q^T."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from exactlens.analysis.diff.alignment.pairs import PairSet
from exactlens.analysis.diff.interventions import copies_per_pass
from exactlens.analysis.diff.runs import LengthRun, Side
from exactlens.devices import device_of
from exactlens.model import ExactTransformer

SITE_KINDS = ("hook_resid_pre", "hook_attn_out", "hook_resid_mid", "hook_mlp_out", "hook_resid_post")


def alignment_sites(side: Side) -> list[str]:
    hooks = set(getattr(side.model, "hook_dict", {}))
    names = ["blocks.0.hook_resid_pre"]
    for layer in range(side.n_layers):
        names += [f"blocks.{layer}.{kind}" for kind in SITE_KINDS[1:]]
    if not side.exact:  # edits at resid_mid of a TransformerBridge do not reach the output (runs.make_side)
        names = [n for n in names if "resid_mid" not in n]
    else:  # a layer without an FFN never runs its hook_mlp_out
        names = [n for n in names if not (n.endswith("hook_mlp_out") and side.model.blocks[layer_of(n)].mlp is None)]
    return [n for n in names if n in hooks]


def twin_sites(side: Side, sites: list[str]) -> dict[str, str]:
    """Residual sites of an ExactTransformer that hold the earlier residual site's tensor on every input, so that
    a patch there is the same intervention, mapped to the earliest site of their chain: layer L's hook_resid_mid
    after an attention that writes zero whatever its input (W_O and b_O zero), and its hook_resid_post after no
    FFN or an FFN that writes zero (W_out and b_out zero, added to the stream), with no post-norm between (a
    pre-norm feeds only the component). A compiled program's empty layers; FIRST's second FFN. Such a site's fits,
    scores and random baseline are its twin's (table._alignment_rows); its illusion check is its own."""
    if not side.exact:
        return {}
    model, out = side.model, {}
    norms = model.cfg.per_layer("normalization")
    last: str | None = "blocks.0.hook_resid_pre" if "blocks.0.hook_resid_pre" in sites else None
    # ``last``: the residual site before, in depth order, whose tensor the stream still holds (None: none does)

    def zero(*weights: torch.Tensor) -> bool:
        return not any(bool(w.detach().any()) for w in weights)

    for layer, block in enumerate(model.blocks):
        mid, post = f"blocks.{layer}.hook_resid_mid", f"blocks.{layer}.hook_resid_post"
        mlp = block.mlp
        unchanged = {mid: norms[layer] != "post" and zero(block.attn.W_O, block.attn.b_O),
                     post: norms[layer] != "post" and (mlp is None or model.cfg.mlp_residual
                                                       and zero(mlp.W_out, mlp.b_out))}
        for site, same in unchanged.items():
            if not same:  # the stream changes here: no later site is a twin of one before
                last = site if site in sites else None
            elif site in sites:
                if last is not None:
                    out[site] = out.get(last, last)
                last = site
    return out


def layer_of(site: str) -> int:
    return int(site.split(".")[1])


def hook_point(side: Side, site: str) -> str:
    """Where an ExactTransformer's patch at ``site`` is applied: layer L's ``hook_resid_post`` is layer L + 1's
    ``hook_resid_pre`` (the same tensor, nothing between them), so its patched copies skip layer L and start at
    L + 1 (not in the last layer, whose output is the unembedding's input); every other site at itself."""
    if not site.endswith("hook_resid_post") or not isinstance(side.model, ExactTransformer):
        return site
    after = layer_of(site) + 1
    return f"blocks.{after}.hook_resid_pre" if after < side.n_layers else site


class Patcher:
    """Runs a model with rows patched at one site: each row r gets h + m_r ((h_src,r - h) P_r), P_r a
    projector and m_r a 0/1 mask over positions."""

    def __init__(self, side: Side, site: str):
        self.side = side
        self.site = site
        self.model = side.model
        self.start = layer_of(site) if isinstance(self.model, ExactTransformer) else 0
        if hook_point(side, site) != site:  # a layer's output is the next layer's input: the copies start there
            self.start += 1
        self.dtype = next(self.model.parameters()).dtype

    def prepare(self, run: LengthRun, index: torch.Tensor) -> dict[str, torch.Tensor]:
        """Activations of words ``index`` of a run: the site's, and the input of the layer its copies start at."""
        names = {self.site}
        pre = f"blocks.{self.start}.hook_resid_pre"
        if self.start > 0:
            names.add(pre)
        _, cache = self.model.run_with_cache(run.tokens[index], names_filter=lambda n: n in names)
        acts = {"site": cache[self.site].detach()}
        acts["input"] = cache[pre].detach() if self.start > 0 else run.tokens[index]
        return acts

    def outputs(self, base: dict[str, torch.Tensor], source_site: torch.Tensor | dict[str, torch.Tensor],
                projector: torch.Tensor, mask: torch.Tensor, n_positions: torch.Tensor,
                row_sites: list[str] | None = None) -> torch.Tensor:
        """Task outputs of F stacked copies of the base rows, copy f patched with projector[f]
        ([F, d, d]) towards ``source_site`` at the positions of mask[f] ([F, pos]). ``row_sites``: copy
        f is patched at row_sites[f] instead of this patcher's site, towards source_site[row_sites[f]]
        (the input ``base["input"]`` is at this patcher's layer, the earliest of them). The copies run
        in passes of at most :func:`copies_per_pass` (the same outputs, in less memory)."""
        step = copies_per_pass(self.side, int(n_positions.shape[0]), int(mask.shape[1]))
        if projector.shape[0] <= step:
            return self._outputs(base, source_site, projector, mask, n_positions, row_sites)
        parts = []
        for lo in range(0, projector.shape[0], step):
            hi = min(lo + step, projector.shape[0])
            parts.append(self._outputs(base, source_site, projector[lo:hi], mask[lo:hi], n_positions,
                                       None if row_sites is None else row_sites[lo:hi]))
        return torch.cat(parts)

    def _outputs(self, base: dict[str, torch.Tensor], source_site: torch.Tensor | dict[str, torch.Tensor],
                 projector: torch.Tensor, mask: torch.Tensor, n_positions: torch.Tensor,
                 row_sites: list[str] | None = None) -> torch.Tensor:
        repeats, device = projector.shape[0], device_of(self.model)  # the patch is computed where the model runs
        mask = mask.to(device=device, dtype=self.dtype)
        projector_here = projector.to(device)
        sources = source_site if isinstance(source_site, dict) else {self.site: source_site}
        sources = {k: v.to(device=device, dtype=self.dtype) for k, v in sources.items()}
        row_sites = [self.site] * repeats if row_sites is None else row_sites

        def patch_at(site: str) -> Callable[..., torch.Tensor]:
            rows = [f for f, s in enumerate(row_sites) if s == site]
            src = sources[site]
            if len(rows) == repeats:  # every copy patched here
                def hook(act: torch.Tensor, hook: Any = None) -> torch.Tensor:
                    shaped = act.reshape(repeats, src.shape[0], *act.shape[1:])
                    delta = (src.unsqueeze(0) - shaped) @ projector_here.unsqueeze(1)
                    return (shaped + delta * mask[:, None, :, None]).reshape(act.shape)
                return hook
            index = torch.tensor(rows, device=device)
            here, keep = projector_here[index].unsqueeze(1), mask[index][:, None, :, None]

            def some(act: torch.Tensor, hook: Any = None) -> torch.Tensor:
                shaped = act.reshape(repeats, src.shape[0], *act.shape[1:])
                delta = (src.unsqueeze(0) - shaped[index]) @ here
                return shaped.index_add(0, index, delta * keep).reshape(act.shape)
            return some

        hooks = [(site, patch_at(site)) for site in dict.fromkeys(row_sites)]
        inputs = base["input"].repeat(repeats, *([1] * (base["input"].ndim - 1)))
        n_pos = n_positions.repeat(repeats)
        if not self.side.exact:
            with self.model.hooks(fwd_hooks=hooks):
                return self.side.outputs(self.model(inputs).cpu(), n_pos)
        # An ExactTransformer: the hooks go on their hook points directly (TransformerLens's hooks()
        # context resets every hook point on exit, a tenth of a fit's time). The last layer runs at the
        # readout position only, unless a site is inside that layer (its activations there would
        # cover the readout row only).
        handles = [self.model.hook_dict[hook_point(self.side, site)].register_forward_hook(
                       lambda module, args, out, fn=fn: fn(out))
                   for site, fn in hooks]
        try:
            fast = self.model.cfg.readout != "per_position" and not any(
                inside_last(self.side, site) for site, _ in hooks)
            logits = self.model(inputs, n_pos, start_at_layer=self.start or None, readout_only=fast)
        finally:
            for handle in handles:
                handle.remove()
        return self.model.select_readout(logits, n_pos.to(device)).double().cpu()


def patch_masks(side: Side, run: LengthRun, fits: list[Fit]) -> torch.Tensor:
    """[F, pos]: where each fit patches (every position, the readout position, or position p for "@p"; none
    where the run has no position p or p is its readout position)."""
    n = run.tokens.shape[1]
    readout = torch.zeros(n)
    readout[side._row(run.n_positions[:1])] = 1

    def mask(positions: str) -> torch.Tensor:
        if positions == "all":
            return torch.ones(n)
        at = position_index(positions)
        if at is None:
            return readout
        one = torch.zeros(n)
        if at < n and not bool(readout[at]):
            one[at] = 1
        return one

    return torch.stack([mask(f.positions) for f in fits])


def position_index(positions: str) -> int | None:
    """p of a fit's positions "@p" (a position-resolved variable's own position); None for "all" and "readout"."""
    return int(positions[1:]) if positions.startswith("@") else None


def span_projectors(weights: torch.Tensor, dims: torch.Tensor) -> torch.Tensor:
    """[F, d, kmax] free weights -> projectors [F, d, d] onto the span of each fit's first dims[f] columns."""
    q, _ = torch.linalg.qr(weights)
    keep = (torch.arange(weights.shape[-1]) < dims.unsqueeze(1)).to(q.dtype)  # [F, kmax]
    q = q * keep.unsqueeze(1)
    return q @ q.transpose(1, 2)


@dataclass
class Fit:
    variable: int
    dim: int
    positions: str  # "readout", "all", or "@p": token position p alone (a position-resolved variable)


def site_acts(patcher: Patcher, pset: PairSet, cache: dict) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    key = id(pset)
    if key not in cache:
        cache[key] = (patcher.prepare(pset.run, pset.base), patcher.prepare(pset.run, pset.source)["site"])
    return cache[key]


def inside_last(side: Side, site: str) -> bool:
    return layer_of(site) == side.n_layers - 1 and not site.endswith("resid_pre")


"""Where each exact variable must live in a SIIT-trained model (exactlens.train.siit): the mapping.

The high-level model is the exact construction; its variables are the DAS variables
(exactlens.analysis.diff.alignment.variables.exact_variables: a computed residual label, or a one-hot
group of them). IIT (Geiger et al. 2022) needs an alignment of each to a low-level site; here a site is
one component output of the trained model, at some positions, in a fixed coordinate subspace:

* the trained model has the construction's layers (a paper preset or a model shaped like the
  construction), so a label the exact model writes with layer L's attention (settled at
  ``blocks.L.hook_resid_mid``) lives in ``blocks.L.hook_attn_out``, one its FFN writes (settled at
  ``blocks.L.hook_resid_post``) in ``blocks.L.hook_mlp_out`` (``hook_attn_out`` in a layer without FFN);
* at the positions the label is held: ``all``, or ``readout`` (a label only the unembedding reads);
* in coordinates ``dims`` of d_model: the variables take disjoint blocks, in order, one coordinate per
  label (a one-hot group: one per member).

A user mapping (``siit_map``: a JSON file or a dict ``variable -> {"hook", "positions", "dims"}``)
replaces the derived one; the variables it leaves out are not trained by the IIT loss.
Light (no torch): checks run before any model is built.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from exactlens.errors import ExactLensError

POSITIONS = ("all", "readout")
COMPONENT = re.compile(r"^blocks\.(\d+)\.hook_(attn_out|mlp_out)$")
SiteMap = dict[str, dict[str, Any]]


def component_hooks(n_layers: int, has_mlp: bool) -> list[str]:
    """Every component output of a model, in depth order: what strictness resamples."""
    parts = ("attn_out", "mlp_out") if has_mlp else ("attn_out",)
    return [f"blocks.{layer}.hook_{p}" for layer in range(n_layers) for p in parts]


def writer_hook(exact_site: str, has_mlp: bool) -> str:
    """The component output of the layer whose write settles a label at residual site ``exact_site``."""
    parts = exact_site.split(".")
    if len(parts) != 3 or parts[0] != "blocks" or parts[2] not in ("hook_resid_mid", "hook_resid_post"):
        raise ExactLensError(f"siit: no component writes a label settled at {exact_site!r} (an input feature?)")
    component = "attn_out" if parts[2] == "hook_resid_mid" or not has_mlp else "mlp_out"
    return f"blocks.{parts[1]}.hook_{component}"


def derive_map(variables: list[tuple[str, str, str, int]], d_model: int, has_mlp: bool) -> SiteMap:
    """The default mapping (module docstring) of ``variables``: (name, exact_site, positions, dimension)."""
    need = sum(v[3] for v in variables)
    if need > d_model:
        raise ExactLensError(f"siit: the exact variables need {need} coordinates in disjoint blocks but d_model is "
                             f"{d_model}; raise d_model or give siit_map")
    out, start = {}, 0
    for name, site, positions, dim in variables:
        dims = list(range(start, start + dim))
        out[name] = {"hook": writer_hook(site, has_mlp), "positions": positions, "dims": dims, "exact_site": site}
        start += dim
    return out


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    seen: dict[str, Any] = {}
    for key, value in pairs:
        if key in seen:
            raise ExactLensError(f"siit_map: variable {key!r} is mapped twice")
        seen[key] = value
    return seen


def read_map(given: Any) -> SiteMap:
    """A user mapping: a dict, or the path of a JSON file holding one (a key given twice is refused)."""
    if isinstance(given, dict):
        return given
    path = Path(given)
    if not path.is_file():
        raise ExactLensError(f"siit_map: no file {str(path)!r}")
    try:
        data = json.loads(path.read_text(), object_pairs_hook=_no_duplicates)
    except json.JSONDecodeError as err:
        raise ExactLensError(f"siit_map: {path} is not JSON ({err.msg}, line {err.lineno})") from None
    if not isinstance(data, dict):
        raise ExactLensError(f"siit_map: {path} must hold a JSON object variable -> {{hook, positions, dims}}")
    return data


def check_map(mapping: SiteMap, variables: dict[str, int], n_layers: int, has_mlp: bool, d_model: int,
              exact_sites: dict[str, str] | None = None) -> SiteMap:
    """The mapping checked against the variables (name -> dimension) and the trained model's shape; the
    first problem raises, in one line."""
    hooks = component_hooks(n_layers, has_mlp)
    out: SiteMap = {}
    taken: dict[str, dict[int, str]] = {}
    for name, site in mapping.items():
        if name not in variables:
            raise ExactLensError(f"siit_map: unknown variable {name!r}; the exact variables: "
                                 f"{', '.join(variables) or 'none'}")
        if not isinstance(site, dict) or set(site) - {"hook", "positions", "dims", "exact_site"}:
            raise ExactLensError(f"siit_map: {name!r} must map to {{\"hook\", \"positions\", \"dims\"}}, got "
                                 f"{site!r:.80}")
        hook = site.get("hook")
        if hook not in hooks:
            raise ExactLensError(f"siit_map: {name!r}: unknown hook {hook!r}; a component output: {', '.join(hooks)}")
        positions = site.get("positions", "all")
        if positions not in POSITIONS:
            raise ExactLensError(f"siit_map: {name!r}: positions must be 'all' or 'readout', got {positions!r:.40}")
        dims = site.get("dims")
        if not isinstance(dims, list) or not dims or not all(isinstance(d, int) and not isinstance(d, bool)
                                                              for d in dims):
            raise ExactLensError(f"siit_map: {name!r}: dims must be a non-empty list of integers, got {dims!r:.60}")
        bad = [d for d in dims if not 0 <= d < d_model]
        if bad:
            raise ExactLensError(f"siit_map: {name!r}: dimension {bad[0]} is out of range [0, {d_model}) of d_model")
        if len(set(dims)) != len(dims):
            raise ExactLensError(f"siit_map: {name!r}: a dimension is listed twice in {dims}")
        if len(dims) != variables[name]:
            raise ExactLensError(f"siit_map: {name!r} has {variables[name]} dimension(s) but is given {len(dims)}")
        for d in dims:
            other = taken.setdefault(hook, {}).get(d)
            if other is not None:
                raise ExactLensError(f"siit_map: {name!r} and {other!r} overlap at {hook} dimension {d}")
            taken[hook][d] = name
        out[name] = {"hook": hook, "positions": positions, "dims": list(dims),
                     "exact_site": (exact_sites or {}).get(name, site.get("exact_site"))}
    if not out:
        raise ExactLensError("siit_map maps no variable")
    return out

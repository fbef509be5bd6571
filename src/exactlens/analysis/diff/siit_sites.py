"""The diff's verdicts against a SIIT checkpoint's known answer (exactlens.train.siit).

A model trained with ``--siit`` records in its config metadata (``siit.mapping``) the component output
each exact variable was trained to live in. Per verdict line this adds ``mapped_site`` (that hook, None
for a variable the run did not map) and ``at_mapped_site``: whether the verdict's site is the mapped
component output or the residual site it is first added into (``hook_attn_out`` of layer L ->
``blocks.L.hook_resid_mid``; ``hook_mlp_out`` -> ``blocks.L.hook_resid_post``, or the FFN's
``blocks.L.mlp.hook_post``); None where the verdict names no site (e.g. "indistinguishable from the
answer") or the variable is not mapped. A model without a mapping is left as it is.

A position-resolved line (``v@p``: the variable at position p, docs/diff.md "position-resolved variables")
takes the mapping of ``v`` where ``v`` was trained at every position (``positions: "all"``): SIIT trained
``v``'s coordinates at p too. A ``v`` mapped at the readout position only was trained at no other position, so
its ``v@p`` lines stay unmapped (None).
"""

from __future__ import annotations

from typing import Any


def siit_mapping(model: Any) -> dict[str, dict[str, Any]] | None:
    """The variable -> site mapping a SIIT checkpoint records, else None."""
    metadata = getattr(getattr(model, "cfg", None), "metadata", None) or {}
    siit = metadata.get("siit") if isinstance(metadata, dict) else None
    return siit.get("mapping") if isinstance(siit, dict) else None


def sites_of(hook: str) -> set[str]:
    """The diff's sites where what component output ``hook`` writes is first held: the hook itself (the
    alignment also searches component outputs) and the residual site it is added into."""
    layer, _, component = hook.removeprefix("blocks.").partition(".")
    if component == "hook_attn_out":
        return {hook, f"blocks.{layer}.hook_resid_mid"}
    return {hook, f"blocks.{layer}.hook_resid_post", f"blocks.{layer}.mlp.hook_post"}


def with_mapped_sites(lines: dict[str, dict[str, Any]], model: Any) -> dict[str, dict[str, Any]]:
    """``lines`` (summary.verdicts: variable -> verdict line) with mapped_site and at_mapped_site added in
    place for a SIIT model (module docstring); returned for chaining."""
    mapping = siit_mapping(model)
    if mapping is None:
        return lines
    for name, line in lines.items():
        site = mapping.get(name) or _mapped_at_position(name, mapping)
        line["mapped_site"] = None if site is None else site["hook"]
        found = line.get("site")
        line["at_mapped_site"] = None if site is None or found is None else found in sites_of(site["hook"])
    return lines


def _mapped_at_position(name: str, mapping: dict[str, dict[str, Any]]) -> dict[str, Any] | None:
    """The mapping of a position-resolved line ``v@p`` where ``v`` is mapped at every position, else None."""
    base, at, position = name.rpartition("@")
    if not at or not position.isdigit():
        return None
    site = mapping.get(base)
    return site if site is not None and site.get("positions", "all") == "all" else None

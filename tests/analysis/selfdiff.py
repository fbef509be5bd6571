"""Self-diffs of the exact constructions (issue 29, item 5): ``diff(X, against=X)`` and the same for a
copy with a rotated residual basis must call every variable the construction computes "computed" (IIA
on changed test pairs >= 0.95), an exact label at the site where the circuit computes it. Shared by
tests/analysis/test_alignment_selfdiff.py and the measurement in docs/diff.md."""

from __future__ import annotations

from typing import Any

import torch

from exactlens import tasks
from exactlens.analysis.diff import diff
from exactlens.constructions import build
from exactlens.errors import ExactLensError
from exactlens.model.basis import random_rotation, rotate_residual

SELF_IIA = 0.95
# construction parameters of the sweep where the default is too large for a test (majority's 20 classes:
# 20 labels plus a 20-dimensional count vector at every site)
SWEEP_PARAMS = {"majority": {"num_classes": 3}}
WANTED_LENGTHS = (4, 6, 8, 10)  # even: Dyck has no member of odd length


def lengths_for(task: tasks.Task) -> list[int]:
    out = []
    for length in WANTED_LENGTHS:
        try:
            task.check_length(length)
        except ExactLensError:
            continue
        out.append(length)
    return out or [task.min_length]


def circuit_sites(exact_site: str) -> set[str]:
    """A label settled at blocks.L.hook_resid_mid is written by layer L's attention; at hook_resid_post,
    by its FFN: the component output and the residual site itself."""
    layer = exact_site.split(".")[1]
    component = "hook_attn_out" if exact_site.endswith("resid_mid") else "hook_mlp_out"
    return {exact_site, f"blocks.{layer}.{component}"}


def self_diff(name: str, rotated: bool, **settings: Any) -> dict[str, Any]:
    """The self-diff's per-variable verdicts and, per variable that should be "computed", why not."""
    params = SWEEP_PARAMS.get(name, {})
    model = build(name, dtype="float64", **params)
    if rotated:
        model = rotate_residual(model, random_rotation(model.cfg.d_model, torch.Generator().manual_seed(2),
                                                       fix_ones=True))
    task = tasks.of_model(model)
    result = diff(model, name, params=params, lengths=lengths_for(task), parts=("alignment",),
                  untrained_baseline=False, **settings)
    details = result["alignment_details"]
    verdicts = details.get("verdicts", {})
    described = {(v["origin"], v["variable"]): v for v in details.get("variables", [])}
    failures, exempt = {}, {}
    for key, line in verdicts.items():
        origin = line["origin"]
        variable = key.split(":", 1)[1] if key.startswith("exact:") else key
        info = described.get((origin, variable), {})
        if not line.get("changed_pairs"):
            exempt[key] = "untestable: no test pair changes the answer through it"
            continue
        determined = (info.get("source_determined") or 0) >= 0.99
        if determined and origin == "exact" and info.get("exact_positions") != "all":
            exempt[key] = "the answer itself at the readout position (indistinguishable by design)"
            continue
        if determined and line["verdict"] == "indistinguishable from the answer" and _only_where_answer_arrives(
                result, origin, variable):
            exempt[key] = "computed only where the answer reaches the readout (indistinguishable by design)"
            continue
        problems = []
        if line["verdict"] != "computed" or (line["iia"] or 0) < SELF_IIA:
            problems.append(f"{line['verdict']} (IIA {line['iia']}, {line['changed_pairs']} changed pairs)")
        if origin == "exact" and info.get("exact_site"):
            sites = circuit_sites(info["exact_site"])
            at = [r for r in result["alignment"] if r["variable"] == variable and r["origin"] == "exact"
                  and r["site"] in sites]
            if not any(r["verdict"] == "computed" and (r["iia_changed"] or 0) >= SELF_IIA for r in at):
                best = max((r["iia_changed"] or 0 for r in at), default=None)
                problems.append(f"not computed at the circuit's site {sorted(sites)} (best IIA there {best})")
        if problems:
            failures[key] = "; ".join(problems)
    return {"verdicts": verdicts, "failures": failures, "exempt": exempt, "seconds": result.get("seconds")}


def _only_where_answer_arrives(result: dict[str, Any], origin: str, variable: str) -> bool:
    """An answer-determined variable whose localization rows are "computed" only at or after the site
    where the answer reaches the readout position (majority's counts: one attention layer computes
    them at [CLS], where the answer is read): nothing tells it from the answer."""
    order = {site: n for n, site in enumerate(result["alignment_details"]["sites"])}
    rows = result["alignment"]
    arrival = [order[r["site"]] for r in rows if (r.get("source_determined") or 0) >= 0.99
               and r["test"] == "interchange" and r["position"] == "readout" and (r["iia_changed"] or 0) >= 0.9]
    local = [order[r["site"]] for r in rows if r["variable"] == variable and r["origin"] == origin
             and r["test"] == "localization" and r["verdict"] == "computed"]
    return bool(arrival and local) and min(local) >= min(arrival)

"""The report's "Known circuits on trained weights" section (issue 45, docs/siit.md): a FIRST model trained
with strict interchange intervention training (``exactlens train first --siit``) beside one trained without
it and beside the exact construction.

Shown: the SIIT run's held-out measurements (each mapped variable's interchange accuracy; per unmapped
component the decision and output change when it is resampled) next to the same numbers of the plain model;
circuit discovery (exactlens.analysis.circuit) on the SIIT weights, scored against the circuit the run
recorded, side by side with the exact weights scored against their own; and the SIIT model's attention on
one word beside the exact model's. Kept cheap on purpose (the report's time and size budget): a short run,
few words, one discovery method with ``--quick``; the settings are stated in the section and recorded in
report.json. Shown when the report covers ``first``; a failure becomes an error box, never a failed report.
"""

from __future__ import annotations

import time
from typing import Any

from exactlens.viz.page import ReportContext, Section, esc, figure, progress, table

CONSTRUCTION = "first"
RUN = {"epochs": 300, "strings_per_epoch": 64, "batch_size": 64, "train_length": [1, 8], "test_length": [1, 8],
       "test_strings": 100, "lr": 3e-3, "eval_every": 0}
QUICK_RUN = {"epochs": 100}
DISCOVER = {"lengths": [5, 6], "words": 16}
METHODS = ("patching", "eap", "acdc")
QUICK_METHODS = ("eap",)
WORD = (1, 0, 1, 1, 0)  # the example word of the attention figures


def _train(ctx: ReportContext) -> tuple[Any, Any, dict[str, Any], float]:
    """The SIIT run, the plain run of the same settings, the plain model's measurements (the SIIT run's
    mapping and pairs) and the seconds of all three."""
    from exactlens.train import get_preset, train
    from exactlens.train.siit import measure, siit_loss_of

    options = {**RUN, **(QUICK_RUN if ctx.quick else {})}
    start = time.perf_counter()
    siit = train(CONSTRUCTION, siit=True, seed=0, device=ctx.device, **options)
    plain = train(CONSTRUCTION, seed=0, device=ctx.device, **options)
    loss = siit_loss_of(get_preset(CONSTRUCTION).spec({**options, "siit": True}))
    return siit, plain, measure(loss, plain.model.cpu()), time.perf_counter() - start


def _measured_tables(record: dict[str, Any], plain: dict[str, Any]) -> str:
    mine = record["measured"]
    variables = [[v, record["mapping"][v]["hook"], m["iia"], m["iia_changed"], plain["interchange"][v]["iia"],
                  plain["interchange"][v]["iia_changed"]] for v, m in mine["interchange"].items()]
    components = [[c, mine["resample_decision_change"][c], mine["resample_output_change"][c],
                   plain["resample_decision_change"].get(c), plain["resample_output_change"].get(c)]
                  for c in mine["resample_decision_change"]]
    return (table(["variable", "mapped site", "interchange acc. (SIIT)", "changed pairs (SIIT)",
                   "interchange acc. (plain)", "changed pairs (plain)"], variables,
                  f"each mapped variable swapped at its site on {mine['held_out_pairs']} held-out pairs")
            + table(["unmapped component", "decision change (SIIT)", "output change (SIIT)",
                     "decision change (plain)", "output change (plain)"], components,
                    "strictness: each unmapped component resampled alone (output change: total variation)"))


def _discovery_table(ctx: ReportContext, model: Any) -> tuple[str, list[dict[str, Any]]]:
    from exactlens.analysis.circuit.evaluate import discover_report

    rows, data = [], []
    for method in QUICK_METHODS if ctx.quick else METHODS:
        sides = {}
        for side, target in (("exact", CONSTRUCTION), ("SIIT", model)):
            r = discover_report(target, method, **DISCOVER)
            sides[side] = {"edge_auroc": r["score"]["edge_auroc"], "cpr": r.get("cpr"), "cmd": r.get("cmd"),
                           "truth_cpr": r["exact_circuit"]["cpr"], "truth_cmd": r["exact_circuit"]["cmd"]}
        e, s = sides["exact"], sides["SIIT"]
        rows.append([method, e["edge_auroc"], s["edge_auroc"], e["cpr"], s["cpr"], e["cmd"], s["cmd"],
                     s["truth_cpr"], s["truth_cmd"]])
        data.append({"method": method, **sides})
    html = table(["method", "edge AUROC (exact)", "edge AUROC (SIIT)", "CPR (exact)", "CPR (SIIT)", "CMD (exact)",
                  "CMD (SIIT)", "recorded circuit's CPR (SIIT)", "its CMD"], rows,
                 f"discovery at head granularity, resample ablation, |w| in {DISCOVER['lengths']}, "
                 f"{DISCOVER['words']} words per length")
    return html, data


def _attention(ctx: ReportContext, model: Any) -> str:
    import torch

    from exactlens import tasks
    from exactlens.constructions import get
    from exactlens.viz.attention import attention_heatmap

    exact = get(CONSTRUCTION).make()
    tokens = tasks.of_model(exact).encode(torch.tensor([WORD])).tokens[0]
    word = "".join(map(str, WORD))
    figures = []
    for name, m in (("exact", exact), ("siit", model)):
        path = attention_heatmap(m.cpu(), tokens, ctx.asset("figures", f"siit-attention-{name}.png"),
                                 f"{CONSTRUCTION} ({'exact' if name == 'exact' else 'SIIT-trained'}) on w = {word}")
        figures.append(figure(ctx, path, f"{name} attention", f"{name}: attention on w = {word}"))
    return '<div style="display:flex;gap:1em;flex-wrap:wrap">' + "".join(figures) + "</div>"


def _section_html(ctx: ReportContext) -> str:
    progress(f"report: SIIT-trained {CONSTRUCTION} beside a plain run and the exact weights")
    siit, plain, plain_measured, seconds = _train(ctx)
    record = siit.info["siit"]
    start = time.perf_counter()
    discovery, rows = _discovery_table(ctx, siit.model.cpu())
    discover_seconds = time.perf_counter() - start
    options = {**RUN, **(QUICK_RUN if ctx.quick else {})}
    data = ctx.write_json("known-circuits.json", {"options": options, "siit": record, "plain": plain_measured,
                                                  "discovery": rows})
    return (
        f"<p>A model trained with strict interchange intervention training (SIIT: <code>exactlens train "
        f"{CONSTRUCTION} --siit</code>, docs/siit.md) has a known circuit: each exact variable is mapped to a "
        "component, interchange interventions there must give the exact model's counterfactual answer, and "
        "resampling any unmapped component must leave the answer alone. So diff and discovery can be checked "
        "on trained weights with a known answer. Trained with "
        f"<code>{esc(options)}</code>, seed 0, and the same run without SIIT as the contrast ({seconds:.1f} s for "
        f"both with the measurements; discovery {discover_seconds:.1f} s). JSON: "
        f'<a href="{esc(data)}">{esc(data)}</a>.</p>'
        f"{_measured_tables(record, plain_measured)}"
        "<h3>Discovery on trained weights</h3><p><code>exactlens discover</code> on the SIIT model scores "
        "against the circuit its run recorded (no <code>--against</code>); the exact weights against their "
        "own.</p>" + discovery
        + "<h3>Attention: exact beside SIIT-trained</h3>" + _attention(ctx, siit.model)
    )


def siit_sections(ctx: ReportContext) -> list[Section]:
    if CONSTRUCTION not in ctx.names:
        return []
    options = {**RUN, **(QUICK_RUN if ctx.quick else {})}
    ctx.record_settings(known_circuits={"train": options, "discover": DISCOVER,
                                        "methods": list(QUICK_METHODS if ctx.quick else METHODS)})
    try:
        body = _section_html(ctx)
    except Exception as err:  # one failing section must not take the report down
        body = ctx.error("known circuits on trained weights", err)
    return [Section("Known circuits on trained weights", "known-circuits", body)]

"""The ``alignment`` part: distributed alignment search (DAS) beside random and untrained baselines, one verdict
per variable (docs/diff.md, "How to read the alignment"). On the page it stands right after the probes: where a
variable is *used*, beside where it is readable."""

from __future__ import annotations

from typing import Any

from exactlens.analysis.diff.parts.base import Done, Part
from exactlens.markup import esc, heat, num, table

SUMMARY = ("mean_das_iia_changed", "mean_random_iia_changed", "mean_untrained_iia_changed",
           "mean_das_iia_changed_task", "verdicts")  # one line per variable (alignment.verdicts)

VERDICT_MARKS = {"computed": "✓ computed", "not found": "not found", "indistinguishable from the answer": "= answer",
                 "illusion suspected": "⚠ illusion", "unconverged": "unconverged",
                 "model does not solve the task": "task unsolved", "too few pairs": "too few pairs",
                 "in the input": "in the input", "untestable": "untestable"}


def run(ctx: Any, request: Any) -> Done:
    from exactlens import tasks
    from exactlens.analysis.diff.alignment import Settings, alignment_table, untrained_copy
    from exactlens.analysis.diff.runs import make_side
    from exactlens.analysis.diff.siit_sites import with_mapped_sites

    settings = Settings(max_dim=request.das_max_dim, steps=request.das_steps, pairs=request.alignment_pairs,
                        seed=request.seed, untrained=request.untrained_baseline,
                        warm_steps=getattr(request, "das_warm_steps", None), design=request.pairs,
                        unsolved_steps=getattr(request, "das_unsolved_steps", None))
    baseline = untrained_copy(ctx.model, request.seed + 1) if request.untrained_baseline else None
    if request.untrained_baseline and ctx.foreign is not None:  # the user's model: its own initializer
        from exactlens.interop.foreign import untrained_foreign

        baseline, how = untrained_foreign(ctx.foreign, ctx.task, ctx.readout, request.seed + 1)
        ctx.side.info["untrained_baseline"] = how
    untrained = None if baseline is None else make_side(baseline, {"kind": "untrained"},
                                                        tasks.reader(baseline, ctx.task),
                                                        ctx.exact.readout_position, False)
    table_ = alignment_table(ctx.values["words"], ctx.side, ctx.exact, ctx.values["probe_fits"][0]["features"],
                             settings, untrained, carry=ctx.carry)
    rows = table_.pop("rows")
    ctx.say("diff: alignment done")
    summary = {key: table_.get(key, {} if key == "verdicts" else None) for key in SUMMARY}
    with_mapped_sites(summary["verdicts"], ctx.model)  # a SIIT checkpoint: its variables' known sites
    return Done({"alignment": rows, "alignment_details": table_}, summary)


def text(result: dict[str, Any]) -> list[str]:
    from exactlens.analysis.diff.alignment.verdicts import verdict_lines  # one line per variable

    return verdict_lines(result)


def _ci(ci: Any) -> str:
    return "–" if not ci else f"[{ci[0]:.2f}, {ci[1]:.2f}]"


def _positions(r: dict[str, Any]) -> str | None:
    """Where a row or line patches: its ``position`` ("readout", "every", ...), or "position p" for a
    position-resolved variable (position "at", p its position_index)."""
    return f"position {r.get('position_index')}" if r.get("position") == "at" else r.get("position")


def _cell(r: dict[str, Any]) -> str:
    verdict = r.get("verdict")
    where = _positions(r) if r.get("position") == "at" else f"{r['position']} positions"
    tip = (f"{verdict or ''}; IIA {num(r['iia_changed'])} {_ci(r.get('iia_ci'))} on "
           f"{r.get('changed_pairs', '-')} changed pairs; {where}, dim {r['dim']}, "
           f"{r['pairs']} pairs; lift {num(r.get('lift'))}; random subspace {num(r['random_iia_changed'])} "
           f"(p95 {num(r.get('random_iia_p95'))}), untrained {num(r['untrained_iia_changed'])}; training IIA "
           f"{num(r.get('training_iia_changed'))}")
    mark = f"<br><small>{esc(VERDICT_MARKS.get(verdict, verdict))}</small>" if verdict else ""
    return (f'<td style="background:{heat(r["iia_changed"])}" title="{esc(tip)}">'
            f'{num(r["iia_changed"])}<br><small>{esc(_ci(r.get("iia_ci")))} k={r["dim"]}</small>{mark}</td>')


def iia_heatmap(rows: list[dict[str, Any]], sites: list[str]) -> str:
    """Variables x sites: DAS IIA on held-out pairs whose answer changes, each cell with its verdict
    and the 95 % interval (the chosen dimension, the changed pairs, the random-subspace mean and p95
    and the untrained baseline in the tooltip; grey where no pair changes or the site was not fit).
    An answer-determined variable's localization test (every position of a component output) is a
    row of its own."""
    variables: list[tuple[str, str, str]] = []
    cells: dict[tuple[str, str, str], dict[str, Any]] = {}
    for r in rows:
        key = (r["variable"], r["origin"], r.get("test", "interchange"))
        if key not in variables:
            variables.append(key)
        cells[(r["variable"], r.get("test", "interchange"), r["site"])] = r
    head = "<th>variable</th><th>from</th>" + "".join(f"<th><code>{esc(s)}</code></th>" for s in sites)
    body = []
    for name, origin, test in variables:
        tds = [_cell(cells[(name, test, site)]) if (name, test, site) in cells else '<td style="background:#eee">-</td>'
               for site in sites]
        label = name if test != "localization" else f"{name} (every position)"
        body.append(f"<tr><td class=l>{esc(label)}</td><td class=l>{esc(origin)}</td>{''.join(tds)}</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def page(result: dict[str, Any]) -> list[str]:
    if not result.get("alignment"):
        return []
    details = result.get("alignment_details", {})
    best = [[name, v["verdict"], v["site"] or "(no site claimed)", _positions(v) or "–", v["dim"], v["iia"],
             _ci(v["iia_ci"]), v["changed_pairs"], v["lift"], v["random_iia_p95"]]
            for name, v in details.get("verdicts", {}).items()]
    return [
        "<h3>Causal alignment (DAS): interchange-intervention accuracy per variable and site</h3>",
        "<p>Row: a causal variable of the task or a residual label of the exact model. Column: a hook site "
        "of the trained model. Cell: the accuracy with which swapping a learned k-dimensional subspace "
        "(k chosen on validation pairs) between two words makes the trained model give the answer the "
        "variable's swap predicts, on held-out pairs whose answer changes. Green where the model "
        "<em>uses</em> the variable there; compare with the probe map above, which says only where it is "
        "readable.</p>",
        iia_heatmap(result["alignment"], details.get("sites") or sorted({r["site"] for r in result["alignment"]})),
        "<p>One verdict per variable (docs/diff.md, \"How to read the alignment\"): its best site chosen on "
        "validation pairs, the IIA on held-out test pairs that the patch has to change (the counterfactual "
        "differs from the model's own decision) with its 95 % Wilson interval, the lift over not patching "
        "and the 95th percentile of 20 random subspaces of the same dimension:</p>",
        table(["variable", "verdict", "site", "positions", "k", "IIA (changed)", "95 % interval", "changed pairs",
               "lift", "random p95"], best, 4),
    ] + _unsolved_note(result)


def _unsolved_note(result: dict[str, Any]) -> list[str]:
    """Where the fits took fewer Adam steps because the trained model does not solve the task (the request's
    ``das_unsolved_steps``), the page says so and why the verdicts stand."""
    details = result.get("alignment_details", {})
    steps, usual = details.get("settings", {}).get("steps"), result.get("settings", {}).get("das_steps")
    solves = details.get("solves") or {}
    if solves.get("solves") is not False or steps is None or usual is None or steps == usual:
        return []
    return [f"<p>The trained model does not solve the task (accuracy {num(solves.get('accuracy'))} on the diff's "
            f"words, below the threshold {num(solves.get('threshold'))}; chance {num(solves.get('chance'))}), so every "
            "verdict is \"model does not solve the task\" whatever the fits find: each fit here took "
            f"{steps} Adam steps instead of {usual} (<code>das_unsolved_steps</code>), and its IIA may be lower than "
            "a longer fit's.</p>"]


PART = Part("alignment", run, ("words", "probe_fits"), ("alignment", "alignment_details"), SUMMARY, order=80,
            page_order=32, text=text, page=page,
            help="distributed alignment search beside random and untrained baselines")

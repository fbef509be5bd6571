"""Report section for Brody, Alon & Yahav (2023): unselectable keys (Fig. 1c/1d, Tables 1-2) and MAJORITY (Fig. 2-3).

Fig. 1c/1d is computed when the report is built (a reduced grid of random keys). Tables 1-2 and
Fig. 2-3 take hours of CPU at their measured scale, so the full report reads the result files that
``benchmarks/brody_tables.py`` and ``benchmarks/brody_majority.py`` wrote into
``exactlens/papers/brody/results/`` (package data; each records its command and date); the quick
report recomputes small versions of both (:mod:`exactlens.papers.brody.lm`,
:mod:`exactlens.papers.brody.majority_training`), seconds on one core.
"""

from __future__ import annotations

import json
import time
from importlib import resources
from typing import Any

from exactlens.errors import ExactLensError
from exactlens.papers.brody.figures import fig1_data, plot_fig1, plot_table_cells
from exactlens.papers.brody.lm import brody_tables, quick_settings, table_cells
from exactlens.papers.brody.majority_training import (
    QUICK_SETTINGS,
    paper_variant,
    plot_paper_majority,
    summarize_paper_majority,
)
from exactlens.viz.page import ReportContext, Section, esc, figure, fmt, progress, table
from exactlens.viz.trained_diff import TrainedDiff, trained_diff_section

FIG1 = {
    "full": {"ns": (4, 8, 16, 32, 64, 128), "ds": (2, 3, 4, 6, 8, 16), "trials": 10},
    "quick": {"ns": (4, 16, 64), "ds": (2, 3, 8), "trials": 2},
}


RESULTS = {"tables": "tables.json", "majority": "majority.json"}
"""Result files of the full-scale runs, in exactlens/papers/brody/results/ (package data)."""


def load_result(name: str) -> dict[str, Any]:
    """A committed result file of a full-scale benchmark run (see RESULTS), or a clear error."""
    if name not in RESULTS:
        raise ExactLensError(f"unknown Brody result {name!r}; known: {', '.join(RESULTS)}")
    path = resources.files("exactlens.papers.brody").joinpath("results", RESULTS[name])
    if not path.is_file():
        raise ExactLensError(
            f"the Brody {name} result file results/{RESULTS[name]} is missing; write it with "
            f"benchmarks/brody_{name}.py --out (see docs/brody.md)"
        )
    return json.loads(path.read_text(encoding="utf-8"))


def _provenance(data: dict[str, Any]) -> str:
    wall = data.get("wall_s")
    return (f"<p>Measured {esc(str(data.get('date', '?')))} with <code>{esc(str(data.get('command', '?')))}</code>"
            + (f", wall {wall / 60:.0f} min on one thread" if isinstance(wall, (int, float)) else "") + ".</p>")


def _pm(cell: dict[str, Any] | None) -> str:
    return "-" if cell is None else f"{cell['mean']:.1f} ± {cell['std']:.1f}"


def _fig1_html(ctx: ReportContext) -> str:
    grid = FIG1["quick" if ctx.quick else "full"]
    data = fig1_data(**grid, seed=0)
    rel = ctx.write_json("brody-fig1.json", data)
    png = plot_fig1(data, ctx.asset("figures", "brody-fig1.png"))
    return (
        "<h3>Fig. 1c/1d: unselectable random keys</h3>"
        f"<p>Mean fraction (over {data['trials']} trials) of standard-normal keys that lie in the convex hull "
        "of the others, hence can never get the strictly highest score (exact LP check with certificates, "
        f"tolerance {fmt(data['tolerance'])} relative to the keys' scale), without and with layer norm "
        "(centring and scaling to norm sqrt(d)). With LN the fraction is 0 for d &ge; 3; for d = 2 LN maps "
        "every key onto one of two points, so almost every key is a duplicate and unselectable, an exception "
        "the paper does not mention.</p>"
        + figure(ctx, png, "Brody Fig. 1c/1d", "rows n (keys), columns d (dimension)")
        + f'<p class="data">Data: <a href="{esc(rel)}">{esc(rel)}</a></p>'
    )


def _tables_html(ctx: ReportContext) -> str:
    if ctx.quick:
        settings = quick_settings()
        result = brody_tables(("full", "no_scale"), seeds=(0, 1), settings=settings, sequences=4)
        result = {k: v for k, v in result.items() if k != "runs"} | {
            "runs": [{k: v for k, v in run.items() if k != "hull"} for run in result["runs"]],
            "command": "quick report: brody_tables(('full', 'no_scale'), seeds=(0, 1), settings=quick_settings())",
            "date": "now"}
        result["cells"] = table_cells(result)
    else:
        result = load_result("tables")
    rel = ctx.write_json("brody-tables.json", result)
    png = plot_table_cells(result, ctx.asset("figures", "brody-tables.png"))
    s = result["settings"]
    n_layers = s["n_layers"]
    headers = ["model", "vectors", *[f"L{i + 1}" for i in range(n_layers)], "val bits/char"]
    rows = []
    for variant, entry in result["cells"].items():
        name = f"{variant} ({len(entry['seeds'])} seeds)"
        bits = entry["val_bits_per_char"]
        for key, label in (("before_ln", "before LN"), ("after_ln", "after LN = attention input")):
            if entry[key][0] is not None:
                rows.append([name, label, *[_pm(c) for c in entry[key]], f"{bits['mean']:.2f} ± {bits['std']:.2f}"])
    paper = result["paper"]
    rows += [
        ["paper Table 1", "w/o scaling, attention input", *paper["table1"]["no_scale_attention_input"], "-"],
        ["paper Table 2", "full LN, before LN", *paper["table2"]["before_ln"], "-"],
        ["paper Tables 1-2", "full LN, after LN", *paper["table2"]["after_ln"], "-"],
    ]
    corpus = result["corpus"]
    return (
        "<h3>Tables 1-2: unselectable keys in a small trained language model</h3>"
        f"<p>A {n_layers}-layer, d_model = {s['d_model']}, {s['n_heads']}-head pre-LN causal character LM "
        f"(learned positions, windows of n_ctx = {s['n_ctx']} characters, batch {s['batch_size']}) trained for "
        f"{s['steps']} Adam steps (lr {s['lr']}) on {corpus['characters']} characters of Python standard-library "
        f"docstrings (Python {esc(corpus['python_version'])}; nothing downloaded), with full LN and with LN "
        "without its scaling (projection x - mean x only), one model per seed. Percent of unselectable keys per "
        f"layer: per model the mean over {result['sequences']} held-out windows of {result['positions']} keys "
        f"(every position of a window is a key), then mean ± sample std over the seeds; tolerance "
        f"{fmt(result['tolerance'])}. The paper trains 50K steps on Wikipedia (GPT-2 BPE tokens, d = 8, "
        "414K parameters) and measures SQuAD sequences; here training is minutes per model, so the models are "
        "far from converged and only the qualitative claim is comparable: after full LN no key is "
        "unselectable, before it (or without the scaling) many are.</p>"
        + _provenance(result)
        + table(headers, rows)
        + figure(ctx, png, "Brody Tables 1-2 reproduction",
                 "% unselectable keys per layer, mean and min-max over seeds")
        + f'<p class="data">Data: <a href="{esc(rel)}">{esc(rel)}</a></p>'
    )


def _majority_html(ctx: ReportContext) -> str:
    if ctx.quick:
        start = time.perf_counter()
        variants = [paper_variant(ln, QUICK_SETTINGS) for ln in ("full", "scale_only")]
        data = {"command": "quick report: paper_variant(layer_norm, QUICK_SETTINGS)", "date": "now",
                "settings": QUICK_SETTINGS, "variants": variants, "wall_s": time.perf_counter() - start}
        data["summary"] = summarize_paper_majority(data)
    else:
        data = load_result("majority")
    rel = ctx.write_json("brody-majority.json", data)
    png = plot_paper_majority(data, ctx.asset("figures", "brody-majority.png"))
    st = data["settings"]
    rows = [
        [r["label"], r["runs"], r["steps"], f"{r['final_train_loss']:.3f} ± {r['final_train_loss_std']:.3f}",
         f"{r['final_test_accuracy']:.3f} ± {r['final_test_accuracy_std']:.3f}",
         f"{r['first_angle_deg']:.1f} → {r['final_angle_deg']:.1f} ± {r['final_angle_deg_std']:.1f}",
         r["mean_steps_to_0.5"], r["mean_steps_to_0.9"],
         ", ".join("never" if s is None else str(s) for s in r.get("run_steps_to_0.9", []))]
        for r in data["summary"]
    ]
    n_params = data["variants"][0].get("n_parameters")
    return (
        "<h3>Fig. 2-3: MAJORITY with and without LN's projection</h3>"
        "<p>The <code>majority-per-position</code> preset: the authors' layer (one head, d = 8, pre-LN encoder "
        f"layer with an FFN of width 8, no positions; {n_params} trained parameters, the paper's 584 plus 160 "
        "because our readout W_U is not tied to the embedding), the majority class predicted at every position "
        "of words of length 50 over 20 classes whose majority leads the runner-up by at least 6 (the authors' "
        "data), with full LN and with LN without its projection (x / RMS(x)). "
        f"{st['runs']} runs per variant trained as one stacked computation, {st['steps']} Adam steps of "
        f"{st['batch']} fresh words, lr {st['lr']} ({esc(st['lr_schedule'])}); the paper trains 17K steps "
        "(App. E.1). Test accuracy is per position on fresh words; the angle is between each position's query, "
        "mapped into the normalised residual space, and the line of the ones vector (Fig. 2b). Curves: mean over "
        "runs with the min-max band.</p>"
        + _provenance(data)
        + table(["variant", "runs", "steps", "final train loss (nats)", "final test accuracy",
                 "angle first → final (deg)", "mean acc ≥ 0.5 at step", "mean acc ≥ 0.9 at step",
                 "each run's acc ≥ 0.9 at step"], rows)
        + figure(ctx, png, "Brody Fig. 2-3 reproduction", "training loss, query angle and test accuracy vs steps")
        + f'<p class="data">Data: <a href="{esc(rel)}">{esc(rel)}</a></p>'
    )


def brody_sections(ctx: ReportContext) -> list[Section]:
    """Fig. 1c/1d, Tables 1-2 and Fig. 2-3 of Brody et al. (2023), when the report covers MAJORITY."""
    if not ctx.covers("Brody"):
        return []
    parts = []
    for what, part in (
        ("Brody Fig. 1c/1d", _fig1_html),
        ("Brody Tables 1-2", _tables_html),
        ("Brody Fig. 2-3", _majority_html),
    ):
        t0 = time.perf_counter()
        try:
            parts.append(part(ctx))
        except Exception as err:  # one failing part must not take the report down
            parts.append(ctx.error(what, err))
        progress(f"report: {what} done ({time.perf_counter() - t0:.1f} s)")
    return [Section("Brody et al.: layer norm and attention", "brody-layernorm", "\n".join(parts))]


MAJORITY_DIFF = TrainedDiff(
    "Trained vs exact: MAJORITY", "diff-majority", "majority", "majority", lengths=(49, 50),
    options={"epochs": 40, "strings_per_epoch": 2000, "batch_size": 100, "lr": 1e-2, "lr_schedule": "constant",
             "test_strings": 1000, "eval_every": 0},
    quick_options={"epochs": 2, "strings_per_epoch": 200},
    note="A classification task (20 classes, |w| = 50, Brody et al. §4.1's d = 8 model against the exact average).",
)


def majority_diff_sections(ctx: ReportContext) -> list[Section]:
    return [trained_diff_section(ctx, MAJORITY_DIFF)] if MAJORITY_DIFF.against in ctx.names else []

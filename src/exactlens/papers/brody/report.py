"""Report section for Brody, Alon & Yahav (2023): unselectable keys (Fig. 1c/1d, Tables 1-2) and MAJORITY (Fig. 2-3).

Everything is computed when the report is built, with small settings (the full measurements are
``benchmarks/brody_tables.py`` and ``benchmarks/brody_majority.py``): Fig. 1c/1d on a reduced grid
of random keys, a briefly trained character LM with full LN and with LN without its scaling
(:mod:`exactlens.papers.brody.lm`), and a short MAJORITY run with and without LN's projection
(:mod:`exactlens.papers.brody.majority_training`). Default cost about
40-60 s on one core; ``ctx.quick`` shrinks every part to a few seconds.
"""

from __future__ import annotations

import time
from typing import Any

from exactlens.papers.brody.figures import fig1_data, plot_fig1, plot_tables
from exactlens.papers.brody.lm import LMSettings, brody_tables, quick_settings
from exactlens.papers.brody.majority_training import majority_data, plot_majority, report_options
from exactlens.viz.page import ReportContext, Section, esc, figure, fmt, progress, register_section, table
from exactlens.viz.trained_diff import TrainedDiff, trained_diff_section

FIG1 = {
    "full": {"ns": (4, 8, 16, 32, 64, 128), "ds": (2, 3, 4, 6, 8, 16), "trials": 10},
    "quick": {"ns": (4, 16, 64), "ds": (2, 3, 8), "trials": 2},
}


def _lm_settings(quick: bool) -> Any:
    if quick:
        return quick_settings()
    return LMSettings(n_ctx=64, steps=250, batch_size=16, eval_every=50, eval_windows=16, warmup_steps=25)


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
    settings = _lm_settings(ctx.quick)
    result = brody_tables(("full", "no_scale"), settings=settings, sequences=4 if ctx.quick else 8)
    slim = {k: v for k, v in result.items() if k != "runs"}
    slim["runs"] = [{k: v for k, v in run.items() if k != "hull"} for run in result["runs"]]
    rel = ctx.write_json("brody-tables.json", slim)
    png = plot_tables(result, ctx.asset("figures", "brody-tables.png"))
    n_layers = settings.n_layers
    headers = ["model", "vectors", *[f"L{i + 1}" for i in range(n_layers)]]
    rows = []
    for run in result["runs"]:
        p, name = run["percent"], f"{run['variant']} (val {run['history'][-1]['val_bits_per_char']:.2f} bits/char)"
        rows.append([name, "before LN", *p["before_ln"]])
        rows.append([name, "after LN = attention input", *p["after_ln"]])
        for h in range(len(p["per_head"][0])):
            rows.append([name, f"head {h} keys, in its query space", *[layer[h] for layer in p["per_head"]]])
    paper = result["paper"]
    rows += [
        ["paper Table 1", "w/o scaling, attention input", *paper["table1"]["no_scale_attention_input"]],
        ["paper Table 2", "full LN, before LN", *paper["table2"]["before_ln"]],
        ["paper Tables 1-2", "full LN, after LN", *paper["table2"]["after_ln"]],
    ]
    corpus = result["corpus"]
    return (
        "<h3>Tables 1-2: unselectable keys in a small trained language model</h3>"
        f"<p>A {n_layers}-layer, d_model = {settings.d_model}, {settings.n_heads}-head pre-LN causal character "
        f"LM (learned positions, n_ctx = {settings.n_ctx}) trained for {settings.steps} Adam steps on "
        f"{corpus['characters']} characters of Python standard-library docstrings (Python "
        f"{esc(corpus['python_version'])}; nothing downloaded), once with full LN and once with LN without its "
        "scaling (projection x - mean x only). Percent of unselectable keys per layer, mean over "
        f"{result['sequences']} held-out windows of {result['positions']} characters (every position of a "
        "window is a key), tolerance "
        f"{fmt(result['tolerance'])}. Small settings for the report; the full run is "
        "<code>benchmarks/brody_tables.py</code>. The paper's model is far larger in training (50K steps on "
        "Wikipedia) and in context (up to 1024 tokens), and with more keys per sequence more of them fall "
        "inside the hull, so the numbers are not expected to match; the qualitative claim is that after full LN "
        "no key is unselectable. The per-head rows restrict the queries to what the head can form "
        "(rank d_head): there LN gives no such guarantee.</p>"
        + table(headers, rows)
        + figure(ctx, png, "Brody Tables 1-2 reproduction", "% unselectable keys per layer")
        + f'<p class="data">Data: <a href="{esc(rel)}">{esc(rel)}</a></p>'
    )


def _majority_html(ctx: ReportContext) -> str:
    data = majority_data(seeds=(0,) if ctx.quick else (0, 1, 2), **report_options(ctx.quick))
    rel = ctx.write_json("brody-majority.json", data)
    png = plot_majority(data, ctx.asset("figures", "brody-majority.png"))
    rows = [
        [r["layer_norm"], r["seed"], r["final_test_accuracy"], r["steps_to_threshold"], r["final_angle_deg"]]
        for r in data["runs"]
    ]
    return (
        "<h3>Fig. 2-3: MAJORITY with and without LN's projection</h3>"
        f"<p>One-layer, d = 8 models on MAJORITY ({data['options'].get('num_classes')} classes, |w| = "
        f"{data['options'].get('train_length')}), with full LN and with LN without its projection (scaling "
        f"only), {len(data['seeds'])} seed(s), the 800-step setting of docs/brody.md (script: "
        "<code>benchmarks/brody_majority.py</code>). Steps until the test accuracy first reaches "
        f"{fmt(data['threshold'])}, and the angle between the CLS query (as a direction of the normalised "
        "residual space) and the line of the ones vector.</p>"
        + table(
            ["layer norm", "seed", "final test accuracy", f"steps to acc >= {data['threshold']}", "final angle (deg)"],
            rows,
        )
        + figure(ctx, png, "Brody Fig. 2-3 reproduction", "test accuracy and query angle vs steps")
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

def register_sections() -> None:
    register_section("brody", brody_sections, order=200)
    register_section("brody-diff-majority", majority_diff_sections, order=210)

"""Report sections of Chiang & Cholak 2022: Fig. 2 and Fig. 3 recomputed, and a trained FIRST
model diffed against the exact §3.3 construction."""

from __future__ import annotations

import time
from typing import Any

from exactlens.analysis.diff import diff
from exactlens.papers.chiang_cholak import figures as cf
from exactlens.train import train
from exactlens.viz.diff_page import attention_views, diff_html
from exactlens.viz.page import ReportContext, Section, esc, figure, fmt, progress, table

PAPER = "Chiang & Cholak"

FULL: dict[str, Any] = {
    "fig2": {"max_length": 1000, "strings": 1000, "points_per_decade": 8},
    "fig3": {"lengths": (1, 50), "strings": 1000},
}
QUICK: dict[str, Any] = {
    "fig2": {"max_length": 50, "strings": 50, "points_per_decade": 8},
    "fig3": {
        "values": [0.9, 0.95, 0.98, 0.99, 0.995, 0.999, 1.0, 1.001, 1.005, 1.01, 1.02, 1.05, 1.1],
        "lengths": (1, 20),
        "strings": 100,
    },
}

FIG2_SHORT = {
    "no layer norm": "no LN",
    "layer norm eps=1e-5": "LN 1e-5",
    "layer norm eps=0": "LN 0",
    "layer norm + Prop. 2, eps=1e-5": "LN+P2 1e-5",
    "layer norm + Prop. 2, eps=0": "LN+P2 0",
}


def chiang_figures_sections(ctx: ReportContext) -> list[Section]:
    """Fig. 2 and Fig. 3, when the report covers a Chiang & Cholak construction."""
    if not ctx.covers(PAPER):
        return []
    settings = QUICK if ctx.quick else FULL
    ctx.record_settings(fig2=settings["fig2"], fig3=settings["fig3"])
    parts = _fig2_html(ctx, settings) + _fig3_html(ctx, settings)
    return [Section("Chiang & Cholak figures", "chiang-cholak-figures", "\n".join(parts))]


def _fig2_html(ctx: ReportContext, settings: dict[str, Any]) -> list[str]:
    """Fig. 2: the cross-entropy of the exact solutions per length (or an error box)."""
    try:
        t0 = time.perf_counter()
        fig2 = cf.fig2_data(**settings["fig2"])
        fig2_json = ctx.write_json("fig2.json", fig2)
        png = cf.plot_fig2(fig2, ctx.asset("figures", "fig2.png"))
        curves_of = fig2["settings"]
        headers = ["n"] + [f"{lang[0]} {FIG2_SHORT.get(s, s)}" for lang in cf.LANGUAGES for s in curves_of]
        rows = [
            [row["length"], *[row[f"{lang} / {s}"] for lang in cf.LANGUAGES for s in curves_of]]
            for row in cf.fig2_rows(fig2)
        ]
        accuracy = min(min(c["accuracy"]) for lang in fig2["curves"].values() for c in lang.values())
        html = [
            "<h3>Fig. 2: cross-entropy of the exact solutions</h3>",
            f"<p>Mean cross-entropy in bits per string over {fig2['strings']} random strings of each length n "
            f"({fig2['dtype']}; {esc(fig2['method'])}; lowest accuracy of any curve at any length: "
            f"{fmt(accuracy)}). Five settings: no layer norm (§3); the §4.1 models with layer norm, eps = 1e-5 "
            "and eps = 0; and the same with the Prop. 2 layer (§4.2) added, eta = "
            f"{fmt(fig2['eta'])} bits. The paper's claim that with eps = 0 the cross-entropy does not depend "
            "on n holds for the models with the Prop. 2 layer; the §4.1 models alone still tend to 1 bit, "
            "and their eps = 1e-5 and eps = 0 curves coincide (eps is tiny next to the activations' "
            "variance).</p>",
            figure(
                ctx, png, "Fig. 2 reproduction", "Fig. 2: P = PARITY, F = FIRST, LN = layer norm, P2 = Prop. 2 layer"
            ),
            "<details><summary>Fig. 2 data (bits per string)</summary>"
            + table(headers, rows)
            + f'<p>JSON: <a href="{esc(fig2_json)}">{esc(fig2_json)}</a></p></details>',
        ]
        progress(f"report: fig2 done ({time.perf_counter() - t0:.1f} s)")
        return html
    except Exception as err:
        return [ctx.error("Fig. 2", err)]


def _fig3_html(ctx: ReportContext, settings: dict[str, Any]) -> list[str]:
    """Fig. 3: the sensitivity of parity-ln(-eta) to the weight that writes k/n (or an error box)."""
    try:
        t0 = time.perf_counter()
        fig3 = cf.fig3_data(**settings["fig3"])
        fig3_json = ctx.write_json("fig3.json", fig3)
        png = cf.plot_fig3(fig3, ctx.asset("figures", "fig3.png"))
        curves = fig3["curves"]
        exact = [v for v, a in zip(fig3["values"], curves["parity-ln"]["accuracy"], strict=True) if a == 1.0]
        low, high = fig3["lengths"]
        rows = [
            [
                v,
                curves["parity-ln"]["accuracy"][j],
                curves["parity-ln"]["cross_entropy_bits"][j],
                curves["parity-ln-eta"]["accuracy"][j],
                curves["parity-ln-eta"]["cross_entropy_bits"][j],
            ]
            for j, v in enumerate(fig3["values"])
        ]
        window = (
            f"Accuracy is 1 for the tried values from {fmt(min(exact))} to {fmt(max(exact))}"
            if exact
            else "No tried value has accuracy 1"
        )
        html = [
            "<h3>Fig. 3: sensitivity to one weight</h3>",
            "<p>parity-ln (eps = 0) and parity-ln-eta (the same with the Prop. 2 layer) as the weight that "
            f"writes k/n, {esc(fig3['paper_parameter'])} = <code>{esc(fig3['parameter'])}</code>, moves away "
            f"from its correct value 1; {fig3['strings']} random strings with |w| uniform in [{low}, {high}]. "
            f"{window}. The window shrinks as strings get longer (an error e in k/n moves the peak of "
            "I[i=k] by k e); the cross-entropy of parity-ln stays near 1 bit throughout, that of parity-ln-eta "
            "is eta at the correct value and grows with every misclassified class of strings.</p>",
        ]
        html += [
            figure(ctx, png, "Fig. 3 reproduction", "Fig. 3: cross-entropy (top) and accuracy (bottom)"),
            "<details><summary>Fig. 3 data</summary>"
            + table(
                ["value", "acc (parity-ln)", "CE bits (parity-ln)", "acc (parity-ln-eta)", "CE bits (parity-ln-eta)"],
                rows,
            )
            + f'<p>JSON: <a href="{esc(fig3_json)}">{esc(fig3_json)}</a></p></details>',
        ]
        progress(f"report: fig3 done ({time.perf_counter() - t0:.1f} s)")
        return html
    except Exception as err:
        return [ctx.error("Fig. 3", err)]


DIFF_FULL: dict[str, Any] = {"epochs": 100, "lengths": (1, 2, 4, 8, 16, 32), "strings": 32, "das_steps": 60}
DIFF_QUICK: dict[str, Any] = {"epochs": 10, "lengths": (1, 2, 4, 8), "strings": 16, "das_steps": 20}


def diff_sections(ctx: ReportContext) -> list[Section]:
    if not ctx.covers(PAPER):
        return []
    s = DIFF_QUICK if ctx.quick else DIFF_FULL
    try:
        t0 = time.perf_counter()
        progress(f"report: training a small FIRST model ({s['epochs']} epochs) for the diff")
        run = train(
            "first",
            seed=0,
            epochs=s["epochs"],
            strings_per_epoch=100,
            batch_size=10,
            train_length=[1, 10],
            test_length=50,
            test_strings=100,
            eval_every=0,
            lr=1e-3,
            device=ctx.device,
        )
        trained_s = time.perf_counter() - t0
        result = diff(run.model, "first", lengths=list(s["lengths"]), strings=s["strings"], das_steps=s["das_steps"],
                      alignment_pairs=s["strings"], device=ctx.device)
        data = ctx.write_json("diff-first.json", result)
        t, e = attention_views(result, run.model.cpu(), ctx.out_dir / "attention" / "diff-first",
                                       bundle_dir=ctx.bundle_dir) or (None, None)
        views = (ctx.rel(t), ctx.rel(e)) if t is not None else None
        intro = (
            f"<p>A FIRST model trained for {s['epochs']} epochs (Chiang &amp; Cholak §5.1 architecture: 2 "
            f"layers, d = 16, post-LN; |w| in 1..10, Adam lr 1e-3; {trained_s:.1f} s) compared with the exact "
            "§3.3 construction through hooks (<code>exactlens diff</code>). JSON: "
            f'<a href="{esc(data)}">{esc(data)}</a>.</p>'
        )
        return [Section("Trained vs exact: FIRST", "diff-first", intro + diff_html(result, views))]
    except Exception as err:  # a failing section must not sink the report
        return [Section("Trained vs exact: FIRST", "diff-first", ctx.error("diff section", err))]

"""Report section: train a small FIRST model quickly and diff it against the exact `first`."""

from __future__ import annotations

import time
from typing import Any

from exactlens.viz.report import ReportContext, Section, esc, progress

FULL_SETTINGS: dict[str, Any] = {"epochs": 100, "lengths": (1, 2, 4, 8, 16, 32), "strings": 32}
QUICK_SETTINGS: dict[str, Any] = {"epochs": 10, "lengths": (1, 2, 4, 8), "strings": 16}


def diff_sections(ctx: ReportContext) -> list[Section]:
    from exactlens.analysis.diff import diff
    from exactlens.viz.diff_page import attention_views, diff_html

    s = QUICK_SETTINGS if ctx.quick else FULL_SETTINGS
    try:
        from exactlens.train import train

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
        )
        trained_s = time.perf_counter() - t0
        result = diff(run.model, "first", lengths=list(s["lengths"]), strings=s["strings"])
        data = ctx.write_json("diff-first.json", result)
        t, e = attention_views(result, run.model, ctx.out_dir / "attention" / "diff-first") or (None, None)
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

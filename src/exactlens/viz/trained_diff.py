"""A report section that trains one model of a task and diffs it against an exact construction.

Plug-ins use it to give the report one trained-vs-exact diff per task kind: ``trained_diff_section``
trains ``train_name`` (a paper preset or a construction name: exactlens.train) with the given
options, runs every part of ``exactlens diff`` (DAS included) against the construction, and shows
the diff page fragment (probe and IIA heat maps, attention views of both models) with the run's
held-out metrics. A failure becomes an error box in the section, never a failed report.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from exactlens.analysis.diff import diff
from exactlens.train import train
from exactlens.viz.diff_page import attention_views, diff_html
from exactlens.viz.page import ReportContext, Section, esc, fmt, progress


@dataclass(frozen=True)
class TrainedDiff:
    title: str
    anchor: str
    train_name: str
    against: str
    lengths: tuple[int, ...]
    options: dict[str, Any] = field(default_factory=dict)  # training options of the full report
    quick_options: dict[str, Any] = field(default_factory=dict)  # ... of --quick (over options)
    params: dict[str, Any] = field(default_factory=dict)  # the construction's parameters
    strings: int = 32
    quick_strings: int = 12
    das_steps: int = 60
    quick_das_steps: int = 20  # --quick: the formation timelines' DAS steps
    unsolved_das_steps: int = 20  # where the trained model does not solve the task (diff's das_unsolved_steps)
    quick_unsolved_das_steps: int = 5  # ... in --quick
    das_max_dim: int = 3  # DAS subspaces of 1..das_max_dim dimensions (diff's default)
    quick_das_max_dim: int = 1  # ... in --quick: the k = 1 fits only (the larger k stages are most of a fit's time)
    note: str = ""


def _held_out(final: dict[str, Any]) -> str:
    if final.get("test_mse") is not None:
        return f"held-out MSE {fmt(final['test_mse'])} (R^2 {fmt(final.get('test_r2'))})"
    text = f"held-out accuracy {fmt(final.get('test_accuracy'))}"
    if final.get("test_per_position_accuracy") is not None:
        text += f" (per position {fmt(final['test_per_position_accuracy'])})"
    return text


def _das_setting(ctx: ReportContext, spec: TrainedDiff, strings: int, steps: int, unsolved: int, max_dim: int) -> str:
    """The DAS settings of the diff, in a sentence; with --quick, beside the full report's."""
    text = (f"DAS: subspaces of k = 1..{max_dim} dimensions (and a variable's own where it needs more), {steps} Adam "
            f"steps per fit group ({unsolved} where the trained model does not solve the task), {strings} words per "
            "length.")
    if ctx.quick:
        text += (f" Quick settings: the full report fits k = 1..{spec.das_max_dim} with {spec.das_steps} steps "
                 f"({spec.unsolved_das_steps}) on {spec.strings} words per length.")
    return text


def trained_diff_section(ctx: ReportContext, spec: TrainedDiff) -> Section:
    try:
        options = {**spec.options, **(spec.quick_options if ctx.quick else {})}
        start = time.perf_counter()
        progress(f"report: training {spec.train_name} for the diff against {spec.against}")
        run = train(spec.train_name, seed=0, **options)
        trained_s = time.perf_counter() - start
        strings = spec.quick_strings if ctx.quick else spec.strings
        das_steps = spec.quick_das_steps if ctx.quick else spec.das_steps
        unsolved = min(das_steps, spec.quick_unsolved_das_steps if ctx.quick else spec.unsolved_das_steps)
        max_dim = spec.quick_das_max_dim if ctx.quick else spec.das_max_dim
        result = diff(run.model, spec.against, params=spec.params or None, lengths=list(spec.lengths),
                      strings=strings, das_steps=das_steps, das_unsolved_steps=unsolved,
                      alignment_pairs=strings, das_max_dim=max_dim)
        data = ctx.write_json(f"{spec.anchor}.json", result)
        views = attention_views(result, run.model, ctx.out_dir / "attention" / spec.anchor,
                                bundle_dir=ctx.bundle_dir)
        links = (ctx.rel(views[0]), ctx.rel(views[1])) if views is not None else None
        cfg = run.model.cfg
        intro = (
            f"<p>A model trained with <code>exactlens train {esc(spec.train_name)}</code> ({cfg.n_layers} layers x "
            f"{cfg.n_heads} heads, d = {cfg.d_model}; {run.info['steps']} steps, {trained_s:.1f} s; "
            f"{esc(_held_out(run.final))}) compared through hooks with the exact construction "
            f"<code>{esc(spec.against)}</code>. {spec.note} "
            f"{_das_setting(ctx, spec, strings, das_steps, unsolved, max_dim)} "
            f"JSON: <a href=\"{esc(data)}\">{esc(data)}</a>.</p>"
        )
        return Section(spec.title, spec.anchor, intro + diff_html(result, links))
    except Exception as err:  # a failing section must not sink the report
        return Section(spec.title, spec.anchor, ctx.error(f"{spec.anchor} section", err))

"""The report's "Circuit formation" section: one timeline per task kind (membership, classification,
prediction, regression), each of a tiny run trained in memory with a few checkpoints and compared with
its exact construction at every one (``exactlens timeline``), drawn by exactlens.viz.timeline.

Kept cheap on purpose (the report's time budget): few training steps, three checkpoints, few words and
DAS steps; the settings are stated in the section and recorded in report.json. A task whose construction
the report does not cover is left out; a failing timeline becomes an error box, never a failed report.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from exactlens.viz.page import ReportContext, Section, esc, progress


@dataclass(frozen=True)
class FormationRun:
    kind: str  # the task kind
    train_name: str  # a paper preset or a construction name (exactlens train)
    against: str
    lengths: tuple[int, ...]
    options: dict[str, Any] = field(default_factory=dict)
    quick_options: dict[str, Any] = field(default_factory=dict)
    long_lengths: tuple[int, ...] | None = None
    das: bool = False  # DAS (the alignment part) in the full report: only where the variables are few
    parts: tuple[str, ...] | None = None  # the parts without DAS (None: WITHOUT_DAS)


RUNS = (
    FormationRun("membership", "first", "first", (4, 8), long_lengths=(64,), das=True,
                 options={"epochs": 40, "strings_per_epoch": 100, "batch_size": 20, "train_length": [1, 8],
                          "test_length": 64, "test_strings": 50, "lr": 3e-3, "eval_every": 0},
                 quick_options={"epochs": 6}),
    FormationRun("classification", "majority", "majority", (20,), long_lengths=(50,),
                 options={"epochs": 20, "strings_per_epoch": 1000, "batch_size": 100, "lr": 1e-2,
                          "lr_schedule": "constant", "train_length": 20, "test_length": 50, "test_strings": 200,
                          "eval_every": 0},
                 quick_options={"epochs": 2, "strings_per_epoch": 200}),
    FormationRun("prediction", "induction-recent", "induction-recent", (6, 10),
                 options={"epochs": 30, "eval_every": 0}, quick_options={"epochs": 10}),
    FormationRun("regression", "sm-solution2", "sm-solution2", (8, 16),
                 options={"epochs": 40, "eval_every": 0}, quick_options={"epochs": 5},
                 # probes and circuit discovery on this model (d 60, an FFN of 240) took ~100 s a checkpoint
                 parts=("behaviour", "attention")),
)

CHECKPOINT_FRACTIONS = (0.0, 0.15, 1.0)  # steps kept: these fractions of the run's steps (0 and the last)
TIMELINE = {"strings": 10, "das_steps": 20, "alignment_pairs": 10}
# DAS is ~95 % of a timeline's time (measured: 38 s of 40 s for four FIRST checkpoints) and grows with the
# variables (MAJORITY has 22): the full report fits it only where they are few; --quick (the tests') never
WITHOUT_DAS = ["behaviour", "probes", "attention", "circuit"]
QUICK_TIMELINE = {"strings": 8}


def timeline_settings(ctx: ReportContext, spec: FormationRun) -> dict[str, Any]:
    parts = list(spec.parts or WITHOUT_DAS)
    if ctx.quick:
        return {**QUICK_TIMELINE, "parts": parts}
    return dict(TIMELINE) if spec.das else {"strings": TIMELINE["strings"], "parts": parts}


def checkpoint_steps(total: int) -> list[int]:
    return sorted({round(f * total) for f in CHECKPOINT_FRACTIONS})


def total_steps(preset: str, options: dict[str, Any]) -> int:
    """The optimizer steps of a run (Adam: epochs x steps per epoch), from its resolved options."""
    from exactlens.train.presets import get_preset

    o = get_preset(preset).spec(options).options
    return o["epochs"] * (o["strings_per_epoch"] // o["batch_size"])


def formation_run(ctx: ReportContext, spec: FormationRun) -> tuple[Any, dict[str, Any], float]:
    """Train ``spec``'s run with its checkpoints; its timeline against the construction; the seconds."""
    from exactlens.analysis.timeline import timeline
    from exactlens.train import train

    options = {**spec.options, **(spec.quick_options if ctx.quick else {})}
    start = time.perf_counter()
    steps = checkpoint_steps(total_steps(spec.train_name, options))
    run = train(spec.train_name, seed=0, checkpoints=",".join(map(str, steps)), device=ctx.device, **options)
    settings = timeline_settings(ctx, spec)
    result = timeline(run, spec.against, lengths=list(spec.lengths), quiet=True, device=ctx.device,
                      long_lengths=list(spec.long_lengths) if spec.long_lengths else None, **settings)
    return run, result, time.perf_counter() - start


def formation_html(ctx: ReportContext, spec: FormationRun) -> str:
    from exactlens.viz.timeline import checkpoint_models, timeline_html, write_attention_views, write_figures

    progress(f"report: formation timeline of {spec.train_name} against {spec.against}")
    run, result, seconds = formation_run(ctx, spec)
    anchor = f"formation-{spec.kind}"
    data = ctx.write_json(f"{anchor}.json", result)
    figure, strip = write_figures(result, ctx.out_dir / "figures" / anchor)
    views = write_attention_views(result, checkpoint_models(run.checkpoints, result),
                                  ctx.out_dir / "attention" / anchor, bundle_dir=ctx.bundle_dir)
    options = {**spec.options, **(spec.quick_options if ctx.quick else {})}
    settings = timeline_settings(ctx, spec)
    intro = (f"<h3>{esc(spec.kind)}: <code>exactlens train {esc(spec.train_name)}</code> against "
             f"<code>{esc(spec.against)}</code></h3><p>Trained with {esc(options)}, seed 0, checkpoints at steps "
             f"{esc(', '.join(str(c.step) for c in run.checkpoints))}; timeline on |w| in {esc(list(spec.lengths))} "
             f"with {esc(settings)} ({seconds:.1f} s, training included). JSON: "
             f'<a href="{esc(data)}">{esc(data)}</a>.</p>')
    return intro + timeline_html(result, ctx.rel(figure), ctx.rel(strip) if strip else None,
                                 [(caption, ctx.rel(path)) for caption, path in views])


def formation_sections(ctx: ReportContext) -> list[Section]:
    chosen = [spec for spec in RUNS if spec.against in ctx.names]
    if ctx.quick:  # a smoke version: the first task kind only (each timeline adds training, a diff per checkpoint
        chosen = chosen[:1]  # and attention views)
    if not chosen:
        return []
    ctx.record_settings(formation={"checkpoint_fractions": list(CHECKPOINT_FRACTIONS),
                                   "timeline": {s.kind: timeline_settings(ctx, s) for s in chosen},
                                   "runs": {s.kind: s.train_name for s in chosen}})
    parts = ["<p>When does a trained model become the exact circuit? For each task kind, a tiny run is trained "
             "with three checkpoints (at 0, 15 % and 100 % of its training steps) and each checkpoint is "
             "compared with the exact construction (<code>exactlens timeline RUN --against NAME</code>, "
             "docs/formation.md): behaviour, agreement, per variable the alignment verdict with its interval, "
             "attention, circuit overlap, and the formation events (the alignment verdicts, DAS, only where a task "
             "has few variables, FIRST here, and not with --quick: DAS is most of a timeline's time; --quick also "
             "shows only the first task kind). These runs "
             "are far too short to show a mechanism forming reliably; they show the tool. docs/formation.md has "
             "the findings at larger settings.</p>"]
    for spec in chosen:
        try:
            parts.append(formation_html(ctx, spec))
        except Exception as err:  # one failing timeline must not take the report down
            parts.append(ctx.error(f"formation timeline {spec.kind}", err))
    return [Section("Circuit formation", "circuit-formation", "\n".join(parts))]

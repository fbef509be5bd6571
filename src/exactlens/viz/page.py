"""The page framework of the offline HTML report (``exactlens report [NAME ...] --out DIR``).

index.html is a list of :class:`Section`s. Each comes from a *section builder*, a function
``(ReportContext) -> list[Section]`` registered with :func:`register_section` (the generic
sections in exactlens.viz.sections, a paper's from its plug-in); the page shows them in the
order of their ``order`` number. Builders write their assets next to the page through the
context: attention/*.html (circuitsvis; its JavaScript once, in assets/circuitsvis.js), figures/*.png,
data/*.json.
Nothing is loaded from the network. Every text in the page is escaped with html.escape;
progress goes to stderr. A builder that fails does not take the page down: its error is
shown in the page and recorded in data/report.json, and once the report is in place
``build_report`` raises :class:`ReportIncomplete` (the CLI exits 2) naming the failed parts.
A write error (a full disk, a file-size limit) is not a section's failure: it aborts the
whole report, and the old report (or nothing) stays in place.
"""

from __future__ import annotations

import datetime
import html
import math
import re
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from exactlens.constructions import get
from exactlens.constructions import names as registered_names
from exactlens.errors import ExactLensError
from exactlens.jsonio import dumps
from exactlens.outputs import naming, staged, write_error
from exactlens.plugins import Lazy, Registry, lazy
from exactlens.progress import bar
from exactlens.progress import say as progress  # the report builders' name for it
from exactlens.resources import torch_threads
from exactlens.version import __version__
from exactlens.viz.images import shrink_pngs

# ---- sections and the context builders share ----------------------------------------


@dataclass
class Section:
    """One part of the page: an anchor id, a title, and an HTML fragment (already escaped)."""

    title: str
    id: str
    html: str


@dataclass(frozen=True)
class ReportSettings:
    """Settings of the generic sections (a paper's sections keep their own full/quick settings)."""

    verify_lengths: tuple[int, ...]
    verify_strings: int
    precision_max_length: int
    precision_strings: int
    precision_points_per_decade: int
    example_length: int


FULL = ReportSettings(
    verify_lengths=(1, 2, 3, 4, 8, 12, 16, 32, 64, 128),
    verify_strings=256,
    precision_max_length=1000,
    precision_strings=4,
    precision_points_per_decade=8,
    example_length=8,
)
QUICK = ReportSettings(
    verify_lengths=(1, 2, 4, 8, 16),
    verify_strings=32,
    precision_max_length=64,
    precision_strings=4,
    precision_points_per_decade=8,
    example_length=8,
)


@dataclass
class ReportContext:
    out_dir: Path
    names: list[str]
    quick: bool
    settings: ReportSettings
    errors: list[dict[str, str]] = field(default_factory=list)
    section_settings: dict[str, Any] = field(default_factory=dict)  # a section's own, for report.json
    device: Any = None  # torch.device of the verify, precision, training and diff work (None: the CPU)
    user_model: dict[str, Any] | None = None  # {"model", "against", "task", "readout"}: the user's model's section
    jobs: int = 1  # processes for the independent work (exactlens.viz.parallel)
    prepared: dict[tuple, tuple] = field(default_factory=dict)  # per-construction parts done in workers
    work_seconds: dict[str, float] = field(default_factory=dict)  # builder -> seconds of its parts in workers
    tasks: list[dict[str, Any]] = field(default_factory=list)  # each worker task's wall and CPU seconds

    def part(self, run: Callable[[ReportContext, str], Any], name: str) -> Any:
        """A builder's per-construction part (exactlens.viz.parallel.per_construction): done in a worker
        (its errors and settings merged now, in page order), or run here."""
        from exactlens.viz.parallel import Failed, key

        done = self.prepared.pop(key(run, name), None)
        if done is None:
            return run(self, name)
        value, seconds, errors, settings = done
        self.errors += errors
        self.section_settings.update(settings)
        self.work_seconds[run.__qualname__] = self.work_seconds.get(run.__qualname__, 0.0) + seconds
        if isinstance(value, Failed):
            raise value.error
        return value

    def device_for(self, dtype: str) -> Any:
        """The device of work in ``dtype``: the report's, or the CPU for float64 on MPS (which has none)."""
        if self.device is not None and self.device.type == "mps" and dtype == "float64":
            return None
        return self.device

    def record_settings(self, **settings: Any) -> None:
        """Settings a section ran with (report.json "settings" lists them next to the generic ones)."""
        self.section_settings.update(settings)

    def asset(self, kind: str, filename: str) -> Path:
        """out_dir/kind/filename, its folder created."""
        folder = self.out_dir / kind
        folder.mkdir(parents=True, exist_ok=True)
        return folder / filename

    @property
    def bundle_dir(self) -> Path:
        """Where the report's attention pages share circuitsvis's JavaScript (written once)."""
        return self.out_dir / "assets"

    def rel(self, path: Path) -> str:
        return path.relative_to(self.out_dir).as_posix()

    def write_json(self, filename: str, obj: Any) -> str:
        """Write data/filename (strict JSON: NaN and infinities become null; compact, without indentation,
        which would make the report's data a third larger); return its relative path."""
        path = self.asset("data", filename)
        with naming(path):
            path.write_text(dumps(obj, separators=(",", ":")) + "\n", encoding="utf-8")
        return self.rel(path)

    def covers(self, paper_prefix: str) -> bool:
        """Whether the report includes a construction of this paper (its ``paper`` starts with the prefix)."""
        return any(get(n).paper.startswith(paper_prefix) for n in self.names)

    def error(self, where: str, err: BaseException) -> str:
        """Record an error (stderr, report.json) and return a visible HTML note. A write error is
        raised again instead: a report with a file missing or cut short must never be committed."""
        if write_error(err) is not None:
            raise err
        progress(f"report: {where} failed: {err}")
        traceback.print_exception(err, file=sys.stderr)
        self.errors.append({"where": where, "error": f"{type(err).__name__}: {err}"})
        return f'<p class="error">{esc(where)} failed: {esc(type(err).__name__)}: {esc(str(err))}</p>'


SectionBuilder = Callable[[ReportContext], list[Section]]
IN_PARENT = ("overview_sections", "model_sections")
"""Builders that always run in the report's own process: quick ones, and the user's model's (the model
may be an object in this process). Every other builder of exactlens and its papers may run in a worker
(exactlens.viz.parallel); a builder added at run time (a test's) runs here."""


class ReportIncomplete(ExactLensError):
    """The report was written, but some of its parts failed (their errors are on the page and in
    data/report.json). ``index``: the written index.html; ``errors``: ``[{"where", "error"}, ...]``."""

    def __init__(self, index: Path, errors: list[dict[str, str]]):
        self.index = index
        self.errors = errors
        listed = "; ".join(f"{e['where']} ({e['error']})" for e in errors[:3]) + ("; ..." if len(errors) > 3 else "")
        super().__init__(f"wrote {index}, but {len(errors)} part(s) of it failed: {listed}; their errors are shown "
                         "on the page and in data/report.json")


# ---- small HTML helpers ------------------------------------------------------------


def esc(value: Any) -> str:
    return html.escape(str(value), quote=True)


def slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name)


def fmt(value: Any, digits: int = 4) -> str:
    """Numbers for tables: integers as is, small/large floats in exponent form."""
    if isinstance(value, bool) or value is None:
        return str(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            return str(value)
        if value != 0 and (abs(value) < 1e-3 or abs(value) >= 1e5):
            return f"{value:.{digits - 1}e}"
        return f"{value:.{digits}f}"
    return str(value)


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]], caption: str | None = None) -> str:
    head = "".join(f"<th>{esc(h)}</th>" for h in headers)
    body = "\n".join("<tr>" + "".join(f"<td>{esc(fmt(v))}</td>" for v in row) + "</tr>" for row in rows)
    cap = f"<caption>{esc(caption)}</caption>" if caption else ""
    return f"<table>{cap}<thead><tr>{head}</tr></thead>\n<tbody>\n{body}\n</tbody></table>"


def figure(ctx: ReportContext, path: Path, alt: str, caption: str) -> str:
    return (
        f'<figure><a href="{esc(ctx.rel(path))}"><img src="{esc(ctx.rel(path))}" alt="{esc(alt)}"></a>'
        f"<figcaption>{esc(caption)}</figcaption></figure>"
    )


# ---- registered sections -------------------------------------------------------------


@dataclass(frozen=True)
class RegisteredSection:
    name: str
    builder: SectionBuilder | Lazy  # a Lazy ("module:function") is imported when the report is built
    order: int  # page position: generic sections 0-99, papers 100 and up


SECTIONS: dict[str, RegisteredSection] = Registry("report sections")


def register_section(name: str, builder: SectionBuilder | Lazy, order: int = 500) -> SectionBuilder | Lazy:
    """Add a section builder to every report (exactlens's papers register theirs from their plug-ins);
    ``exactlens.plugins.lazy("module:function")`` defers its import to the report."""
    existing = SECTIONS.peek(name)
    if existing is not None and existing.builder is not builder and existing.builder != builder:
        raise ValueError(f"a different report section named {name!r} is already registered")
    SECTIONS[name] = RegisteredSection(name, builder, order)
    return builder


def section_builders() -> list[SectionBuilder]:
    """Every registered builder, in page order (lazily registered ones imported now)."""
    ordered = sorted(SECTIONS.values(), key=lambda s: (s.order, s.name))
    return [s.builder.load() if isinstance(s.builder, Lazy) else s.builder for s in ordered]


# The generic sections (exactlens.viz.sections), imported when a report is built.
register_section("overview", lazy("exactlens.viz.sections:overview_sections"), order=0)
register_section("constructions", lazy("exactlens.viz.sections:construction_sections"), order=10)
register_section("circuit-discovery", lazy("exactlens.viz.circuit_sections:discovery_sections"), order=20)
register_section("your-model", lazy("exactlens.viz.model_section:model_sections"), order=30)
register_section("circuit-formation", lazy("exactlens.viz.formation_sections:formation_sections"), order=90)
register_section("known-circuits", lazy("exactlens.viz.siit_sections:siit_sections"), order=95)


# ---- the page --------------------------------------------------------------------

CSS = """
body { font-family: system-ui, -apple-system, sans-serif; margin: 0 auto; max-width: 1200px; padding: 1em 2em;
       color: #222; line-height: 1.4; }
h1 { font-size: 1.6em; } h2 { border-bottom: 1px solid #ccc; margin-top: 2em; } h3 { margin-top: 1.2em; }
nav ul { columns: 3; font-size: .9em; }
table { border-collapse: collapse; margin: .5em 0 1em; font-size: .85em; display: block; max-width: 100%;
        overflow-x: auto; }
th, td { border: 1px solid #ddd; padding: 2px 6px; text-align: right; }
th { background: #f4f4f4; } td:nth-child(2) { text-align: left; }
pre, code { overflow-wrap: anywhere; } pre { overflow-x: auto; } img, svg { max-width: 100%; height: auto; }
.side > * { min-width: 0; max-width: 100%; }
caption { text-align: left; font-weight: bold; }
.side { display: flex; gap: 2em; flex-wrap: wrap; align-items: flex-start; }
pre.doc { background: #f8f8f8; padding: .5em; white-space: pre-wrap; font-size: .85em; }
code { background: #f3f3f3; padding: 0 .2em; }
figure { margin: .5em 0; } figure img { max-width: 100%; border: 1px solid #eee; }
figcaption { font-size: .85em; color: #555; }
iframe { width: 100%; height: 520px; border: 1px solid #ddd; }
.error { color: #a00; font-weight: bold; } .paper { color: #555; } .data { font-size: .85em; color: #555; }
"""


def render_page(sections: Sequence[Section], title: str, footer: str) -> str:
    nav = "".join(f'<li><a href="#{esc(s.id)}">{esc(s.title)}</a></li>' for s in sections)
    body = "\n".join(f'<section id="{esc(s.id)}">\n<h2>{esc(s.title)}</h2>\n{s.html}\n</section>' for s in sections)
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f"<title>{esc(title)}</title>\n<style>{CSS}</style>\n</head>\n<body>\n"
        f"<h1>{esc(title)}</h1>\n<nav><ul>{nav}</ul></nav>\n{body}\n"
        f'<footer><p class="data">{footer}</p></footer>\n</body>\n</html>\n'
    )


def build_report(
    names: list[str] | None,
    out_dir: str | Path,
    quick: bool = False,
    builders: Sequence[SectionBuilder] | None = None,
    threads: int | None = 1,
    overwrite: bool = False,
    command: str | None = None,
    device: Any = None,
    model: Any = None,
    against: str | None = None,
    task: str | None = None,
    readout: Any = None,
    jobs: int | None = None,
) -> Path:
    """Write out_dir/index.html and its assets for the given constructions (default: all
    registered); return the path of index.html. ``out_dir`` is written as one new directory that
    appears only when the report is complete; an existing non-empty one is refused unless
    ``overwrite`` (then replaced as a whole, never mixed with the new pages). ``command``: how the
    report was asked for, shown on the index with the version and time (default: this call).

    ``threads``: torch threads while building (None: as set). The default is one: the
    work is many small tensor operations, for which more threads cost more in
    synchronization than they gain (on a shared two-core machine we measured 2 threads
    3 to 10 times slower than 1).

    ``device`` (exactlens.devices; None: the CPU): where the report's verify, precision, training and
    diff work runs (the papers' figure code runs on the CPU); report.json records it.

    ``model``: a section for a user's model (a checkpoint directory, an ExactTransformer, a TransformerLens
    model; exactlens.viz.model_section), compared with the construction ``against``; ``task`` and
    ``readout`` for a model that records no task or answers elsewhere. With a model and no names, the report
    has no construction sections.

    ``jobs``: processes for the independent work, each construction's parts and the papers' sections
    (exactlens.viz.parallel; None: the CPU cores, at most 8). The page is the same for every ``jobs``
    but for the times it states.
    """
    from exactlens.devices import resolve_device

    if isinstance(names, str):  # one name, never its letters
        names = [names]
    elif names is not None:
        try:
            names = list(names)
        except TypeError:
            raise ExactLensError(f"report names are a list of construction names, got {names!r}") from None
    for name in names or ():
        if not isinstance(name, str):
            raise ExactLensError(f"a report name is a construction name (a string), got {name!r}")
    if model is None and (against, task, readout) != (None, None, None):
        raise ExactLensError("against, task and readout describe a model: give model= (--model) too")
    selected = list(dict.fromkeys(names)) if names else ([] if model is not None else registered_names())
    for name in selected + ([against] if against is not None else []):
        get(name)  # unknown names fail before any work
    user_model = None if model is None else {"model": model, "against": against, "task": task, "readout": readout}
    if model is not None:  # a model that cannot be read, or a wrong task or readout, fails before any work
        from exactlens.interop.model_target import model_target

        model_target(model, task, readout)
    where = resolve_device(device)
    if jobs is None:
        from exactlens.viz.parallel import default_jobs

        jobs = default_jobs()
    elif isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise ExactLensError(f"jobs is a number of processes, an integer >= 1; got {jobs!r}")
    with torch_threads(threads), staged(out_dir, overwrite=overwrite, what="report directory") as tmp:
        progress(f"report: {len(selected)} constructions -> {Path(out_dir) / 'index.html'}"
                 f"{' (quick)' if quick else ''}")
        made = {
            "command": command or f"exactlens.viz.build_report({selected!r}, {str(out_dir)!r}, quick={quick})",
            "version": __version__,
            "time": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        }
        errors = _build_report(selected, tmp, quick, builders, made, where, user_model, jobs)
    index = Path(out_dir) / "index.html"
    progress(f"report: wrote {index}")
    if errors:
        raise ReportIncomplete(index, errors)
    return index


def _pages_list(out: Path) -> str:
    """Links to every page of the report but the index (attention views, diff pages)."""
    pages = sorted(p for p in out.rglob("*.html") if p != out / "index.html")
    items = "".join(f'<li><a href="{esc(p.relative_to(out).as_posix())}">{esc(p.relative_to(out).as_posix())}</a></li>'
                    for p in pages)
    return f"<details><summary>All {len(pages)} pages of this report</summary><ul>{items}</ul></details>"


def _times_text(timings: dict[str, float], cpu_timings: dict[str, float], ctx: ReportContext) -> str:
    """How long each section took (wall seconds, then CPU seconds where each ran), the per-construction and
    declared parts' seconds in the workers, and the workers' tasks that took the most CPU."""
    text = ", ".join(f"{k} {v:.1f} s" for k, v in timings.items())
    text += "; CPU: " + ", ".join(f"{k} {v:.1f} s" for k, v in cpu_timings.items())
    if ctx.work_seconds:
        text += "; in the workers: " + ", ".join(f"{k} {v:.1f} s" for k, v in ctx.work_seconds.items())
    if ctx.tasks:
        longest = sorted(ctx.tasks, key=lambda t: -t["cpu_seconds"])[:5]
        text += (f"; {len(ctx.tasks)} worker tasks, {sum(t['cpu_seconds'] for t in ctx.tasks):.1f} s of CPU, "
                 "the most: " + ", ".join(f"{t['task']} {t['cpu_seconds']:.1f} s" for t in longest))
    return text


def _build_report(selected: list[str], out: Path, quick: bool, builders: Sequence[SectionBuilder] | None,
                  made: dict[str, str], device: Any = None,
                  user_model: dict[str, Any] | None = None, jobs: int = 1) -> list[dict[str, str]]:
    from exactlens.devices import device_name

    start = time.perf_counter()
    ctx = ReportContext(out_dir=out, names=selected, quick=quick, settings=QUICK if quick else FULL, device=device,
                        user_model=user_model, jobs=jobs)
    sections: list[Section] = []
    timings: dict[str, float] = {}
    cpu_timings: dict[str, float] = {}  # the same builders' CPU seconds (time.process_time where each ran)
    chosen = section_builders() if builders is None else list(builders)
    whole = {}
    if jobs > 1:
        from exactlens.viz.parallel import run_parallel

        t0 = time.perf_counter()
        in_workers = [b for b in chosen if b.__module__.startswith("exactlens.") and b.__name__ not in IN_PARENT
                      and not hasattr(b, "per_construction") and not hasattr(b, "per_part")]
        whole = run_parallel(ctx, chosen, in_workers, jobs)
        timings["parallel_work"] = time.perf_counter() - t0  # wall of the work in workers, before the page
    for builder in bar(chosen, desc="report sections", unit="section"):
        t0, c0 = time.perf_counter(), time.process_time()
        if builder in whole:  # built in a worker: its sections, seconds there, errors, settings, CPU seconds
            built, seconds, errors, settings, cpu_timings[builder.__name__] = whole[builder]
            sections += built
            ctx.errors += errors
            ctx.section_settings.update(settings)
            timings[builder.__name__] = seconds
            continue
        sections += builder(ctx)
        timings[builder.__name__] = time.perf_counter() - t0
        cpu_timings[builder.__name__] = time.process_time() - c0
    t0 = time.perf_counter()
    png_bytes = shrink_pngs(out)
    timings["shrink_pngs"] = time.perf_counter() - t0
    seconds = time.perf_counter() - start
    ctx.write_json(
        "report.json",
        {
            "constructions": selected,
            "quick": quick,
            "device": device_name(device if device is not None else "cpu"),
            "settings": {**asdict(ctx.settings), **ctx.section_settings},
            "sections": [{"id": s.id, "title": s.title} for s in sections],
            "timings": timings,
            "jobs": jobs,
            # seconds that per-construction parts took in worker processes, by part (jobs > 1)
            "work_seconds": ctx.work_seconds,
            "cpu_timings": cpu_timings,
            # each task of the worker processes (jobs > 1): {"task", "seconds", "cpu_seconds"}, in start order
            "tasks": ctx.tasks,
            "seconds": seconds,
            "errors": ctx.errors,
            "made": made,
            # the figures' bytes as drawn and as written (256-colour palette: exactlens.viz.images)
            "png_bytes": {"drawn": png_bytes[0], "written": png_bytes[1]},
        },
    )
    footer = (
        f"Made by <code>{esc(made['command'])}</code> (exactlens {esc(made['version'])}) at {esc(made['time'])}. "
        f"exactlens report, {len(selected)} constructions, built in {seconds:.1f} s"
        f"{' (quick settings)' if quick else ''}"
        + (f" with {jobs} processes" if jobs > 1 else "") + "; " + esc(_times_text(timings, cpu_timings, ctx))
        + '. Data: <a href="data/report.json">data/report.json</a>.'
    )
    if ctx.errors:
        footer += f' <span class="error">{len(ctx.errors)} error(s); see data/report.json.</span>'
    footer += _pages_list(out)
    with naming(out / "index.html"):
        (out / "index.html").write_text(render_page(sections, "exactlens report", footer), encoding="utf-8")
    slowest = sorted(timings.items(), key=lambda item: -item[1])  # where the time went, longest first
    progress(f"report: done in {seconds:.1f} s; " + ", ".join(f"{name} {t:.1f} s" for name, t in slowest))
    if ctx.tasks:
        busiest = sorted(ctx.tasks, key=lambda t: -t["cpu_seconds"])[:10]
        progress(f"report: {len(ctx.tasks)} worker tasks, {sum(t['cpu_seconds'] for t in ctx.tasks):.1f} s of CPU; "
                 + ", ".join(f"{t['task']} {t['cpu_seconds']:.1f} s ({t['seconds']:.1f} s wall)" for t in busiest))
    return ctx.errors

"""Sweeps: grids of jobs (train, diff, discover, any verb) run on this machine, on a Ray cluster or in
slices under any scheduler, with one results table (docs/sweeps.md).

``run_sweep(spec, out, ...)`` is the work of ``exactlens sweep`` / ``el.sweep``: read and check the spec
(exactlens.sweep.spec), skip the jobs already finished in ``out``, run the rest in units
(exactlens.sweep.engines, exactlens.sweep.runner) and write the table and summary after each unit
(exactlens.sweep.table). Like ``exactlens.train``, the package is also the verb: ``el.sweep(...)``."""

from __future__ import annotations

import os
import re
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from exactlens.callable_package import make_callable
from exactlens.errors import ExactLensError
from exactlens.sweep.spec import Job, Sweep, load_sweep, parse_sweep

__all__ = ["Job", "Sweep", "estimate", "load_sweep", "parse_sweep", "planned", "run_sweep"]


LEFTOVER = re.compile(r"\..*\.(?:partial|replaced|work)-(\d+)(?:-h([A-Za-z0-9]+))?-")
"""What a process leaves while it writes: staging siblings (``.NAME.partial-PID-...``), replaced outputs and a
job's scratch directory (``.ID.work-PID-hHOST-...``)."""


def _clean_partials(root: Path, shared: bool) -> None:
    """Remove what a dead process left in the sweep's directory and in ``jobs/``: its hidden staging siblings
    (``.ID.partial-PID-...``, the tables' too) and scratch directories (``.ID.work-PID-hHOST-...``). A scratch
    directory is another machine's where HOST differs (left alone); a staging sibling names no machine, so with
    ``shared`` (slices that may be writing from other machines) only one older than ten minutes is removed (a
    job's directory is written in seconds)."""
    for folder in (root, root / "jobs"):
        if folder.is_dir():
            _clean_folder(folder, shared)


def _clean_folder(folder: Path, shared: bool) -> None:
    from exactlens.sweep.runner import host_tag

    for entry in folder.iterdir():
        match = LEFTOVER.match(entry.name)
        if match is None:
            continue
        pid, host = int(match.group(1)), match.group(2)
        if host is not None and host != host_tag():
            continue
        if host is None and shared and time.time() - entry.stat().st_mtime < 600:
            continue
        try:
            os.kill(pid, 0)
            alive = pid != os.getpid()
        except ProcessLookupError:
            alive = False
        except PermissionError:
            alive = True
        if not alive:
            shutil.rmtree(entry, ignore_errors=True) if entry.is_dir() else entry.unlink(missing_ok=True)


def run_sweep(spec: str | Path, out: str | Path, *, engine: str = "local", address: str | None = None,
              shard: str | None = None, workers: int | None = None, resume: bool = False,
              progress: bool = True) -> dict[str, Any]:
    from exactlens.progress import bar
    from exactlens.sweep.engines import ENGINES, import_ray, parse_shard, plan_units, run_local, run_ray
    from exactlens.sweep.runner import read_row
    from exactlens.sweep.table import collect_rows, write_summary, write_table

    if engine not in ENGINES:
        raise ExactLensError(f"engine must be one of {', '.join(ENGINES)}, got {engine!r}")
    if engine == "ray":
        import_ray()  # says how to install it before any work
    if address is not None and engine != "ray":
        raise ExactLensError("--address joins a Ray cluster: use it with --engine ray")
    slice_ = parse_shard(shard)
    sweep = load_sweep(spec)
    root = _sweep_root(out, resume or slice_ is not None)
    _clean_partials(root, shared=slice_ is not None)
    done = {j.id for j in sweep.jobs if (read_row(root, j.id) or {}).get("status") == "ok"}
    units = plan_units(sweep, done, slice_)
    todo = sum(len(u) for u in units)
    start = time.perf_counter()
    ran: list[dict[str, Any]] = []
    with bar(total=todo, desc="sweep", unit="job", min_items=1 if progress else 10**9) as meter:

        def report(rows: list[dict[str, Any]]) -> None:
            ran.extend(rows)
            meter.update(len(rows))
            write_table(collect_rows(sweep, root), root)

        try:
            if engine == "ray":
                run_ray(units, root, report, address)
            else:
                run_local(units, root, report, workers)
        except BaseException:  # Ctrl-C, a kill: the table still shows every job that finished
            write_table(collect_rows(sweep, root), root)
            raise
    rows = collect_rows(sweep, root)
    tables = write_table(rows, root)
    if slice_ is not None:
        mine = {j.id for j in planned(sweep, shard).jobs}
        write_table([r for r in rows if r["job"] in mine], root, f"results.shard{slice_[0]}of{slice_[1]}")
    summary = write_summary(rows, root, f"sweep {Path(spec).name}")
    return {
        "spec": str(spec), "out": str(root), "engine": engine, "shard": shard, "jobs": len(sweep.jobs),
        "ran": len(ran), "kept": len(done), "ok": sum(r["status"] == "ok" for r in rows),
        "failed": sum(r["status"] == "failed" for r in rows), "skipped": sum(r["status"] == "skipped" for r in rows),
        "missing": len(sweep.jobs) - len(rows), "seconds": round(time.perf_counter() - start, 3),
        "table": [str(p) for p in tables], "summary": str(summary), "rows": rows,
    }


def _sweep_root(out: str | Path, continuing: bool) -> Path:
    """The sweep's directory, checked before any work: a new or empty directory, or a sweep's own (``jobs/``)
    with --resume or --shard; anything else is refused (a sweep never replaces a user's files)."""
    root = Path(out).expanduser().absolute()
    if root.is_file():
        raise ExactLensError(f"sweep output {out} is a file; give a directory")
    mine = (root / "jobs").is_dir()
    if root.is_dir() and not mine and any(LEFTOVER.match(e.name) is None for e in root.iterdir()):
        raise ExactLensError(f"{out} is a directory that holds no sweep (no jobs/); a sweep writes its tables there, "
                             "so give a new or empty directory")
    if mine and any((root / "jobs").iterdir()) and not continuing:
        raise ExactLensError(f"{out} already holds a sweep; pass --resume to continue it (finished jobs are kept, "
                             "failed ones rerun) or choose another directory")
    (root / "jobs").mkdir(parents=True, exist_ok=True)
    return root


def planned(sweep: Sweep, shard: str | None) -> Sweep:
    """The jobs a slice (``shard`` 'i/n') runs, as ``run_sweep`` cuts them (the whole sweep without one)."""
    from exactlens.sweep.engines import parse_shard, plan_units

    slice_ = parse_shard(shard)
    if slice_ is None:
        return sweep
    mine = {j.id for unit in plan_units(sweep, set(), slice_) for j in unit}
    return Sweep(sweep.path, [j for j in sweep.jobs if j.id in mine])


def estimate(sweep: Sweep, out: str | Path | None = None) -> dict[str, Any]:
    """What a sweep will cost: jobs per verb, training word-steps, checkpoint disk, and where ``out``
    already holds rows of the same jobs or verbs, their measured seconds."""
    from exactlens.sweep.runner import read_row

    per_verb: dict[str, int] = {}
    for job in sweep.jobs:
        per_verb[job.verb] = per_verb.get(job.verb, 0) + 1
    words = 0
    disk = 0
    for job in sweep.jobs:
        if job.verb == "train":
            w, d = _train_cost(job)
            words += w
            disk += d
        disk += 20_000  # the job's JSON result and row: a rough allowance
    measured: dict[str, list[float]] = {}
    if out is not None:
        for job in sweep.jobs:
            row = read_row(out, job.id)
            if row is not None and row["status"] == "ok":
                measured.setdefault(job.verb, []).append(row["seconds"])
    seconds = None
    if measured and all(v in measured for v in per_verb):
        seconds = sum(per_verb[v] * sum(s) / len(s) for v, s in measured.items())
    return {"jobs": len(sweep.jobs), "per_verb": per_verb, "train_word_steps": words, "disk_bytes": disk,
            "measured_seconds_per_job": {v: sum(s) / len(s) for v, s in measured.items()},
            "cpu_seconds": seconds}


def _train_cost(job: Job) -> tuple[int, int]:
    """Words trained on (epochs x strings_per_epoch) and the disk a run takes (exactlens.train.budget, the
    estimate training itself checks)."""
    from exactlens.train.budget import training_cost
    from exactlens.train.presets import get_preset

    options = {k: v for k, v in job.options.items() if k not in ("name", "device", "progress")}
    cost = training_cost(get_preset(job.options["name"]).spec(options))
    return cost.words, int(cost.disk)


make_callable(sys.modules[__name__], "sweep")  # el.sweep(...) runs the verb (found in the registry)

"""Running one unit of a sweep: a stack of train jobs that differ only in their seed (one
``exactlens.train.train_many`` computation) or one job of another verb, then the jobs that follow
them (``then``), in order, in one process.

Each job writes one directory ``ROOT/jobs/<id>/`` through a staging sibling (exactlens.outputs.staged),
so a directory exists only complete: ``job.json`` (the job), ``result.json`` (the verb's JSON),
``row.json`` (its row of the results table) and ``output/`` (what the verb writes: a train job's
checkpoint). A job that fails is recorded with its one-line error (status "failed"); the jobs after it
are recorded "skipped"; neither stops the others.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import tempfile
import time
from pathlib import Path
from typing import Any

from exactlens import errors
from exactlens.errors import ExactLensError
from exactlens.jsonio import dumps, jsonable
from exactlens.outputs import staged
from exactlens.sweep.spec import Job

__all__ = ["ROW_FILE", "job_dir", "read_row", "run_unit"]

ROW_FILE = "row.json"
OUTPUT = "output"


def job_dir(root: str | Path, job_id: str) -> Path:
    return Path(root) / "jobs" / job_id


ROW_FIELDS = {"job": str, "verb": str, "status": str, "options": dict, "grid": dict, "headline": dict,
              "seconds": (int, float), "seed": int, "stacked": int, "line": int, "dir": str,
              "parent": (str, type(None)), "error": (str, type(None))}
STATUSES = ("ok", "failed", "skipped")


def read_row(root: str | Path, job_id: str) -> dict[str, Any] | None:
    """A job's row, or None where it has none that can be trusted (missing, not UTF-8, not strict JSON,
    nested too deep, another job's, a field of the wrong type): such a job counts as not run, so --resume
    runs it again and its directory is replaced."""
    from exactlens.jsonio import loads

    path = job_dir(root, job_id) / ROW_FILE
    try:
        row = loads(path.read_bytes(), str(path))
    except (OSError, ExactLensError):
        return None
    if not isinstance(row, dict) or row.get("job") != job_id or row.get("status") not in STATUSES:
        return None
    if any(not isinstance(row.get(k), t) or isinstance(row.get(k), bool) for k, t in ROW_FIELDS.items()):
        return None
    return row


def _public(text: str, scratch: Path, root: Path, job: Job) -> str:
    """An error's text with the hidden scratch directory named as where its output goes (jobs/ID/output)."""
    final = job_dir(root, job.id)
    for hidden, shown in ((scratch / "runs" / f"seed{job.sweep_seed}", final / OUTPUT),
                          (scratch / OUTPUT, final / OUTPUT), (scratch, final)):
        text = text.replace(str(hidden), str(shown))
    return text


def host_tag() -> str:
    return re.sub(r"[^A-Za-z0-9]", "", socket.gethostname())[:32] or "host"


def _work_prefix(job: Job) -> str:
    """A job's scratch directory: hidden, named by process and machine (so only a dead process's is removed)."""
    return f".{job.id}.work-{os.getpid()}-h{host_tag()}-"


def one_line(err: BaseException) -> str:
    """An error as one line: an ExactLensError's every line joined, another error's first line and type."""
    lines = str(err).strip().splitlines()
    message = errors.one_line(str(err)) if isinstance(err, ExactLensError) else (lines[0].strip() if lines else "")
    return message if isinstance(err, ExactLensError) else f"{type(err).__name__}: {message}".rstrip(": ")


def _row(job: Job, status: str, seconds: float, error: str | None = None, headline: dict[str, Any] | None = None,
         stacked: int = 1) -> dict[str, Any]:
    return {"job": job.id, "verb": job.verb, "seed": job.sweep_seed, "options": job.options, "grid": job.grid,
            "parent": job.parent, "status": status, "error": error, "seconds": round(seconds, 4), "stacked": stacked,
            "headline": headline or {}, "dir": f"jobs/{job.id}", "line": job.line}


def _headline(result: Any) -> dict[str, Any]:
    from exactlens.results import VIEWS
    from exactlens.verb_registry import load_core_verbs

    load_core_verbs()  # the views register with their verbs (a fresh worker has imported none)
    view = VIEWS.get(getattr(result, "kind", ""))
    if view is None:
        return {}
    try:
        rows = view.headline(dict(result))
    except Exception:  # a view that cannot read this result shows no headline, the job still counts
        return {}
    return jsonable({str(k): v for k, v in rows})


def _write(root: Path, job: Job, row: dict[str, Any], data: dict[str, Any] | None, output: Path | None,
           crash: bool = True) -> None:
    with staged(job_dir(root, job.id), overwrite=True, what=f"job {job.id}") as tmp:
        (tmp / "job.json").write_text(dumps(job.to_dict()), encoding="utf-8")
        if data is not None:
            (tmp / "result.json").write_text(dumps(data), encoding="utf-8")
        if output is not None and output.exists():
            shutil.move(str(output), str(tmp / OUTPUT))
        if crash:
            crash_point(job)
        (tmp / ROW_FILE).write_text(dumps(row), encoding="utf-8")


def crash_point(job: Job) -> None:
    """For the tests: ``EXACTLENS_SWEEP_CRASH=<job id prefix>`` kills this process in the middle of
    writing that job's directory (as a killed worker would)."""
    target = os.environ.get("EXACTLENS_SWEEP_CRASH")
    if target and job.id.startswith(target):
        os._exit(17)


def run_unit(jobs: list[dict[str, Any]], root: str | Path) -> list[dict[str, Any]]:
    """Run a unit's jobs (dicts of Job.to_dict, parents before children) writing into ``root``; the rows."""
    import torch

    root = Path(root)
    todo = [Job.from_dict(j) for j in jobs]
    rows: dict[str, dict[str, Any]] = {}
    # torch threads = the unit's CPU request on every engine (the same reductions, so the same numbers)
    previous = torch.get_num_threads()
    torch.set_num_threads(max(1, min(int(max(j.cpus for j in todo)), os.cpu_count() or 1)))
    try:
        for job in todo:
            if job.id in rows:
                continue
            if job.verb == "train":
                stack = [j for j in todo if j.verb == "train" and j.group == job.group and j.id not in rows]
                rows.update(_train_stack(stack, root))
                continue
            rows[job.id] = _run_one(job, root, rows)
    finally:
        torch.set_num_threads(previous)
    return [rows[j.id] for j in todo]


def _parent_ok(job: Job, root: Path, rows: dict[str, dict[str, Any]]) -> str | None:
    """None where the parent finished; else why this job cannot run."""
    if job.parent is None:
        return None
    row = rows.get(job.parent) or read_row(root, job.parent)
    if row is None:
        return f"parent job {job.parent} has not run"
    if row["status"] != "ok":
        return f"parent job {job.parent} {row['status']}"
    return None


def _run_one(job: Job, root: Path, rows: dict[str, dict[str, Any]]) -> dict[str, Any]:
    from exactlens.sweep.check import first_parameter, takes_out, verb_spec
    from exactlens.verb_registry import verb_function

    blocked = _parent_ok(job, root, rows)
    if blocked is not None:
        row = _row(job, "skipped", 0.0, blocked)
        _write(root, job, row, None, None)
        return row
    scratch = Path(tempfile.mkdtemp(prefix=_work_prefix(job), dir=root))
    start = time.perf_counter()
    try:
        options = dict(job.options)
        args: list[Any] = []
        if job.parent is not None:
            args = [str(job_dir(root, job.parent) / OUTPUT)]
            if not Path(args[0]).exists():  # a parent without output: its JSON result is the input
                args = [str(job_dir(root, job.parent) / "result.json")]
            if first_parameter(job.verb) in options:
                raise ExactLensError(f"{first_parameter(job.verb)} of a `then` job is its parent's output")
        if job.seed is not None:
            options["seed"] = job.seed
        output = scratch / OUTPUT
        if takes_out(job.verb):
            options["out"] = str(output)
        result = verb_function(verb_spec(job.verb))(*args, **options)  # as el.VERB(...) runs it
        seconds = time.perf_counter() - start
        failure = getattr(result, "failure", None)
        data = result.to_dict() if hasattr(result, "to_dict") else jsonable(result)
        row = _row(job, "failed" if failure else "ok", seconds, failure, _headline(result))
        _write(root, job, row, data, output)
    except Exception as err:  # one job's failure never stops the others
        row = _row(job, "failed", time.perf_counter() - start, _public(one_line(err), scratch, root, job))
        _write(root, job, row, None, None)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return row


def _train_stack(stack: list[Job], root: Path) -> dict[str, dict[str, Any]]:
    """Train jobs that differ only in their seed: one train_many (the runs' parameters stacked, one
    computation; each run as its single train up to summation order)."""
    from exactlens.results import Result
    from exactlens.train import train_many

    rows: dict[str, dict[str, Any]] = {}
    scratch = Path(tempfile.mkdtemp(prefix=_work_prefix(stack[0]), dir=root))
    start = time.perf_counter()
    try:
        options = dict(stack[0].options)
        name = options.pop("name")
        seeds = [j.sweep_seed for j in stack]
        runs = train_many(name, seeds, out=scratch / "runs", **options)
        seconds = (time.perf_counter() - start) / len(stack)
        for job, run in zip(stack, runs, strict=True):
            result = Result("train", run.info)
            row = _row(job, "ok", seconds, None, _headline(result), stacked=len(stack))
            _write(root, job, row, result.to_dict(), scratch / "runs" / f"seed{job.sweep_seed}")
            rows[job.id] = row
    except Exception as err:
        seconds = (time.perf_counter() - start) / len(stack)
        for job in stack:
            if job.id not in rows:
                rows[job.id] = _row(job, "failed", seconds, _public(one_line(err), scratch, root, job),
                                    stacked=len(stack))
                _write(root, job, rows[job.id], None, None)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return rows

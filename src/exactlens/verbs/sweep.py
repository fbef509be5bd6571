"""``exactlens sweep SPEC.toml --out DIR``: a grid of jobs (train, then diff or discover against a
construction, any verb) with seeds, on this machine (``--engine local``), a Ray cluster (``--engine ray``)
or a slice of it (``--shard i/n``); one directory per job and one results table (docs/sweeps.md)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from exactlens.requests import Bool, Choice, Int, Path_, Text, option
from exactlens.results import Result, View, fmt
from exactlens.verbs import VerbSpec, register_verb, tell

__all__ = ["SweepRequest", "run"]


@dataclass(frozen=True)
class SweepRequest:
    spec: str = option(positional=True, kind=Path_(), metavar="SPEC.toml", help="the sweep's spec (TOML)")
    out: str | None = option(None, kind=Path_(),
                             help="the sweep's directory: jobs/<id>/ per job, results.jsonl/.csv/.parquet, "
                                  "summary.html (not needed with --dry-run)")
    engine: str = option("local", kind=Choice(("local", "ray")),
                         help="local: this machine (a process pool; the seeds of one train job stacked); ray: one "
                              "Ray task per unit (pip install 'exactlens[ray]')")
    address: str | None = option(None, kind=Text(), metavar="auto|ray://HOST:PORT",
                                 help="with --engine ray: join this running cluster (default: start a local one)")
    shard: str | None = option(None, kind=Text(), metavar="I/N",
                               help="run only the I-th of N slices (0-based; e.g. a Slurm array task)")
    workers: int | None = option(None, kind=Int(1), help="local engine: processes (default: the machine's CPUs)")
    resume: bool = option(False, kind=Bool(), help="continue a sweep in --out: finished jobs are kept, failed and "
                                                   "missing ones run")
    dry_run: bool = option(False, kind=Bool(), help="print the jobs and the estimated work and disk; run nothing")


def run(request: SweepRequest) -> Result:
    from exactlens.errors import ExactLensError
    from exactlens.sweep import estimate, load_sweep, planned, run_sweep

    if request.dry_run:
        sweep = planned(load_sweep(request.spec), request.shard)
        data = {"dry_run": True, "spec": request.spec, "shard": request.shard,
                "jobs": [j.to_dict() for j in sweep.jobs], "estimate": estimate(sweep, request.out)}
        return Result("sweep_plan", data)
    if request.out is None:
        raise ExactLensError("sweep needs out= (the sweep's directory)")
    tell(f"sweep {request.spec} -> {request.out} ({request.engine}"
         + (f", shard {request.shard}" if request.shard else "") + ")")
    data = run_sweep(request.spec, request.out, engine=request.engine, address=request.address,
                     shard=request.shard, workers=request.workers, resume=request.resume)
    result = Result("sweep", data)
    if data["failed"]:
        result.failure = (f"{data['failed']} of {data['jobs']} jobs failed (their errors are in "
                          f"{data['out']}/results.jsonl); --resume reruns them")
    return result


def _headline(d: dict[str, Any]) -> list[tuple[str, Any]]:
    return [("jobs", d["jobs"]), ("ran", d["ran"]), ("kept", d["kept"]), ("ok", d["ok"]), ("failed", d["failed"]),
            ("skipped", d["skipped"]), ("seconds", d["seconds"]), ("engine", d["engine"])]


def _text(d: dict[str, Any]) -> str:
    lines = [f"sweep {d['spec']} ({d['engine']}{', shard ' + d['shard'] if d['shard'] else ''}): {d['jobs']} jobs, "
             f"ran {d['ran']}, kept {d['kept']} finished; {d['ok']} ok, {d['failed']} failed, {d['skipped']} skipped"
             + (f", {d['missing']} not run (other shards)" if d["missing"] else "") + f" in {d['seconds']:.1f} s"]
    for row in d["rows"]:
        figures = ", ".join(f"{k} {fmt(v)}" for k, v in row["headline"].items())
        lines.append(f"  {row['job']:<44} {row['status']:<7} {row['seconds']:8.2f} s  "
                     + (row["error"] or figures))
    lines.append(f"table: {', '.join(d['table'])}; summary: {d['summary']}")
    return "\n".join(lines)


def _plan_text(d: dict[str, Any]) -> str:
    e = d["estimate"]
    lines = [f"{d['spec']}: {e['jobs']} jobs (" + ", ".join(f"{n} {v}" for v, n in e["per_verb"].items()) + ")"]
    for job in d["jobs"]:
        lines.append(f"  {job['id']:<44} seed {job['seed']}  {job['options']}"
                     + (f"  after {job['parent']}" if job["parent"] else ""))
    lines.append(f"estimated: {e['train_word_steps']:,} training words (epochs x strings per epoch), disk about "
                 f"{e['disk_bytes'] / 1e6:.1f} MB")
    if e["cpu_seconds"] is not None:
        lines.append(f"measured in this directory: about {e['cpu_seconds']:.0f} CPU seconds for the whole sweep")
    return "\n".join(lines)


def _plan_headline(d: dict[str, Any]) -> list[tuple[str, Any]]:
    e = d["estimate"]
    return [("jobs", e["jobs"]), ("training words", e["train_word_steps"]), ("disk bytes", e["disk_bytes"]),
            ("CPU seconds (measured)", e["cpu_seconds"])]


register_verb(VerbSpec("sweep", "a grid of jobs (train, diff, discover, ...) locally, on Ray or in shards",
                       SweepRequest, run, views={"sweep": View(_headline, _text), "sweep_plan": View(
                           _plan_headline, _plan_text)}, order=95))

"""A sweep's spec (TOML): parsed, checked line by line, expanded into jobs.

::

    [sweep]
    seeds = [0, 1]                    # every job runs once per seed (default [0])
    cpus = 1                          # each job's request on a Ray cluster (default 1 CPU, 0 GPUs)
    stack = 0                         # train: at most this many seeds in one computation (0: all)

    [[job]]
    verb = "train"
    name = "first"                    # any key besides verb/options/grid/seeds/then/cpus/gpus is an option
    options = { epochs = 20, train_length = 8 }
    grid = { lr = [1e-3, 3e-3] }      # the cross product of these options' values
    then = [{ verb = "diff", against = "first", options = { lengths = "1:8", parts = "behaviour" } }]

A ``then`` job runs after its parent (once per parent job and seed) and takes the parent's output
(a train job's checkpoint directory) as its first argument. Every job's options are checked with its
verb's request (exactlens.requests) before anything runs: a mistake is one line naming the spec's line.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from exactlens.errors import ExactLensError

__all__ = ["Job", "Sweep", "load_sweep", "parse_sweep"]

JOB_KEYS = ("verb", "options", "grid", "seeds", "then", "cpus", "gpus", "stack")
SWEEP_KEYS = ("seeds", "cpus", "gpus", "stack")


@dataclass(frozen=True)
class Job:
    """One run of one verb at one seed: ``id`` is derived from everything that defines it (verb, options,
    seed, parent), so the same job has the same id (and directory) on every engine, shard and rerun."""

    id: str
    verb: str
    options: dict[str, Any]
    seed: int | None  # None: the verb takes no seed (the row still records the sweep's seed)
    sweep_seed: int
    parent: str | None
    line: int
    group: str  # jobs of one group differ only in their seed (train jobs of a group are stacked)
    grid: dict[str, Any] = field(default_factory=dict)  # the grid values of this job's options
    cpus: float = 1.0
    gpus: float = 0.0
    stack: int = 0  # train: at most this many seeds trained together (0: all the seeds of the group)

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "verb": self.verb, "options": self.options, "seed": self.sweep_seed,
                "verb_seed": self.seed, "parent": self.parent, "line": self.line, "group": self.group,
                "grid": self.grid, "cpus": self.cpus, "gpus": self.gpus,
                "stack": self.stack}

    @staticmethod
    def from_dict(d: dict[str, Any]) -> Job:
        return Job(d["id"], d["verb"], d["options"], d["verb_seed"], d["seed"], d["parent"], d["line"], d["group"],
                   d["grid"], d["cpus"], d["gpus"], d.get("stack", 0))


@dataclass
class Sweep:
    path: str
    jobs: list[Job]

    def by_id(self) -> dict[str, Job]:
        return {j.id: j for j in self.jobs}


class _Lines:
    """Where things are in the spec's text (tomllib gives no positions): the line of the n-th ``[[job]]``
    and of a key inside a line range."""

    def __init__(self, text: str):
        self.lines = text.splitlines()
        self.jobs = [i + 1 for i, line in enumerate(self.lines) if re.match(r"\s*\[\[\s*job\s*\]\]", line)]

    def job_range(self, index: int) -> tuple[int, int]:
        start = self.jobs[index] if index < len(self.jobs) else 1
        nxt = [n for n in self.jobs if n > start]
        return start, (nxt[0] if nxt else len(self.lines) + 1)

    def key(self, key: str, start: int, end: int, after: int | None = None) -> int:
        pattern = re.compile(rf"(^|[\s{{,]){re.escape(key)}\s*=")
        for n in range(max(start, after or start), end):
            if n - 1 < len(self.lines) and pattern.search(self.lines[n - 1]):
                return n
        return after or start


def _toml(text: str, path: str) -> dict[str, Any]:
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        try:
            import tomli as tomllib  # type: ignore[no-redef]
        except ModuleNotFoundError:
            raise ExactLensError("reading a sweep spec needs Python 3.11 (tomllib) or `pip install tomli`") from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise ExactLensError(f"{path}: not valid TOML: {_first_line(err)}") from None
    except RecursionError:
        raise ExactLensError(f"{path}: TOML nested too deeply to read") from None


def _first_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return text[0] if text else type(err).__name__


def load_sweep(path: str | Path, check: bool = True) -> Sweep:
    """Read and expand a spec file (``check``: validate every job's options with its verb's request)."""
    p = Path(path)
    if not p.is_file():
        raise ExactLensError(f"sweep spec {path} is not a file")
    try:
        text = p.read_bytes().decode("utf-8")
    except UnicodeDecodeError as err:
        raise ExactLensError(f"sweep spec {path} is not UTF-8 text (byte {err.start})") from None
    except OSError as err:
        raise ExactLensError(f"sweep spec {path} cannot be read ({err.strerror or err})") from None
    return parse_sweep(text, str(path), check=check)


def parse_sweep(text: str, path: str = "<spec>", check: bool = True) -> Sweep:
    data = _toml(text, path)
    lines = _Lines(text)
    unknown = sorted(set(data) - {"sweep", "job"})
    if unknown:
        raise ExactLensError(f"{path}: unknown table {unknown[0]!r}; a spec has [sweep] and [[job]] tables")
    head = data.get("sweep", {})
    where = lambda key: f"{path} line {lines.key(key, 1, len(lines.lines) + 1)}"  # noqa: E731
    if not isinstance(head, dict):
        raise ExactLensError(f"{where('sweep')}: [sweep] must be a table")
    bad = sorted(set(head) - set(SWEEP_KEYS))
    if bad:
        raise ExactLensError(f"{where(bad[0])}: unknown [sweep] key {bad[0]!r}; allowed: {', '.join(SWEEP_KEYS)}")
    seeds = _seeds(head.get("seeds", [0]), where("seeds"))
    defaults = {"cpus": _amount(head.get("cpus", 1), where("cpus"), "cpus"),
                "gpus": _amount(head.get("gpus", 0), where("gpus"), "gpus"),
                "stack": _count(head.get("stack", 0), where("stack"))}
    tables = data.get("job")
    if not isinstance(tables, list) or not tables:
        raise ExactLensError(f"{path}: no jobs; add at least one [[job]] table with a verb")
    jobs: list[Job] = []
    try:
        check_size(tables, len(seeds), path)
        for index, table in enumerate(tables):
            start, end = lines.job_range(index)
            _expand(table, {**defaults, "seeds": seeds}, None, lines, path, start, end, start, jobs, check)
    except RecursionError:
        raise ExactLensError(f"{path}: `then` jobs nested too deeply") from None
    counts = Counter(j.id for j in jobs)
    twice = [i for i, n in counts.items() if n > 1]
    if twice:
        first = next(j for j in jobs if j.id == twice[0])
        raise ExactLensError(f"{path} line {first.line}: the same job ({first.verb}, {first.options}, seed "
                             f"{first.sweep_seed}) is listed twice")
    return Sweep(path, jobs)


MAX_JOBS = 100_000
"""The most jobs one spec expands to (each job is checked, listed and given a directory); counted from the
spec's grid sizes, seeds and `then` tables before any job is made."""
JOB_BYTES = 8192  # a job, its row and its share of the plan in memory (a rough allowance)
SEED_LIMIT = 2**40  # exactlens.tasks.base.SEED_LIMIT: the seeds a run accepts
MAX_AMOUNT = 2**20  # cpus / gpus of one job: a finite request (inf and nan are refused here, not in the engine)


def _jobs_of(table: Any, seeds: int, chained: bool) -> int:
    """How many jobs a job table expands to (its grid's product x its seeds x itself and its `then` jobs),
    by arithmetic alone; a malformed table counts one (its expansion refuses it)."""
    if not isinstance(table, dict):
        return 1
    points = 1
    grid = table.get("grid")
    for values in (grid.values() if isinstance(grid, dict) else ()):
        points *= len(values) if isinstance(values, list) and values else 1
    own = table.get("seeds")
    count = 1 if chained else (len(own) if isinstance(own, list) and own else seeds)
    then = table.get("then")
    per = 1 + sum(_jobs_of(child, seeds, True) for child in (then if isinstance(then, list) else ()))
    return points * count * per


def check_size(tables: list[Any], seeds: int, path: str) -> int:
    """The one estimate of a spec's expansion: its number of jobs, refused beyond MAX_JOBS or the memory
    limit before any grid is expanded."""
    from exactlens.resources import check_memory

    total = sum(_jobs_of(table, seeds, False) for table in tables)
    if total > MAX_JOBS:
        raise ExactLensError(f"{path}: the spec expands to {total:,} jobs (grid values x seeds x `then` jobs); at "
                             f"most {MAX_JOBS:,}: split it into several specs or use fewer grid values or seeds")
    check_memory(total * JOB_BYTES, f"{path}: {total:,} jobs", "use fewer grid values or seeds")
    return total


def _seeds(value: Any, where: str) -> list[int]:
    if not isinstance(value, list) or not value:
        raise ExactLensError(f"{where}: seeds must be a non-empty list of integers >= 0, got {value!r:.80}")
    if any(isinstance(s, bool) or not isinstance(s, int) or not 0 <= s <= SEED_LIMIT for s in value):
        raise ExactLensError(f"{where}: seeds must be integers in [0, 2^40], got {value!r:.80}")
    if len(set(value)) != len(value):
        raise ExactLensError(f"{where}: seeds must be distinct, got {value!r:.80}")
    return list(value)


def _amount(value: Any, where: str, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= MAX_AMOUNT:
        raise ExactLensError(f"{where}: {name} must be a finite number in [0, {MAX_AMOUNT}], got {value!r:.80}")
    return float(value)


def _count(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ExactLensError(f"{where}: stack must be an integer >= 0 (0: every seed together), got {value!r}")
    return value


def _expand(table: Any, defaults: dict[str, Any], parent: Job | None, lines: _Lines, path: str, start: int, end: int,
            line: int, out: list[Job], check: bool) -> None:
    """One job table (and its `then` children) into ``out``; ``defaults``: [sweep]'s seeds, cpus, gpus, stack."""
    seeds = defaults["seeds"]
    at = lambda key: f"{path} line {lines.key(key, start, end, line)}"  # noqa: E731
    if not isinstance(table, dict):
        raise ExactLensError(f"{path} line {line}: a job is a table with a verb, got {table!r}")
    verb = table.get("verb")
    if not isinstance(verb, str) or not verb:
        raise ExactLensError(f"{path} line {line}: a job needs verb = \"NAME\" (a verb of exactlens)")
    if verb == "sweep":
        raise ExactLensError(f"{path} line {line}: a sweep cannot run a sweep")
    options = {k: v for k, v in table.items() if k not in JOB_KEYS}
    inner = table.get("options", {})
    if not isinstance(inner, dict):
        raise ExactLensError(f"{at('options')}: options must be a table, got {inner!r}")
    twice = sorted(set(inner) & set(options))
    if twice:
        raise ExactLensError(f"{at(twice[0])}: option {twice[0]!r} given twice (in the job and in its options)")
    options.update(inner)
    grid = table.get("grid", {})
    if not isinstance(grid, dict):
        raise ExactLensError(f"{at('grid')}: grid must be a table of option = [values], got {grid!r}")
    for key, values in grid.items():
        if not isinstance(values, list) or not values:
            raise ExactLensError(f"{at(key)}: empty grid: {key} = {values!r} has no values (a list of at least one)")
        if key in options:
            raise ExactLensError(f"{at(key)}: option {key!r} is both fixed and in the grid")
    job_seeds = [parent.sweep_seed] if parent is not None else (
        _seeds(table["seeds"], at("seeds")) if "seeds" in table else seeds)
    if parent is not None and "seeds" in table:
        raise ExactLensError(f"{at('seeds')}: a `then` job runs at its parent's seed; give seeds on the parent")
    if "seed" in options or "seeds" in options:
        raise ExactLensError(f"{at('seed')}: give seeds with `seeds = [...]` (on [sweep] or the job), not as an option")
    cpus = _amount(table.get("cpus", defaults["cpus"]), at("cpus"), "cpus")
    gpus = _amount(table.get("gpus", defaults["gpus"]), at("gpus"), "gpus")
    stack = _count(table.get("stack", defaults["stack"]), at("stack"))
    then = table.get("then", [])
    if not isinstance(then, list) or any(not isinstance(t, dict) for t in then):
        raise ExactLensError(f"{at('then')}: then must be a list of job tables, got {then!r}")
    keys = list(grid)
    points = [dict(zip(keys, combo, strict=True)) for combo in itertools.product(*(grid[k] for k in keys))]
    from exactlens.sweep.check import check_job, takes_seed

    for point in points:
        merged = {**options, **point}
        if check:
            check_job(verb, merged, parent is not None, at, runs=min(stack or len(job_seeds), len(job_seeds)))
        seeded = takes_seed(verb)
        group = _digest({"verb": verb, "options": merged, "parent_group": parent.group if parent else None})
        for seed in job_seeds:
            ident = _digest({"verb": verb, "options": merged, "seed": seed, "parent": parent.id if parent else None})
            label = str(merged.get("name") or merged.get("target") or merged.get("against") or "")
            job_id = "-".join(filter(None, (verb, _slug(label), f"s{seed}", ident[:10])))
            job = Job(job_id, verb, merged, seed if seeded else None, seed, parent.id if parent else None, line,
                      group[:12], dict(point), cpus, gpus, stack)
            out.append(job)
            for child in then:
                child_line = _child_line(lines, child, start, end, line)
                _expand(child, defaults, job, lines, path, start, end, child_line, out, check)


def _child_line(lines: _Lines, child: dict[str, Any], start: int, end: int, line: int) -> int:
    """The line of a `then` table: the first line after the parent's that sets its verb."""
    pattern = re.compile(rf"verb\s*=\s*[\"']{re.escape(str(child.get('verb', '')))}[\"']")
    for n in range(line + 1, end):
        if pattern.search(lines.lines[n - 1]) if n - 1 < len(lines.lines) else False:
            return n
    for n in range(line, end):  # the parent's own line (an inline `then` on one line)
        text = lines.lines[n - 1] if n - 1 < len(lines.lines) else ""
        if "then" in text and pattern.search(text):
            return n
    return line


def _digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.]+", "_", text)[:40].strip("_")

"""The report's independent work over several processes (``exactlens report --jobs N``).

Three kinds of work are independent: a builder's work for one construction (a *per-construction* part,
declared with :func:`per_construction`: the construction's own section, its circuit-discovery rows), a
builder's own independent parts (declared with :func:`per_part`: the Shin & Matzinger section's training
runs and checks) and a whole paper's section builder. With ``jobs`` > 1 all run in a pool of worker
processes before the page is assembled: one task per construction doing all of its parts (a tracr program
is compiled once, in that worker), one task per declared part, one task per paper builder, the longest
expected first. The page then takes their results in page order, so it is the same as with ``jobs`` = 1
but for the times it states. Each task's wall and CPU seconds (``time.process_time`` in its worker) are
kept in ``ctx.tasks`` (report.json ``tasks``).

Workers write their files (figures, attention pages, data) into the report's staging directory, each
file whole (exactlens.outputs); they run with one torch thread and ignore Ctrl-C, which the parent
answers by terminating them before the staging directory is removed, so nothing half-written remains.
A construction registered at run time in this process (not by a plug-in) is unknown to a worker; its
parts, and the whole builders of a report that names it, run here.
"""

from __future__ import annotations

import os
import signal
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from exactlens.outputs import write_error

MAX_DEFAULT_JOBS = 8
"""The default jobs at most (a worker holds its own torch, jax and tracr: about 0.5-1 GB)."""
SLOW_FIRST = ("tracr-shuffle_dyck2", "tracr-shuffle_dyck", "palindrome-hash")
"""The constructions whose tasks take longest (the shuffle-Dyck programs have the largest graphs, whose circuit
discovery takes longest: docs/circuits.md, "Time of the whole catalogue"; palindrome-hash's own section): started
first, then the other compiled programs (each a tracr compilation of 5-20 s), then the rest, so that no long task
starts last and leaves the other workers idle."""
SLOW_BUILDERS = ("pairs_diff_sections", "majority_diff_sections")
"""The papers' builders that take longest (each a training and a whole diff: 133 and 97 s of CPU in the full report
of 2026-11-28, 75 and 77 s since their DAS fits take ``das_unsolved_steps``, README), started right after the first of
``SLOW_FIRST``."""


APART = ("tracr-shuffle_dyck2",)
"""The constructions whose parts (their own section, their discovery rows) run as separate tasks: together they
would be the longest task of the report; apart, each worker compiles the program once (a few seconds more in
all) and the two halves run side by side."""


def default_jobs() -> int:
    """The CPU cores this process may use, at most ``MAX_DEFAULT_JOBS``."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    return max(1, min(MAX_DEFAULT_JOBS, cores))


def per_construction(run: Callable, names: Callable) -> Callable:
    """Declare a section builder's per-construction part: ``run(ctx, name)`` (a module-level function,
    picklable) for each of ``names(ctx)``; the builder reads each result with ``ctx.part(run, name)``."""

    def mark(builder: Callable) -> Callable:
        builder.per_construction = (run, names)
        return builder

    return mark


def per_part(run: Callable, keys: Callable) -> Callable:
    """Declare a section builder's independent parts: ``run(ctx, key)`` (a module-level function, picklable,
    returning a picklable value) for each of ``keys(ctx)`` (strings), each its own task, so that a long
    section is spread over the workers; the builder reads each result with ``ctx.part(run, key)`` and
    assembles its page in the report's process. With one job the parts run there when read."""

    def mark(builder: Callable) -> Callable:
        builder.per_part = (run, keys)
        return builder

    return mark


def key(run: Callable, name: str) -> tuple[str, str, str]:
    return (run.__module__, run.__qualname__, name)


@dataclass
class Failed:
    """A part that raised in a worker: the error, raised again where the builder reads the part."""

    error: BaseException


def _picklable(err: BaseException) -> BaseException:
    import pickle

    try:
        pickle.loads(pickle.dumps(err))
        return err
    except Exception:
        return RuntimeError(f"{type(err).__name__}: {err}")


def _init_worker() -> None:
    import torch

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent stops the workers (module docstring)
    torch.set_num_threads(1)


def _known(name: str) -> bool:
    from exactlens.constructions import names

    return name in names()


def _construction_task(ctx: Any, name: str, runs: Sequence[Callable]) -> dict | None:
    """One construction's parts in a worker: {key: (result or Failed, seconds, errors, settings)}."""
    if not _known(name):
        return None
    return {key(run, name): _one_part(ctx, run, name) for run in runs}


def _part_task(ctx: Any, part: str, run: Callable) -> dict | None:
    """One declared part of a builder (:func:`per_part`) in a worker, as a construction's part; None where the
    report names a construction the worker does not know (the part then runs in the report's process)."""
    if not all(_known(name) for name in ctx.names):
        return None
    return {key(run, part): _one_part(ctx, run, part)}


def _one_part(ctx: Any, run: Callable, what: str) -> tuple:
    ctx.errors, ctx.section_settings = [], {}
    start = time.perf_counter()
    try:
        value: Any = run(ctx, what)
    except Exception as err:
        if write_error(err) is not None:
            raise
        traceback.print_exception(err, file=sys.stderr)
        value = Failed(_picklable(err))
    return value, time.perf_counter() - start, ctx.errors, ctx.section_settings


def _builder_task(ctx: Any, builder: Callable) -> tuple | None:
    """A whole section builder in a worker: (its sections, seconds, errors, settings); None where the
    report names a construction the worker does not know (the builder then runs in the report's process)."""
    if not all(_known(name) for name in ctx.names):
        return None
    start = time.perf_counter()
    sections = builder(ctx)
    return sections, time.perf_counter() - start, ctx.errors, ctx.section_settings


def _task(item: tuple) -> tuple:
    """An item's result, with the task's wall and CPU seconds in this worker."""
    kind, ctx, what, runs = item
    wall, cpu = time.perf_counter(), time.process_time()
    if kind == "construction":
        result = _construction_task(ctx, what, runs)
    elif kind == "part":
        result = _part_task(ctx, what, runs)
    else:
        result = _builder_task(ctx, what)
    return result, time.perf_counter() - wall, time.process_time() - cpu


def _label(item: tuple) -> str:
    kind, _, what, runs = item
    if kind == "builder":
        return what.__name__
    if kind == "part":
        return f"{runs.__qualname__} {what}"
    return f"construction {what}" + (f" ({runs[0].__qualname__})" if what in APART else "")


def _order(name: str) -> int:
    if name in SLOW_FIRST:
        return SLOW_FIRST.index(name)
    return len(SLOW_FIRST) + (0 if name.startswith("tracr-") else 1)


def plan(ctx: Any, builders: Sequence[Callable], in_workers: Sequence[Callable]) -> list[tuple]:
    """The tasks of :func:`run_parallel`, ``(kind, context, what, runs)``, in the order they are started: the
    slowest construction (``SLOW_FIRST``; its parts apart, ``APART``), the slow builders (``SLOW_BUILDERS``), the
    other slow constructions, the declared parts, the other builders (in page order), the other constructions
    (the compiled programs first)."""
    parts: dict[str, list[Callable]] = {}
    for builder in builders:
        run, names = getattr(builder, "per_construction", (None, None))
        for name in names(ctx) if run is not None else ():
            parts.setdefault(name, []).append(run)
    slim = replace(ctx, errors=[], section_settings={}, user_model=None, prepared={}, work_seconds={}, jobs=1,
                   tasks=[])
    declared = [("part", slim, part, builder.per_part[0]) for builder in builders if hasattr(builder, "per_part")
                for part in builder.per_part[1](ctx)]
    constructions = sorted((("construction", slim, name, group) for name, runs in parts.items()
                            for group in ([[run] for run in runs] if name in APART else [runs])),
                           key=lambda i: _order(i[2]))
    slow = [i for i in constructions if i[2] in SLOW_FIRST]
    first = [i for i in slow if i[2] == SLOW_FIRST[0]]
    papers = [("builder", slim, b, ()) for b in in_workers]
    slow_whole = sorted((i for i in papers if i[2].__name__ in SLOW_BUILDERS),
                        key=lambda i: SLOW_BUILDERS.index(i[2].__name__))
    return (first + slow_whole + slow[len(first):] + declared + [i for i in papers if i not in slow_whole]
            + [i for i in constructions if i not in slow])


def run_parallel(ctx: Any, builders: Sequence[Callable], in_workers: Sequence[Callable], jobs: int) -> dict:
    """Run every per-construction and declared part of ``builders`` and each of ``in_workers`` (whole builders)
    in ``jobs`` processes; store the parts in ``ctx.prepared`` (read by ``ctx.part``), each task's wall and CPU
    seconds in ``ctx.tasks``, and return {builder: (sections, seconds, errors, settings, CPU seconds)} for the
    whole builders. Errors and settings are merged where the page reads them, so they come in the same order
    as with one job."""
    from exactlens.processes import environment_initializer, pool_context

    items = plan(ctx, builders, in_workers)
    if not items:
        return {}
    context = pool_context()
    initializer, initargs = environment_initializer(_init_worker)
    results: dict[int, Any] = {}
    with context.Pool(min(jobs, len(items)), initializer=initializer, initargs=initargs) as pool:  # exit: terminated
        results = _run_all(pool, items, min(jobs, len(items)))
        pool.close()  # the workers exit on their own, running their finalizers (a terminated worker leaves its
        pool.join()  # semaphores to the resource tracker, which warns of them at shutdown)
    whole = {}
    for index, (result, wall, cpu) in sorted(results.items()):
        kind, _, what, _ = items[index]
        ctx.tasks.append({"task": _label(items[index]), "seconds": wall, "cpu_seconds": cpu})
        if kind == "builder":
            if result is not None:
                whole[what] = (*result, cpu)
        elif result is not None:  # None: unknown to the workers, its parts run here when read
            ctx.prepared.update(result)
    return whole


def _run_all(pool: Any, items: list[tuple], jobs: int) -> dict[int, Any]:
    """Each item's result, {index: result}. At most ``jobs`` tasks are handed to the pool at a time, so the
    pool's task thread never sits blocked on a full pipe (seen with every task queued at once) when the
    pool is terminated."""
    import queue

    finished: queue.SimpleQueue = queue.SimpleQueue()
    results: dict[int, Any] = {}
    waiting = list(enumerate(items))[::-1]
    running = 0
    while waiting or running:
        while waiting and running < jobs:
            index, item = waiting.pop()
            pool.apply_async(_task, (item,), callback=lambda r, i=index: finished.put((i, r, None)),
                             error_callback=lambda e, i=index: finished.put((i, None, e)))
            running += 1
        index, result, error = finished.get()
        running -= 1
        if error is not None:
            raise error
        results[index] = result
    return results

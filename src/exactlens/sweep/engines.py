"""Where a sweep's units run: ``local`` (this machine: a process pool sized to it), ``ray`` (each unit a
Ray task with its CPU/GPU request, on a local or existing cluster) and ``--shard i/n`` (this process
takes every n-th unit, so any scheduler can run slices).

A unit is what runs in one process: the train jobs of one spec job and grid point (its seeds, stacked
into one train_many computation) or one job of another verb, with the jobs that follow them. Units are
made from the spec alone (never from the engine or the worker), so every engine and shard runs the same
computations with the same seeds and gets the same numbers.
"""

from __future__ import annotations

import contextlib
import io
import os
import tarfile
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from exactlens.errors import ExactLensError
from exactlens.outputs import staged
from exactlens.sweep.runner import job_dir, one_line, run_unit
from exactlens.sweep.spec import Job, Sweep

__all__ = ["ENGINES", "parse_shard", "plan_units", "run_local", "run_ray"]

ENGINES = ("local", "ray")
RAY_MISSING = ("--engine ray needs Ray: pip install 'exactlens[ray]' (or pip install ray); "
               "--engine local runs on this machine without it")


def parse_shard(text: str | None) -> tuple[int, int] | None:
    """'i/n' -> (i, n), 0 <= i < n."""
    if text is None:
        return None
    try:
        i, n = (int(v) for v in text.split("/"))
    except ValueError:
        raise ExactLensError(f"--shard takes i/n (e.g. 0/4: the first of 4 slices), got {text!r}") from None
    if n < 1 or not 0 <= i < n:
        raise ExactLensError(f"--shard i/n needs 0 <= i < n, got {text!r}")
    return i, n


def plan_units(sweep: Sweep, done: set[str], shard: tuple[int, int] | None = None) -> list[list[Job]]:
    """The units still to run, in spec order: each root's stack (train: the seeds of one group, at most
    ``stack`` of them; other verbs: one seed) with its descendants, less the jobs in ``done``. ``shard``
    (i, n): the i-th of every n units of the whole plan (done or not), so a slice never changes as jobs
    finish."""
    children: dict[str, list[Job]] = {}
    for job in sweep.jobs:
        if job.parent is not None:
            children.setdefault(job.parent, []).append(job)

    def family(job: Job) -> Iterator[Job]:
        for child in children.get(job.id, []):
            yield child
            yield from family(child)

    stacks: dict[str, list[Job]] = {}
    for job in sweep.jobs:
        if job.parent is None:
            key = job.group if job.verb == "train" else job.id
            stacks.setdefault(key, []).append(job)
    pieces = []
    for stack in stacks.values():
        size = stack[0].stack or len(stack)
        pieces += [stack[i:i + size] for i in range(0, len(stack), size)]
    units = []
    for index, stack in enumerate(pieces):
        if shard is not None and index % shard[1] != shard[0]:
            continue
        jobs = list(stack) + [d for root in stack for d in family(root)]
        todo = [j for j in jobs if j.id not in done]
        if todo:
            units.append(todo)
    return units


Report = Callable[[list[dict[str, Any]]], None]


def run_local(units: list[list[Job]], root: Path, report: Report, workers: int | None = None) -> None:
    """Units in a process pool of ``workers`` (default: the machine's CPUs over the jobs' ``cpus``, at most one
    per unit); one
    worker runs them in this process. A worker that dies fails its unit's jobs (rerun by --resume)."""
    threads = max(1, int(max(j.cpus for unit in units for j in unit))) if units else 1
    workers = min(workers or max(1, (os.cpu_count() or 1) // threads), len(units))
    if workers <= 1:
        for unit in units:
            report(run_unit([j.to_dict() for j in unit], root))
        return
    from concurrent.futures import ProcessPoolExecutor, as_completed

    from exactlens.processes import environment_initializer, pool_context

    # workers forked from a server that has imported torch and exactlens once, with this process's environment;
    # torch._dynamo too, which torch imports at a process's first optimizer (~0.9 s of CPU per worker otherwise)
    context = pool_context(["torch", "torch._dynamo", "exactlens.train.loop", "exactlens.sweep.runner"])
    initializer, initargs = environment_initializer(_worker_signals)
    pool = ProcessPoolExecutor(workers, mp_context=context, initializer=initializer, initargs=initargs)
    try:
        futures = {pool.submit(_pool_unit, [j.to_dict() for j in unit], str(root)): unit
                   for unit in units}
        for future in as_completed(futures):
            try:
                rows = future.result()
            except Exception as err:  # the worker died (killed, out of memory): its jobs are recorded failed
                rows = _lost(futures[future], root, f"worker lost: {one_line(err)}")
            report(rows)
    except BaseException:  # Ctrl-C or a kill: stop every worker now, queued units never start
        _stop(pool)
        raise
    pool.shutdown(wait=True)


STOP_SECONDS = 10  # how long stopped workers get to remove their unfinished job's scratch before they are killed


def _stop(pool: Any) -> None:
    """Cancel the queued units and stop the running ones: each worker gets SIGTERM (an interrupt there: its
    unfinished job's staging and scratch directories are removed) and, after STOP_SECONDS, SIGKILL."""
    processes = list(getattr(pool, "_processes", {}).values())
    pool.shutdown(wait=False, cancel_futures=True)
    for process in processes:
        with contextlib.suppress(Exception):
            process.terminate()
    for process in processes:
        process.join(STOP_SECONDS)
        if process.is_alive():
            process.kill()
            process.join(STOP_SECONDS)
    pool.shutdown(wait=True)  # the pool's queues and threads released (no semaphore left to warn about)


_IN_UNIT = [False]  # in a pool worker: whether it is running a unit (else a signal has nothing to clean up)


def _worker_signals() -> None:
    """In a pool worker: Ctrl-C and SIGTERM unwind the unit being run (its unfinished job's staging and scratch
    directories are removed), then the worker exits (_pool_unit); an idle worker exits at once."""
    import signal
    import threading

    from tqdm import tqdm

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _on_stop)
    # the bars' lock a thread lock: tqdm's default is a multiprocessing semaphore, which a worker that exits on a
    # signal (os._exit) would leave for the resource tracker to report as leaked
    tqdm.set_lock(threading.RLock())


def _on_stop(signum: int, frame: Any) -> None:
    import signal

    from exactlens.interrupts import raise_interrupt

    if not _IN_UNIT[0]:
        os._exit(130)  # between units: nothing half-written, and no traceback from the pool's loop
    for sig in (signal.SIGINT, signal.SIGTERM):  # Ctrl-C then the driver's SIGTERM: the clean-up is not cut short
        signal.signal(sig, signal.SIG_IGN)
    raise_interrupt(signum, frame)


def _pool_unit(jobs: list[dict[str, Any]], root: str) -> list[dict[str, Any]]:
    """run_unit in a pool worker; interrupted, the worker exits once its unfinished job is cleaned up, so it never
    takes another unit (the pool would otherwise hand it the next one)."""
    _IN_UNIT[0] = True
    try:
        return run_unit(jobs, root)
    except KeyboardInterrupt:
        os._exit(130)
    finally:
        _IN_UNIT[0] = False


def _lost(unit: list[Job], root: Path, error: str) -> list[dict[str, Any]]:
    from exactlens.sweep.runner import _row, _write, read_row

    rows = []
    for job in unit:
        row = read_row(root, job.id)
        if row is None:
            row = _row(job, "failed", 0.0, error)
            _write(root, job, row, None, None, crash=False)
        rows.append(row)
    return rows


# ---- Ray ------------------------------------------------------------------------------------------------------


def import_ray() -> Any:
    try:
        import ray
    except ModuleNotFoundError:
        raise ExactLensError(RAY_MISSING) from None
    return ray


def _pack(directory: Path) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        tar.add(directory, arcname=".")
    return buffer.getvalue()


def _unpack(blob: bytes, target: Path) -> None:
    with tarfile.open(fileobj=io.BytesIO(blob), mode="r:gz") as tar:
        try:
            tar.extractall(target, filter="data")  # no paths outside target, no devices
        except TypeError:  # Python before 3.10.12: our own archives, written by _pack
            tar.extractall(target)


def _ray_unit(jobs: list[dict[str, Any]], inputs: dict[str, bytes]) -> list[tuple[dict[str, Any], bytes]]:
    """On a Ray worker: the unit in a scratch directory (no shared filesystem needed), each job's
    directory sent back packed; the parents it needs arrive packed in ``inputs``."""
    with tempfile.TemporaryDirectory(prefix="exactlens-sweep-") as scratch:
        root = Path(scratch)
        for job_id, blob in inputs.items():
            job_dir(root, job_id).mkdir(parents=True)
            _unpack(blob, job_dir(root, job_id))
        rows = run_unit(jobs, root)
        return [(row, _pack(job_dir(root, row["job"]))) for row in rows]


def _place(root: Path, job_id: str, blob: bytes) -> None:
    with staged(job_dir(root, job_id), overwrite=True, what=f"job {job_id}") as tmp:
        _unpack(blob, tmp)


def run_ray(units: list[list[Job]], root: Path, report: Report, address: str | None = None) -> None:
    """Each unit one Ray task (num_cpus / num_gpus: the most any of its jobs asks for); the driver gathers
    each job's directory as it finishes. ``address``: "auto" or "ray://host:port" joins a running cluster;
    None starts a local one (or uses the one this process already started)."""
    ray = import_ray()
    started = False
    if not ray.is_initialized():
        kwargs: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False}
        if address is not None:
            kwargs["address"] = address
        ray.init(**kwargs)
        started = True
    pending: dict[Any, list[Job]] = {}
    try:
        _ray_fits(ray, units)
        task = ray.remote(_ray_unit)
        for unit in units:
            inputs = {j.parent: _pack(job_dir(root, j.parent)) for j in unit
                      if j.parent is not None and j.parent not in {u.id for u in unit}
                      and job_dir(root, j.parent).is_dir()}
            ref = task.options(num_cpus=max(j.cpus for j in unit), num_gpus=max(j.gpus for j in unit),
                               max_retries=1).remote([j.to_dict() for j in unit], inputs)
            pending[ref] = unit
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1)
            unit = pending.pop(ready[0])
            try:
                packed = ray.get(ready[0])
            except Exception as err:  # the task's worker died
                report(_lost(unit, root, f"ray task lost: {one_line(err)}"))
                continue
            for row, blob in packed:
                _place(root, row["job"], blob)
            report([row for row, _ in packed])
    except BaseException:  # Ctrl-C, a kill: the tasks still queued or running are cancelled
        for ref in pending:
            with contextlib.suppress(Exception):
                ray.cancel(ref, force=True)
        raise
    finally:
        if started:
            ray.shutdown()


def _ray_fits(ray: Any, units: list[list[Job]]) -> None:
    """Refuse, before any task is queued, a unit that no node of the cluster can ever hold (a task would wait
    forever): its CPUs and GPUs against the largest node's."""
    nodes = [n.get("Resources", {}) for n in ray.nodes() if n.get("Alive")]
    for resource, key in (("CPU", "cpus"), ("GPU", "gpus")):
        largest = max((float(n.get(resource, 0)) for n in nodes), default=0.0)
        asked = max((getattr(j, key) for unit in units for j in unit), default=0.0)
        if asked > largest:
            raise ExactLensError(f"a job asks for {key} = {asked:g}, but the largest node of the Ray cluster has "
                                 f"{largest:g} {resource}s: lower {key} in the spec or join a cluster with such a "
                                 "node (no task can ever start)")

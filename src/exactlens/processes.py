"""Worker processes: one start method for every pool of exactlens, and the caller's environment in its workers.

A forkserver starts once per process and forks every later worker from itself, so a worker inherits the
environment of the moment the server started, not the caller's when the pool is made: a variable set between
two pools (``EXACTLENS_*``, ``CUDA_VISIBLE_DEVICES``) would not reach the second pool's workers. Each pool
therefore hands its workers the caller's environment (:func:`environment_initializer`), and each worker sets
glibc's allocator for large tensors (exactlens.allocator)."""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable
from typing import Any


def pool_context(preload: list[str] | None = None) -> Any:
    """A forkserver context (workers forked from a server that imported ``preload`` once; no torch thread pool
    inherited from this process), or spawn where there is no forkserver (Windows)."""
    if "forkserver" in multiprocessing.get_all_start_methods():
        context = multiprocessing.get_context("forkserver")
        if preload:
            context.set_forkserver_preload(preload)
        return context
    return multiprocessing.get_context("spawn")


def environment_initializer(then: Callable[[], None]) -> tuple[Callable[..., None], tuple[Any, ...]]:
    """(initializer, initargs) for a pool: each worker takes this process's environment as it is now, sets its
    allocator for large tensors as the ``exactlens`` program does (exactlens.allocator: a worker runs exactlens's
    work only; the caller's own process is left as it is, and its settings, if it has any, win), then runs
    ``then``. A bad value of the allocator's switch is refused here, in the caller, not in each worker."""
    from exactlens.allocator import switched_off

    switched_off()
    return _adopt, (dict(os.environ), then)


def _adopt(environment: dict[str, str], then: Callable[[], None]) -> None:
    from exactlens.allocator import tune_for_large_tensors

    os.environ.clear()
    os.environ.update(environment)
    tune_for_large_tensors()
    then()

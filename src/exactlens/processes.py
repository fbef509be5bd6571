"""Worker processes: one start method for every pool of exactlens, and the caller's environment in its workers.

A forkserver starts once per process and forks every later worker from itself, so a worker inherits the
environment of the moment the server started, not the caller's when the pool is made: a variable set between
two pools (``EXACTLENS_*``, ``CUDA_VISIBLE_DEVICES``) would not reach the second pool's workers. Each pool
therefore hands its workers the caller's environment (:func:`environment_initializer`)."""

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
    """(initializer, initargs) for a pool: each worker takes this process's environment as it is now, then
    runs ``then``."""
    return _adopt, (dict(os.environ), then)


def _adopt(environment: dict[str, str], then: Callable[[], None]) -> None:
    os.environ.clear()
    os.environ.update(environment)
    then()

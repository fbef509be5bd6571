"""glibc's allocator for exactlens's own processes (the ``exactlens`` program and the workers of its pools): large
tensors come from the heap and their memory is kept for the next one.

By default glibc maps every allocation above its mmap threshold (at most 32 MiB) with its own ``mmap`` and
unmaps it when freed, so each large tensor (a [words, heads, n, n] attention pattern at n = 1000, a batch's
activations) touches fresh pages and pays a page fault for each 4 KiB of them. Where page faults are dear (a
virtual machine such as this project's), that is most of the cost of simple operations on such tensors: a
float64 bool-to-float conversion of 8 x 1002 x 1002 values took 34 ms with fresh pages against 5.5 ms with
reused ones, and palindrome-hash's precision check at |w| = 1000 went from 8.0 to 3.8 s of CPU in float64
(benchmarks/bench_allocator.py measures it). With no mmap for large blocks (M_MMAP_MAX = 0) and a high trim
threshold (memory freed at the top of the heap is kept up to TRIM_BYTES), a freed tensor's pages serve the next.

The ``exactlens`` program does this at its start (``exactlens.cli.main``), before it starts any worker, and so
does every worker of an exactlens pool (``exactlens.processes.environment_initializer``: the report's, the local
sweep engine's), which runs exactlens's work only; a library imported into someone's process leaves that
process's allocator alone. Values already in the environment win (the
variables below, read by glibc at a process's start), and ``EXACTLENS_SYSTEM_MALLOC=1`` turns it off. The
settings go into the environment too, so that worker processes (forkserver, spawn) start with them.
"""

from __future__ import annotations

import ctypes
import os
import sys

from exactlens.errors import ExactLensError

TRIM_BYTES = 1 << 30
"""Freed memory kept at the top of the heap before it is handed back to the system (1 GiB)."""

ENVIRONMENT = {"MALLOC_MMAP_MAX_": "0", "MALLOC_TRIM_THRESHOLD_": str(TRIM_BYTES)}
"""glibc's names of the two settings (read when a process starts)."""

_M_TRIM_THRESHOLD, _M_MMAP_MAX = -1, -4  # mallopt's parameter numbers (malloc.h)


SWITCH = "EXACTLENS_SYSTEM_MALLOC"
"""1: leave glibc's allocator as it is; 0 or unset: the settings above."""


def switched_off() -> bool:
    """Whether ``EXACTLENS_SYSTEM_MALLOC`` turns the settings off; any value but 1 or 0 is refused."""
    value = os.environ.get(SWITCH, "0").strip()
    if value not in ("0", "1", ""):
        raise ExactLensError(f"{SWITCH} is 1 (glibc's allocator as it is) or 0 (exactlens's settings for large "
                             f"tensors); got {value!r}")
    return value == "1"


def tune_for_large_tensors() -> bool:
    """Apply the settings to this process and its future children; whether they are now in effect here. False
    off glibc (another libc or system), with ``EXACTLENS_SYSTEM_MALLOC=1``, or where the environment already sets
    one of the variables (left as it is). A value of the switch other than 0 or 1: ExactLensError."""
    if switched_off() or not sys.platform.startswith("linux"):
        return False
    if any(name in os.environ for name in (*ENVIRONMENT, "MALLOC_MMAP_THRESHOLD_")):
        return False
    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):  # not glibc
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    if not (mallopt(_M_MMAP_MAX, 0) and mallopt(_M_TRIM_THRESHOLD, TRIM_BYTES)):
        return False
    os.environ.update(ENVIRONMENT)
    return True

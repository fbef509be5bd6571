"""Up-front checks of the memory an input implies: an impossible request is refused in well under a
second, naming the limit and how to lower the request, instead of failing deep inside torch (or
swapping for minutes).

The same for time: a computation is refused when its arithmetic exceeds ``EXACTLENS_WORK_LIMIT``
operations (default 2e13: hours on a CPU; a number, e.g. ``EXACTLENS_WORK_LIMIT=1e15`` on a GPU).

The memory limit is ``EXACTLENS_MEMORY_LIMIT`` (bytes, or with a suffix K, M, G, T: ``EXACTLENS_MEMORY_LIMIT=8G``)
or, without it, 80 % of this machine's physical memory.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

from exactlens.errors import ExactLensError

ENV = "EXACTLENS_MEMORY_LIMIT"
WORK_ENV = "EXACTLENS_WORK_LIMIT"
DEFAULT_WORK_LIMIT = 2e13
_SUFFIXES = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


def _physical_memory() -> int:
    try:
        return int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):  # not POSIX: assume 16 GiB
        return 16 * 2**30


def memory_limit() -> int:
    """Bytes one computation may plan to use (see the module docstring)."""
    raw = os.environ.get(ENV, "").strip().upper().removesuffix("B")
    if not raw:
        return int(0.8 * _physical_memory())
    number, suffix = (raw[:-1], raw[-1]) if raw[-1] in _SUFFIXES else (raw, "")
    try:
        value = float(number) * _SUFFIXES[suffix]
    except ValueError:
        raise ExactLensError(f"{ENV}={os.environ[ENV]!r} is not a size (e.g. 8G, 512M or a number of bytes)") from None
    if not value > 0:
        raise ExactLensError(f"{ENV} must be a positive size, got {os.environ[ENV]!r}")
    return int(value)


def human(n_bytes: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if abs(n_bytes) < 1024 or unit == "PiB":
            return f"{n_bytes:.0f} {unit}" if unit == "B" else f"{n_bytes:.1f} {unit}"
        n_bytes /= 1024
    raise AssertionError("unreachable")


def _refuse_beyond(amount: float, limit: float, what: str, amount_text: str, limit_text: str, lower: str) -> None:
    if amount > limit:
        raise ExactLensError(f"{what} needs about {amount_text}, more than the {limit_text}; {lower}")


def check_memory(needed: float, what: str, lower: str) -> None:
    """Refuse ``what`` when it needs more than the limit; ``lower`` says how to ask for less."""
    limit = memory_limit()
    _refuse_beyond(needed, limit, what, human(needed),
                   f"memory limit of {human(limit)} ({ENV} or 80% of this machine's memory)", lower)


# What one training run held in memory at least, beyond its weights: its modules, its generators, its
# history and the Adam state's Python objects (a lower bound, so that a count like 10^8 is refused at once).
RUN_OVERHEAD_BYTES = 2**20


def check_run_count(count: int, per_run_bytes: float = 0, what: str = "training") -> None:
    """Refuse ``count`` runs trained together (``--seeds``) when they cannot fit in memory, before any
    list of seeds or model is built; ``per_run_bytes``: a run's weights and optimizer state, if known."""
    check_memory(count * (RUN_OVERHEAD_BYTES + per_run_bytes), f"{what} {count} runs together (one per seed)",
                 "train fewer seeds per command (e.g. --seeds 0:9, then 10:19)")


def work_limit() -> float:
    raw = os.environ.get(WORK_ENV, "").strip()
    if not raw:
        return DEFAULT_WORK_LIMIT
    try:
        value = float(raw)
    except ValueError:
        raise ExactLensError(f"{WORK_ENV}={raw!r} is not a number of operations (e.g. 1e14)") from None
    if not value > 0:
        raise ExactLensError(f"{WORK_ENV} must be positive, got {raw!r}")
    return value


def check_work(operations: float, what: str, lower: str) -> None:
    """Refuse ``what`` when it needs more arithmetic than the work limit."""
    limit = work_limit()
    _refuse_beyond(operations, limit, what, f"{operations:.1e} operations",
                   f"work limit of {limit:.1e} ({WORK_ENV}; hours on a CPU)", lower)


@contextmanager
def torch_threads(count: int | None) -> Iterator[None]:
    """Run with ``count`` torch threads (None: leave the setting alone), restored afterwards, errors
    included (the report's --threads; the hull's single-threaded products)."""
    if count is None:
        yield
        return
    import torch

    old = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(old)

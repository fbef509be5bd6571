"""SIGTERM handled as Ctrl-C is: the exception unwinds, so every staged output (exactlens.outputs) removes its
hidden sibling and every scratch directory is deleted on the way out, instead of the process vanishing and
leaving them behind. ``exactlens`` (the command) and a sweep's pool workers install it."""

from __future__ import annotations

import contextlib
import signal
from typing import Any

__all__ = ["EXIT_TERMINATED", "Terminated", "on_terminate_unwind", "raise_interrupt"]

EXIT_TERMINATED = 128 + signal.SIGTERM


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the process was (a KeyboardInterrupt: the same clean-up runs)."""


def raise_interrupt(signum: int, frame: Any) -> None:
    raise Terminated(f"signal {signum}")


def on_terminate_unwind() -> None:
    """Make SIGTERM raise :class:`Terminated` in this process (a no-op outside the main thread)."""
    with contextlib.suppress(ValueError):
        signal.signal(signal.SIGTERM, raise_interrupt)

"""Progress bars for long loops: tqdm.auto (a widget in Jupyter, text in a terminal), on stderr.

A bar shows where it can be seen and stays out of the way elsewhere: tqdm's own rule (no bar when
stderr is not a terminal, e.g. in CI logs or a pipe), and never with ``quiet`` (``exactlens
--quiet``, ``set_quiet(True)`` or the environment variable ``EXACTLENS_QUIET=1``). Bars never write
to stdout, so ``--json`` keeps stdout to one JSON object.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable
from typing import Any

from tqdm.auto import tqdm

_quiet = False


def set_quiet(quiet: bool) -> None:
    """Turn every progress bar off (True) or back to tqdm's rule (False)."""
    global _quiet
    _quiet = bool(quiet)


def is_quiet() -> bool:
    return _quiet or os.environ.get("EXACTLENS_QUIET", "") not in ("", "0")


def bar(iterable: Iterable[Any] | None = None, *, desc: str, unit: str = "it", total: int | None = None,
        min_items: int = 2, **kwargs: Any) -> tqdm:
    """A tqdm bar on stderr (left on screen only while running); none for fewer than ``min_items``."""
    size = total if total is not None else (len(iterable) if hasattr(iterable, "__len__") else None)
    disable = shows(size if size is not None else min_items, min_items)
    return tqdm(iterable, desc=desc, unit=unit, total=total, file=sys.stderr, leave=False, dynamic_ncols=True,
                disable=disable, **kwargs)


def shows(size: int, min_items: int = 2) -> bool | None:
    """tqdm's ``disable`` for a loop of ``size`` items: True (off) when quiet or too
    short, else None (tqdm's rule: shown only on a terminal or in Jupyter)."""
    return True if is_quiet() or size < min_items else None

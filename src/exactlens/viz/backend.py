"""The one place that sets matplotlib's backend: figures here are drawn to files (and to the notebook's
PNGs by exactlens.api), never to a window, so matplotlib runs with its file-only Agg backend.

matplotlib is imported when ``pyplot()`` is first called, not with this module, so light modules may
import it (``exactlens --help`` and ``list`` load no matplotlib)."""

from __future__ import annotations

from typing import Any


def pyplot() -> Any:
    """``matplotlib.pyplot``, with the Agg backend selected (no window, works without a display)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt

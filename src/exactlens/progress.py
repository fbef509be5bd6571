"""Progress on stderr: one-line messages (``say``) and bars for long loops, a widget in Jupyter where
ipywidgets is installed, else text.

A bar shows where it can be seen and stays out of the way elsewhere: in a terminal, tqdm's own rule
(no bar when stderr is not a terminal, e.g. in CI logs or a pipe); in a Jupyter kernel, always (its
stderr is no terminal, yet a person watches the cell), as ipywidgets' widget or, without
ipywidgets, as text -- tqdm.auto would warn "IProgress not found" there and show nothing. Never
with ``quiet`` (``exactlens --quiet``, ``set_quiet(True)`` or the environment variable
``EXACTLENS_QUIET=1``). Bars never write to stdout, so ``--json`` keeps stdout to one JSON object.

A terminal that reports no size (a pseudo-terminal without one, as ``script`` or some CI runners
make) gets bars of $COLUMNS or 80 columns: tqdm would draw nothing there. Lines printed
while a bar shows go through :func:`printing_around_bars` (the bar steps aside and is redrawn
below them); :func:`showing` says whether a bar is on screen, for messages that a bar replaces.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import sys
import weakref
from collections.abc import Iterable, Iterator
from typing import Any

from tqdm.std import tqdm as text_bar

_quiet = False
_made: weakref.WeakSet = weakref.WeakSet()  # the bars made by bar(), while they exist


def in_jupyter() -> bool:
    """Whether this process is a Jupyter kernel with a front end that draws widgets (notebook, lab,
    VS Code, Colab); not IPython in a terminal, not qtconsole or Spyder (tqdm.autonotebook's test)."""
    if "ipykernel.zmqshell" not in sys.modules or "IPython" not in sys.modules:
        return False
    if any(k == "QT_API" or k.startswith("SPYDER") for k in os.environ):
        return False
    shell = sys.modules["IPython"].get_ipython()
    kind = type(shell).__name__.lower()
    return shell is not None and "qt" not in kind and "spyder" not in kind


def widgets_installed() -> bool:
    """Whether ipywidgets can be imported (tqdm's notebook bar needs it)."""
    try:
        return importlib.util.find_spec("ipywidgets") is not None
    except (ImportError, ValueError):
        return False


def bar_class(jupyter: bool, widgets: bool) -> type:
    """tqdm's notebook bar in Jupyter with ipywidgets, else the text bar."""
    if jupyter and widgets:
        from tqdm.notebook import tqdm as widget_bar

        return widget_bar
    return text_bar


JUPYTER = in_jupyter()
tqdm = bar_class(JUPYTER, widgets_installed())


def set_quiet(quiet: bool) -> None:
    """Turn every progress bar off (True) or back to the rule above (False)."""
    global _quiet
    _quiet = bool(quiet)


def is_quiet() -> bool:
    return _quiet or os.environ.get("EXACTLENS_QUIET", "") not in ("", "0")


def say(message: str, quiet: bool = False) -> None:
    """One progress message on stderr (never stdout, so ``--json`` keeps stdout to one JSON object);
    nothing when ``quiet``. The messages are every module's one way to report a step done."""
    if not quiet:
        print(message, file=sys.stderr, flush=True)


def bar(iterable: Iterable[Any] | None = None, *, desc: str, unit: str = "it", total: int | None = None,
        min_items: int = 2, **kwargs: Any) -> text_bar:
    """A tqdm bar on stderr (left on screen only while running); none for fewer than ``min_items``."""
    size = total if total is not None else (len(iterable) if hasattr(iterable, "__len__") else None)
    disable = shows(size if size is not None else min_items, min_items)
    width = {} if disable is True else _width(sys.stderr)
    made = tqdm(iterable, desc=desc, unit=unit, total=total, file=sys.stderr, leave=False, disable=disable,
                **{**width, **kwargs})
    _made.add(made)
    return made


def _width(stream: Any) -> dict[str, Any]:
    """tqdm's size settings: follow the terminal's size, or a fixed one where it reports none (tqdm
    would draw a bar 0 columns wide, and hide it below row 0)."""
    try:
        size = os.get_terminal_size(stream.fileno())
    except (AttributeError, OSError, ValueError):  # no file descriptor, or not a terminal: tqdm decides
        return {"dynamic_ncols": True}
    if size.columns > 0 and size.lines > 0:
        return {"dynamic_ncols": True}
    fallback = shutil.get_terminal_size()  # $COLUMNS / $LINES, else 80 x 24
    return {"ncols": fallback.columns, "nrows": fallback.lines}


def showing() -> bool:
    """Whether a bar made by :func:`bar` is on screen now (made, shown, not closed yet)."""
    return any(not made.disable for made in list(_made))


@contextlib.contextmanager
def printing_around_bars() -> Iterator[None]:
    """Print inside this block while bars show: they are cleared first and redrawn after, so a line
    never lands in the middle of a bar (tqdm's external_write_mode; nothing to do without bars)."""
    if not showing():
        yield
        return
    with text_bar.external_write_mode(file=sys.stderr):
        yield


def shows(size: int, min_items: int = 2, jupyter: bool | None = None) -> bool | None:
    """tqdm's ``disable`` for a loop of ``size`` items: True (off) when quiet or too short; else False
    (on) in Jupyter, None elsewhere (tqdm's rule: shown only on a terminal)."""
    if is_quiet() or size < min_items:
        return True
    return False if (JUPYTER if jupyter is None else jupyter) else None

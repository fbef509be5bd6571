"""What a diff part is: :class:`Part` (one declaration: its steps, JSON sections, summary keys, text and page
section) and :class:`Done` (what its step gives). Light: no torch, nothing of the viz layer."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Done", "Part", "mean_of", "number"]


@dataclass
class Done:
    """What one step gives: JSON sections, summary numbers, and a ``value`` the steps that need it read
    (``context.values[name]``)."""

    sections: dict[str, Any] = field(default_factory=dict)
    summary: dict[str, Any] = field(default_factory=dict)
    value: Any = None


@dataclass(frozen=True)
class Part:
    """One step of the diff, declared once (exactlens.analysis.diff.parts).

    ``run(context, request) -> Done``: the work; ``needs``: the steps whose values it reads; ``sections``,
    ``summary``: the JSON sections and summary keys it may add (the orchestrator refuses others); ``shared``:
    a shared input several parts read, not a part a user asks for. ``text(result) -> lines`` and
    ``page(result) -> HTML fragments``: how ``exactlens diff`` prints it and how the diff page shows it, called
    when the result has its (first) section (``exactlens.markup`` has the HTML pieces). ``order``: its place in
    the plan's ties, the JSON, the parts list and the text; ``page_order``: its place on the page (default:
    ``order``)."""

    name: str
    run: Callable[[Any, Any], Done]
    needs: tuple[str, ...] = ()
    sections: tuple[str, ...] = ()
    summary: tuple[str, ...] = ()
    shared: bool = False
    help: str = ""
    text: Callable[[dict[str, Any]], list[str]] | None = None
    page: Callable[[dict[str, Any]], list[str]] | None = None
    order: float = 1000.0
    page_order: float | None = None

    def shows_in(self, result: dict[str, Any]) -> bool:
        """Whether ``result`` has this part's (first) section: then its text and page are shown."""
        return bool(self.sections) and self.sections[0] in result


def mean_of(values: list[float | None]) -> float | None:
    """The mean of the values that are not None; None if none is."""
    import numpy as np

    kept = [v for v in values if v is not None]
    return float(np.mean(kept)) if kept else None


def number(value: Any, digits: int = 3) -> str:
    """A number in a part's text: "-" for None, else ``digits`` decimals."""
    return "-" if value is None else f"{value:.{digits}f}"

"""The strings HTML pages are made of: escaping, numbers, tables, heat-map colours (here) and circuits as
inline SVG (:mod:`.circuit`).

Below every layer (it imports nothing of exactlens), so that a declaration in any layer may carry its own
page section as plain string-making code: a diff part (exactlens.analysis.diff.parts) declares its text
and its page beside its steps without importing the viz layer, which assembles and writes the pages.
"""

from __future__ import annotations

import html
from typing import Any

__all__ = ["esc", "heat", "num", "table"]


def esc(value: Any) -> str:
    """``str(value)`` escaped for HTML text and attributes."""
    return html.escape(str(value), quote=True)


def num(value: Any, digits: int = 3) -> str:
    """A table cell's text: "–" for None, a float to ``digits`` decimals, anything else escaped."""
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return esc(value)


def table(headers: list[str], rows: list[list[Any]], left: int = 1) -> str:
    """A table; the first ``left`` columns are left-aligned (class ``l``), the others right-aligned."""
    head = "".join(f"<th>{esc(h)}</th>" for h in headers)
    body = "".join(
        "<tr>" + "".join(f"<td{' class=l' if j < left else ''}>{num(v)}</td>" for j, v in enumerate(r)) + "</tr>"
        for r in rows
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def heat(score: float | None) -> str:
    """Cell colour for a score in [0, 1] (an R^2, an accuracy): white (<= 0) to green (1); grey when there is
    no score."""
    if score is None:
        return "#eee"
    v = max(0.0, min(1.0, score))
    return f"rgb({int(255 - 155 * v)},{int(255 - 55 * v)},{int(255 - 155 * v)})"

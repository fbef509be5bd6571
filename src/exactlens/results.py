"""Results: what a verb returns. A :class:`Result` is a read-only mapping over exactly the CLI's
``--json`` object (``.to_dict()``) that prints as the CLI's text, shows itself in Jupyter as a table
of headline figures with a small plot (``_repr_html_``) and draws ``.plot()``. How each kind of result
shows itself is one :class:`View`, registered once with its verb (exactlens.verbs).

Light at import (no torch, no matplotlib): the command line loads it before any verb runs."""

from __future__ import annotations

import base64
import html
import io
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from exactlens.errors import ExactLensError
from exactlens.jsonio import jsonable
from exactlens.plugins import Registry

__all__ = ["Result", "VIEWS", "View", "fmt", "register_view"]


@dataclass(frozen=True)
class View:
    """How one kind of result shows itself: headline rows (label, value), the text, a plot (or None)."""

    headline: Callable[[dict[str, Any]], list[tuple[str, Any]]]
    text: Callable[[dict[str, Any]], str]
    plot: Callable[[Result], Any] | None = None  # gets the Result (its mapping and extras, e.g. .history)


VIEWS: dict[str, View] = Registry("result views")


def register_view(kind: str, view: View) -> None:
    if not isinstance(view, View):
        raise ExactLensError(f"register_view takes a View, got {type(view).__name__}")
    VIEWS[kind] = view


class Result(Mapping):
    """One verb's result: a mapping over the CLI's JSON object, plus extras (a trained model, a path).
    ``failure``: a message that makes the command line exit with status 2 after printing the result."""

    def __init__(self, kind: str, data: dict[str, Any], **extras: Any):
        self.kind = kind
        self._data = data
        self.failure: str | None = None
        for name, value in extras.items():
            setattr(self, name, value)

    def __getitem__(self, key: str) -> Any:
        return self._data[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def to_dict(self) -> dict[str, Any]:
        """Exactly the CLI's ``--json`` object (strict JSON types; non-finite numbers as null)."""
        return jsonable(self._data)

    def _view(self) -> View | None:
        return VIEWS.get(self.kind)

    def text(self) -> str:
        """The CLI's text of this result."""
        view = self._view()
        return view.text(self._data) if view else f"Result({self.kind!r}, keys={list(self._data)})"

    def __repr__(self) -> str:
        return self.text()

    def plot(self) -> Any:
        """A matplotlib Figure of the result (ExactLensError where this kind has none)."""
        view = self._view()
        figure = view.plot(self) if view is not None and view.plot is not None else None
        if figure is None:
            raise ExactLensError(f"a {self.kind} result has no plot")
        return figure

    def _repr_html_(self) -> str:
        view = self._view()
        if view is None:
            return f"<pre>{html.escape(repr(self))}</pre>"
        rows = "".join(f"<tr><th style='text-align:left'>{html.escape(str(k))}</th><td>{html.escape(fmt(v))}</td></tr>"
                       for k, v in view.headline(self._data))
        picture = getattr(self, "svg", "")  # a drawing the result carries (a circuit)
        figure = view.plot(self) if view.plot is not None else None
        if figure is not None:
            buffer = io.BytesIO()
            figure.savefig(buffer, format="png", dpi=80, bbox_inches="tight")
            import matplotlib.pyplot as plt

            plt.close(figure)
            encoded = base64.b64encode(buffer.getvalue()).decode("ascii")
            picture += f'<img src="data:image/png;base64,{encoded}" style="max-width:480px">'
        return (f"<div><b>exactlens {html.escape(self.kind)}</b><table>{rows}</table>{picture}"
                "<div style='color:#666;font-size:.85em'>.to_dict() for the data, .plot() for the figure</div></div>")


def fmt(value: Any) -> str:
    """A headline value as text: floats to 4 significant digits, None as '-'."""
    if isinstance(value, float):
        return f"{value:.4g}"
    return "-" if value is None else str(value)

"""The small text and plot helpers the verbs' views share. The options several verbs share are declared once in
exactlens.requests (``ConstructionRequest``, ``device_option``, ``model_target_option``, ``task_option``) and
exactlens.interop.readout (``readout_option``)."""

from __future__ import annotations

from typing import Any

from exactlens.viz.backend import pyplot

__all__ = ["num", "per_length_plot", "pyplot"]


def num(value: Any, spec: str = ".3f", missing: str = "-") -> str:
    """A number for a text table (``missing`` for None)."""
    return missing if value is None else format(value, spec)


def per_length_plot(rows: list[dict[str, Any]], field: str, ylabel: str, title: str, log: bool = False) -> Any:
    """One figure: ``field`` of each row against its length |w|."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(5, 3))
    ax.plot([r["length"] for r in rows], [r[field] for r in rows], marker=".")
    if log:
        ax.set_xscale("log")
    ax.set_xlabel("|w|")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    return fig

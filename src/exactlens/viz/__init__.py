"""Visualizations: circuitsvis attention views, figures and the offline HTML report (a page framework,
exactlens.viz.page, given the registered section builders; the generic ones are in
exactlens.viz.sections, registered by exactlens.viz.page). The names below are imported when first used."""

import importlib
from typing import Any

_WHERE = {"ReportContext": "page", "Section": "page", "build_report": "page", "register_section": "page"}

__all__ = ["ReportContext", "Section", "build_report", "register_section"]


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        value = getattr(importlib.import_module(f"exactlens.viz.{_WHERE[name]}"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'exactlens.viz' has no attribute {name!r}")

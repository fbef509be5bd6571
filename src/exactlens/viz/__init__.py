"""Visualizations: circuitsvis attention views, figures and the offline HTML report (a page framework,
exactlens.viz.page, given the registered section builders; the generic ones are in
exactlens.viz.sections, registered by exactlens.viz.page). The names below are imported when first used."""

from exactlens.lazy import lazy_names

_WHERE = {"ReportContext": "page", "Section": "page", "build_report": "page", "register_section": "page"}

__all__ = ["ReportContext", "Section", "build_report", "register_section"]


__getattr__, __dir__ = lazy_names(__name__, _WHERE)

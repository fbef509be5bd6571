"""Visualizations: circuitsvis attention views, figures and the offline HTML report (a page framework,
exactlens.viz.page, given the registered section builders; the generic ones are in
exactlens.viz.sections)."""

from exactlens.viz import sections
from exactlens.viz.page import ReportContext, Section, build_report, register_section

sections.register()

__all__ = ["ReportContext", "Section", "build_report", "register_section"]

"""``exactlens report [NAME ...] --out DIR``: the offline HTML report (index.html and its pages)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from exactlens.requests import Bool, Path_, TextList, command_line, option
from exactlens.results import Result, View
from exactlens.verbs import VerbSpec, register_verb
from exactlens.verbs.common import device_option


@dataclass(frozen=True)
class ReportRequest:
    names: tuple | None = option(None, kind=TextList(what="a list of construction names"), positional=True,
                                 nargs="*", metavar="names", help="constructions to include (default: all)")
    out: str = option("report", kind=Path_(), required_on_cli=True, api_positional=True,
                      help="report directory (appears when the report is complete)")
    quick: bool = option(False, kind=Bool(), help="small settings (for tests)")
    overwrite: bool = option(False, kind=Bool(), help="replace an existing --out directory")
    device: Any = device_option("for the verify, precision, training and diff work (figures: CPU); report.json: "
                                "device")


def run(request: ReportRequest) -> Result:
    from exactlens.viz.page import build_report

    shown = replace(request, device=str(request.device))
    index = build_report(list(request.names) if request.names else None, request.out, quick=request.quick,
                         overwrite=request.overwrite, command=command_line("report", shown), device=request.device)
    return Result("report", {"index": str(index)}, path=index)


VIEW = View(lambda d: [("index", d["index"])], lambda d: d["index"])

register_verb(VerbSpec("report", "write an HTML report (index.html) to --out", ReportRequest, run,
                       views={"report": VIEW}, order=90))

"""``exactlens report [NAME ...] --out DIR``: the offline HTML report (index.html and its pages)."""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from typing import Any

from exactlens.errors import ExactLensError
from exactlens.interop.readout import readout_option
from exactlens.requests import Any_, Bool, Int, Path_, Text, TextList, command_line, device_option, option, task_option
from exactlens.results import Result, View
from exactlens.verbs import VerbSpec, register_verb


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
    model: Any = option(None, kind=Any_(), metavar="CHECKPOINT_DIR",
                        help="add a section for this model (a checkpoint directory; in Python also an "
                             "ExactTransformer or a TransformerLens model): its behaviour, the diff against "
                             "--against and a hull check; without names, the report has only that section")
    against: str | None = option(None, kind=Text(), metavar="NAME",
                                 help="the construction --model is compared with (a construction of its task)")
    task: str | None = task_option()
    readout: Any = readout_option()
    jobs: int | None = option(None, kind=Int(1, 64), help="processes for the constructions' work and the papers' "
                              "sections (default: the CPU cores, at most 8); the pages are the same for any number")


def run(request: ReportRequest) -> Result:
    from exactlens.interop.model_target import is_construction
    from exactlens.viz.page import build_report

    if isinstance(request.model, str) and is_construction(request.model):
        raise ExactLensError(f"model {request.model!r} is no checkpoint directory (no config.json); a construction's "
                             "section comes from naming it (exactlens report NAME)")
    named = request.model is None or isinstance(request.model, (str, os.PathLike))
    shown = replace(request, device=str(request.device),
                    model=request.model if named else f"<{type(request.model).__name__}>",
                    readout=request.readout if isinstance(request.readout, (str, int, type(None))) else "<callable>")
    index = build_report(list(request.names) if request.names else None, request.out, quick=request.quick,
                         overwrite=request.overwrite, command=command_line("report", shown), device=request.device,
                         model=request.model, against=request.against, task=request.task, readout=request.readout,
                         jobs=request.jobs)
    return Result("report", {"index": str(index)}, path=index)


VIEW = View(lambda d: [("index", d["index"])], lambda d: d["index"])

register_verb(VerbSpec("report", "write an HTML report (index.html) to --out", ReportRequest, run,
                       views={"report": VIEW}, order=90))

"""`exactlens report [NAME ...] --out DIR [--quick]`: the offline HTML report."""

from __future__ import annotations

import argparse
import shlex

from exactlens.cli.common import add_device_argument
from exactlens.cli.registry import Verb, register_verb


def run(args: argparse.Namespace) -> None:
    from exactlens.viz.page import build_report

    command = shlex.join(["exactlens", "report", *args.names, "--out", args.out]
                         + ["--quick"] * args.quick + ["--overwrite"] * args.overwrite
                         + (["--device", args.device] if args.device != "auto" else []))
    print(build_report(args.names or None, args.out, quick=args.quick, overwrite=args.overwrite, command=command,
                       device=args.device))


def arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("names", nargs="*", help="constructions to include (default: all)")
    p.add_argument("--out", required=True, help="report directory (appears when the report is complete)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing --out directory")
    p.add_argument("--quick", action="store_true", help="small settings (for tests)")
    add_device_argument(p, "for the verify, precision, training and diff work (figures: CPU); report.json: device")


register_verb(Verb("report", "write an HTML report (index.html) to --out", arguments, run, order=90))

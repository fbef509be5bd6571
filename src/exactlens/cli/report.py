"""`exactlens report [NAME ...] --out DIR [--quick]`: the offline HTML report."""

from __future__ import annotations

import argparse
import shlex

from exactlens.cli.registry import Verb, register_verb
from exactlens.viz.page import build_report


def run(args: argparse.Namespace) -> None:
    command = shlex.join(["exactlens", "report", *args.names, "--out", args.out]
                         + ["--quick"] * args.quick + ["--overwrite"] * args.overwrite)
    print(build_report(args.names or None, args.out, quick=args.quick, overwrite=args.overwrite, command=command))


def arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("names", nargs="*", help="constructions to include (default: all)")
    p.add_argument("--out", required=True, help="report directory (appears when the report is complete)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing --out directory")
    p.add_argument("--quick", action="store_true", help="small settings (for tests)")


register_verb(Verb("report", "write an HTML report (index.html) to --out", arguments, run, order=90))

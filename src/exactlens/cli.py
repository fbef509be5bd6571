"""The `exactlens` command. With --json, stdout carries exactly one JSON object;
progress and messages go to stderr."""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from typing import Any

from exactlens.errors import ExactLensError

# Subcommands that live in their own modules, as "module:function"; the function
# takes argparse's subparsers object and adds its parser (one line per command).
SUBCOMMAND_MODULES: tuple[str, ...] = (
    "exactlens.cli_hull:add_hull_parser",
    "exactlens.cli_pairlogic:add_pairlogic_parser",
    "exactlens.cli_diff:add_diff_parser",
    "exactlens.cli_train:add_train_parser",
)


def _params(pairs: list[str] | None) -> dict[str, Any]:
    """--param key=value (value parsed as JSON when possible: numbers, true/false)."""
    out: dict[str, Any] = {}
    for pair in pairs or []:
        if "=" not in pair:
            raise ExactLensError(f"--param takes KEY=VALUE, got {pair!r}")
        key, raw = pair.split("=", 1)
        try:
            out[key] = json.loads(raw)
        except json.JSONDecodeError:
            out[key] = raw
    return out


def _emit(obj: dict[str, Any], as_json: bool, text: str) -> None:
    if as_json:
        sys.stdout.write(json.dumps(obj) + "\n")
    else:
        sys.stdout.write(text + "\n")


def cmd_list(args: argparse.Namespace) -> None:
    from exactlens.constructions import get, names

    rows = [get(n).describe() for n in names()]
    text = "\n".join(f"{r['name']:16s} {r['language']:8s} {r['paper']:28s} {r['summary']}" for r in rows)
    _emit({"constructions": rows}, args.json, text)


def cmd_verify(args: argparse.Namespace) -> None:
    from exactlens.analysis.verify import parse_lengths, verify
    from exactlens.constructions import get

    lengths = parse_lengths(args.lengths)
    params = _params(args.param)
    model = get(args.name).make(dtype=args.dtype, **params)  # bad names/parameters fail before any progress
    print(f"verifying {args.name} ({args.dtype}) on {len(lengths)} lengths", file=sys.stderr)
    result = verify(
        args.name, lengths, strings=args.strings, dtype=args.dtype, seed=args.seed, params=params, model=model
    )
    lines = [f"{args.name} {args.dtype}: length strings accuracy cross_entropy_bits min_abs_logit"]
    lines += [
        f"  {r['length']:6d} {r['strings']:7d} {r['accuracy']:.6f} "
        f"{'n/a' if r['cross_entropy_bits'] is None else format(r['cross_entropy_bits'], '.6f')} "
        f"{r['min_abs_logit']:.3e}"
        for r in result["results"]
    ]
    _emit(result, args.json, "\n".join(lines))
    if not args.json and any(r["accuracy"] < 1 for r in result["results"]):
        print("note: accuracy below 1 at some lengths", file=sys.stderr)


def cmd_precision(args: argparse.Namespace) -> None:
    from exactlens.analysis.verify import precision
    from exactlens.constructions import get

    params = _params(args.param)
    get(args.name).make(dtype=args.dtype, **params)  # bad names/parameters fail before any progress
    print(f"scanning {args.name} ({args.dtype}) up to length {args.max_length}", file=sys.stderr)
    result = precision(
        args.name, dtype=args.dtype, max_length=args.max_length, strings=args.strings, seed=args.seed, params=params
    )
    text = (
        f"{args.name} {args.dtype}: exact up to {result['max_exact_length']}, first failure at "
        f"{result['first_failure_length']} ({len(result['checked'])} lengths checked)"
    )
    _emit(result, args.json, text)


def cmd_report(args: argparse.Namespace) -> None:
    from exactlens.viz.report import build_report

    index = build_report(args.names or None, args.out, quick=args.quick)
    print(index)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="exactlens", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("list", help="list the registered constructions")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_list)

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument("name", help="a construction name (see `exactlens list`)")
        p.add_argument("--dtype", choices=["float32", "float64"], default="float32")
        p.add_argument("--seed", type=int, default=0)
        p.add_argument(
            "--param",
            action="append",
            metavar="KEY=VALUE",
            help="construction parameter, e.g. --param c=2 --param eps=0 (repeatable)",
        )
        p.add_argument("--json", action="store_true")

    p = sub.add_parser("verify", help="accuracy and cross-entropy per length")
    common(p)
    p.add_argument("--lengths", default="1:12", help="A:B[:STEP] (inclusive) or a,b,c; default 1:12")
    p.add_argument("--strings", type=int, default=1000, help="random strings per length (short lengths: all)")
    p.set_defaults(func=cmd_verify)

    p = sub.add_parser("precision", help="the largest length at which a construction is still exact")
    common(p)
    p.add_argument("--max-length", type=int, default=1000)
    p.add_argument("--strings", type=int, default=64, help="random strings per length, plus the hard ones")
    p.set_defaults(func=cmd_precision)

    p = sub.add_parser("report", help="write an HTML report (index.html) to --out")
    p.add_argument("names", nargs="*", help="constructions to include (default: all)")
    p.add_argument("--out", required=True)
    p.add_argument("--quick", action="store_true", help="small settings (for tests)")
    p.set_defaults(func=cmd_report)

    for spec in SUBCOMMAND_MODULES:
        module, function = spec.split(":")
        getattr(importlib.import_module(module), function)(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        args.func(args)
    except ExactLensError as err:
        print(f"exactlens: error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

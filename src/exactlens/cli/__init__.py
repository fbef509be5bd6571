"""The ``exactlens`` command. With --json, stdout carries exactly one JSON object; progress and
messages go to stderr. Verbs are registered with ``register_verb`` (exactlens.cli.registry): the
core's here, a plug-in's from its ``register()``; bad input gives exit status 2 and one line
naming the problem."""

from __future__ import annotations

import argparse
import sys

from exactlens.cli import diff, hull, listing, precision, report, train, verify  # noqa: F401  (core verbs)
from exactlens.cli.registry import VERBS, Verb, register_verb
from exactlens.errors import ExactLensError

__all__ = ["Verb", "build_parser", "main", "register_verb"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="exactlens", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for verb in sorted(VERBS.values(), key=lambda v: (v.order, v.name)):
        p = sub.add_parser(verb.name, help=verb.help, description=verb.description or verb.help)
        verb.add_arguments(p)
        p.set_defaults(func=verb.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        args.func(args)
    except ExactLensError as err:
        print(f"exactlens: error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

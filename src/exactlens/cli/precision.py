"""`exactlens precision NAME [--dtype ...] [--max-length N] [--json]`: where floats break a construction."""

from __future__ import annotations

import argparse

from exactlens.cli.common import construction_arguments, emit, parse_params, progress
from exactlens.cli.registry import Verb, register_verb


def run(args: argparse.Namespace) -> None:
    from exactlens.analysis.verify import precision
    from exactlens.constructions import get
    from exactlens.devices import resolve_device

    params = parse_params(args.param)
    construction = get(args.name)
    model = construction.make(dtype=args.dtype, **params)  # bad names/parameters fail before any progress
    if args.max_length is None:
        args.max_length = construction.default_max_length(model)
    device = resolve_device(args.device, args.dtype)
    progress(f"scanning {args.name} ({args.dtype}, {device}) up to length {args.max_length}")
    result = precision(
        args.name, dtype=args.dtype, max_length=args.max_length, strings=args.strings, seed=args.seed, params=params,
        device=device,
    )
    text = (
        f"{args.name} {args.dtype}: exact up to {result['max_exact_length']}, first failure at "
        f"{result['first_failure_length']} ({len(result['checked'])} lengths checked)"
    )
    emit(result, args.json, text)


def arguments(p: argparse.ArgumentParser) -> None:
    construction_arguments(p)
    p.add_argument("--max-length", type=int, default=None,
                   help="longest length scanned (default 1000, or the construction's longest stated length)")
    p.add_argument("--strings", type=int, default=64, help="random strings per length, plus the hard ones")


register_verb(Verb("precision", "the largest length at which a construction is still exact", arguments, run,
                   order=20))

"""`exactlens verify NAME [--lengths A:B[:STEP]] [--strings K] [--dtype ...] [--seed S] [--json]`."""

from __future__ import annotations

import argparse

from exactlens.cli.common import construction_arguments, emit, parse_params, progress
from exactlens.cli.registry import Verb, register_verb
from exactlens.errors import ExactLensError


def _num(value: float | None, spec: str) -> str:
    return "n/a" if value is None else format(value, spec)


def run(args: argparse.Namespace) -> None:
    from exactlens.analysis.verify import parse_lengths, verify
    from exactlens.constructions import get

    params = parse_params(args.param)
    # bad names, parameters or devices fail before any progress
    construction = get(args.name)
    model = construction.make(dtype=args.dtype, device=args.device, **params)
    lengths = construction.default_lengths(model) if args.lengths is None else parse_lengths(args.lengths)
    progress(f"verifying {args.name} ({args.dtype}, {model.device}) on {len(lengths)} lengths")
    result = verify(
        args.name, lengths, strings=args.strings, dtype=args.dtype, seed=args.seed, params=params, model=model
    )
    regression = (result["task"] or {}).get("kind") == "regression"
    last = "max_abs_error" if regression else "min_abs_logit"
    lines = [f"{args.name} {args.dtype}: length strings accuracy cross_entropy_bits {last}"]
    lines += [
        f"  {r['length']:6d} {r['strings']:7d} {_num(r['accuracy'], '.6f')} {_num(r['cross_entropy_bits'], '.6f')} "
        f"{_num(r.get(last), '.3e')}"
        + (f"  NON-FINITE on {r['non_finite_words']} words" if r.get("non_finite_words") else "")
        for r in result["results"]
    ]
    emit(result, args.json, "\n".join(lines))
    broken = [r for r in result["results"] if r.get("non_finite_words")]
    if broken:  # the result is printed (strict JSON, nulls); the command still fails
        raise ExactLensError(
            f"{args.name} ({args.dtype}) gives NaN or infinite outputs at lengths {[r['length'] for r in broken]} "
            f"({sum(r['non_finite_words'] for r in broken)} words): no decision is read from them; check the "
            "parameters (a value may overflow the dtype)"
        )
    if not args.json and any(r["accuracy"] is not None and r["accuracy"] < 1 for r in result["results"]):
        progress("note: accuracy below 1 at some lengths")


def arguments(p: argparse.ArgumentParser) -> None:
    construction_arguments(p)
    p.add_argument("--lengths", default=None,
                   help="A:B[:STEP] (inclusive) or a,b,c; default 1:12 (up to the construction's longest)")
    p.add_argument("--strings", type=int, default=1000, help="random strings per length (short lengths: all)")


register_verb(Verb("verify", "accuracy and cross-entropy per length", arguments, run, order=10))

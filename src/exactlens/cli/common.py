"""Helpers shared by the verbs: --param parsing, one JSON object on stdout, progress on stderr."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from exactlens.errors import ExactLensError
from exactlens.jsonio import dumps


def parse_params(pairs: list[str] | None, option: str = "--param") -> dict[str, Any]:
    """KEY=VALUE pairs (VALUE parsed as JSON when possible: numbers, true/false, null, lists)."""
    out: dict[str, Any] = {}
    for pair in pairs or []:
        if "=" not in pair:
            raise ExactLensError(f"{option} takes KEY=VALUE, got {pair!r}")
        key, raw = pair.split("=", 1)
        try:
            out[key] = json.loads(raw)
        except json.JSONDecodeError:
            out[key] = raw
    return out


def emit(obj: dict[str, Any], as_json: bool, text: str) -> None:
    """With --json exactly one strict JSON object on stdout; otherwise the text."""
    sys.stdout.write((dumps(obj) if as_json else text) + "\n")


def progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def construction_arguments(p: argparse.ArgumentParser) -> None:
    """NAME --dtype --seed --param --json: the options of verbs that build one construction."""
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

"""Helpers shared by the verbs: --param parsing, --device, one JSON object on stdout, progress on stderr.

Like every verb module, this one imports nothing heavy (``exactlens --help`` and ``list`` load it)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from exactlens.errors import ExactLensError
from exactlens.jsonio import dumps
from exactlens.progress import say as progress  # the verbs' name for the one progress message

__all__ = ["add_device_argument", "construction_arguments", "emit", "parse_params", "progress"]


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


def add_device_argument(p: argparse.ArgumentParser, what: str = "") -> None:
    """--device {cpu,cuda,mps,auto} (also cuda:N), default auto: CUDA if present, else MPS, else the CPU
    (exactlens.devices; a device that is not there is an error naming those that are)."""
    p.add_argument("--device", default="auto", metavar="{cpu,cuda,mps,auto}",
                   help="where models run: cpu, cuda (or cuda:N), mps, or auto (default: CUDA if present, else "
                   "MPS, else the CPU)" + (f"; {what}" if what else ""))


def construction_arguments(p: argparse.ArgumentParser) -> None:
    """NAME --dtype --seed --param --device --json: the options of verbs that build one construction."""
    p.add_argument("name", help="a construction name (see `exactlens list`)")
    p.add_argument("--dtype", choices=["float32", "float64"], default="float32")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--param",
        action="append",
        metavar="KEY=VALUE",
        help="construction parameter, e.g. --param c=2 --param eps=0 (repeatable)",
    )
    add_device_argument(p)
    p.add_argument("--json", action="store_true")

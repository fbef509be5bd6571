"""`exactlens hull [CHECKPOINT_DIR | NAME] [--json] [--tol T] [--seed S]`: unselectable keys.

With a target (a checkpoint directory or a construction name): the fraction of unselectable keys
per layer, before and after layer norm, and per head with the queries the head can form
(:func:`exactlens.analysis.hull_model.hull_report`). Without a target: the grid of standard-normal
random keys without and with layer norm (:func:`exactlens.analysis.hull_random.random_keys`,
the experiment of Brody et al.'s Fig. 1c/1d).

With --json, stdout carries exactly one JSON object; progress goes to stderr. Bad input raises
ExactLensError, which ``exactlens.cli.main`` turns into exit status 2.
"""

from __future__ import annotations

import argparse
import math
from typing import Any

from exactlens.cli.common import add_device_argument, emit, progress
from exactlens.cli.registry import Verb, register_verb
from exactlens.errors import ExactLensError

__all__ = ["format_hull_text", "run"]


def _pct(x: float | None) -> str:
    return "     -" if x is None else f"{100 * x:5.1f}%"


def format_hull_text(result: dict[str, Any]) -> str:
    """Human-readable table of a hull_report / fig1_data result."""
    if "layers" not in result:  # random_keys
        lines = [f"random keys (Brody Fig. 1c/1d): mean fraction of unselectable N(0, I) keys, "
                 f"{result['trials']} trials "
                 f"(rows n, columns d)", "without LN:"]
        header = "   n \\ d " + " ".join(f"{d:6d}" for d in result["ds"])
        for name in ("without_ln", "with_ln"):
            if name == "with_ln":
                lines.append("with LN:")
            lines.append(header)
            rows = zip(result["ns"], result[name], strict=True)
            lines += [f"  {n:6d} " + " ".join(f"{v:6.3f}" for v in row) for n, row in rows]
        return "\n".join(lines)
    t = result["target"]
    label = t.get("name", t.get("path"))
    lines = [f"{label}: {result['n_sequences']} sequences, tol {result['tolerance']:g}",
             f"  {result['attention_input_note']}",
             "layer  before_ln  after_ln  per head (queries restricted to span(W_Q^T, b_Q); rank)"]
    for layer in result["layers"]:
        after = layer["after_ln"]["fraction_unselectable"] if layer["after_ln"] else None
        heads = "  ".join(f"h{h['head']}:{_pct(h['fraction_unselectable'])} (r{h['query_rank']})"
                          for h in layer["per_head"])
        lines.append(f"{layer['layer']:5d}     {_pct(layer['before_ln']['fraction_unselectable'])}"
                     f"    {_pct(after)}  {heads}")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> None:
    """Run `exactlens hull` for parsed arguments; writes the result to stdout."""
    from exactlens.analysis.hull_model import hull_report
    from exactlens.analysis.hull_random import random_keys
    from exactlens.devices import resolve_device

    tol = args.tol
    if not (isinstance(tol, float) and math.isfinite(tol) and 0.0 < tol < 1.0):
        raise ExactLensError(f"--tol must be a number in (0, 1) (relative to the keys' scale), got {tol!r}")
    if args.target is None:
        resolve_device(args.device)  # a device that is not there is refused here too
        progress("hull: no target given; unselectable random keys without and with layer norm (on the CPU)")
        result = {**random_keys(seed=args.seed, tol=tol), "device": "cpu"}
    else:
        progress(f"hull: analysing {args.target}")
        result = hull_report(args.target, tol=tol, seed=args.seed, device=args.device)
    emit(result, args.json, format_hull_text(result))


def arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("target", nargs="?", default=None, metavar="CHECKPOINT_DIR | NAME",
                   help="a checkpoint directory or a construction name (see `exactlens list`); "
                        "omitted: random keys without and with layer norm (Brody Fig. 1c/1d)")
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    p.add_argument("--tol", type=float, default=1e-9, help="relative tolerance of the hull check (default 1e-9)")
    p.add_argument("--seed", type=int, default=0, help="seed of the sampled words / tokens / keys")
    add_device_argument(p, "the model runs there; keys come back to the CPU for the linear programs")


register_verb(Verb("hull", "fraction of unselectable keys per layer and head (convex-hull check)", arguments, run,
                   description=__doc__.split("\n\n")[1], order=60))

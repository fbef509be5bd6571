"""`exactlens circuit NAME|CHECKPOINT_DIR [--granularity head|qkv] [--json]`: the ground-truth circuit.

The circuit is read off the weights (exactlens.analysis.circuit.truth): the edges whose sender
writes a residual feature its receiver reads, with the features each carries. On the task's words
(every word of each length up to --words) it marks the edges that the ablation cannot move
(`constant`: under resample or mean those the same for every word of a length, under cross-length
those equal to their aligned source) and checks the circuit by resample (mean, cross-length) ablation:
ablating every edge outside it should change no decision, ablating one edge inside it should change
some (the edges where none changes are listed as `unnecessary`: redundant paths).
"""

from __future__ import annotations

import argparse
from typing import Any

from exactlens.cli.common import emit, progress
from exactlens.cli.registry import Verb, register_verb

__all__ = ["circuit_arguments", "format_circuit_text", "run"]


def format_circuit_text(result: dict[str, Any]) -> str:
    lines = [f"{result['model']}: {result['n_circuit_edges']} of {result['n_edges']} edges in the circuit "
             f"({result['granularity']} granularity; words of lengths {result['lengths']})",
             "  edge                          constant  features"]
    for e in result["edges"]:
        const = {True: "yes", False: "no", None: "-"}[e["constant"]]
        feats = ", ".join(e["features"][:6]) + (" ..." if len(e["features"]) > 6 else "")
        lines.append(f"  {e['edge']:<30}{const:<10}{feats}" + ("  (through layer norm)" if e["through_norm"] else ""))
    check = result.get("check")
    if check:
        lines.append(f"{result['ablation']} ablation on {check['n_words']} words: every edge outside the circuit "
                     f"ablated changes {check['outside_changed']} decisions; edges inside whose ablation alone "
                     f"changes none: {', '.join(check['unnecessary']) or 'none'}")
    return "\n".join(lines)


def circuit_arguments(p: argparse.ArgumentParser) -> None:
    """The options `circuit` and `discover` share."""
    p.add_argument("--granularity", choices=["head", "qkv"], default="head",
                   help="edges into whole heads, or into their queries, keys and values separately (default head)")
    p.add_argument("--lengths", type=int, nargs="+", default=None, metavar="L",
                   help="word lengths to run (default: the task's shortest and the next five)")
    p.add_argument("--words", type=int, default=64,
                   help="words per length: all of them when there are at most this many (default 64)")
    p.add_argument("--ablation", choices=["resample", "mean", "cross-length"], default="resample",
                   help="an ablated edge reads another word's activation (resample), the mean, or a word of "
                        "another length's at the aligned position (cross-length: sees values that are the same "
                        "for every word of a length, such as the length itself); default resample")
    p.add_argument("--seed", type=int, default=0,
                   help="seed of the sampled words, the resample order and the cross-length pairing")
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout")


def run(args: argparse.Namespace) -> None:
    from exactlens.analysis.circuit.evaluate import circuit_report

    progress(f"circuit: deriving the circuit of {args.target}")
    result = circuit_report(args.target, granularity=args.granularity, lengths=args.lengths, words=args.words,
                            seed=args.seed, ablation=args.ablation, check=not args.no_check)
    emit(result, args.json, format_circuit_text(result))


def arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("target", metavar="NAME | CHECKPOINT_DIR", help="a construction name (see `exactlens list`)")
    circuit_arguments(p)
    p.add_argument("--no-check", action="store_true", help="skip the ablation check (circuit and constants only)")


register_verb(Verb("circuit", "the ground-truth circuit of a construction, checked by edge ablation", arguments, run,
                   description=__doc__.split("\n\n")[1], order=70))

"""DAS pairs designed from the exact circuit against random pairs: process CPU and changed test pairs.

Issue 41 asks that designed pairs cost no more than random ones for a narrower interval. Each round
runs the self-diff (alignment only) of each construction once with each design, one thread, the
order alternating between rounds; the table gives each design's median process CPU seconds (less
sensitive than wall time to other jobs on a shared machine) and the median changed test pairs per
variable of the last round.

Usage: PYTHONPATH=src python benchmarks/bench_pairs.py [--names first,parity] [--rounds 2] [--quick]
       [--full-swaps] [--results PATH]   (--quick: first only, lengths 4 and 6, 1 round, 10 DAS steps;
       --full-swaps: the exact variables' swaps run every layer at every position, as before the readout-only
       swaps, exactlens.analysis.diff.interventions.READOUT_ONLY off: the same rows, to time what they gain)
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
from goals import Goals, add_arguments

from exactlens.analysis.diff import diff, interventions
from exactlens.constructions import build

DESIGNS = ("designed", "random")


def self_diff(name: str, pairs: str, lengths: list[int], steps: int) -> tuple[float, float]:
    """(process CPU seconds, median changed test pairs per variable) of one self-diff."""
    start = time.process_time()
    result = diff(build(name, dtype="float64"), name, lengths=lengths, parts=("alignment",), das_steps=steps,
                  untrained_baseline=False, pairs=pairs)
    changed = [v["changed_pairs"] for v in result["summary"]["verdicts"].values() if v.get("changed_pairs")]
    return time.process_time() - start, float(statistics.median(changed)) if changed else 0.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--names", default="first,parity")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="first only, lengths 4 and 6, 1 round, 10 DAS steps")
    parser.add_argument("--full-swaps", action="store_true",
                        help="the exact variables' swaps in full passes (interventions.READOUT_ONLY off)")
    add_arguments(parser)
    args = parser.parse_args()
    names, lengths, steps = args.names.split(","), [4, 6, 8, 10], 80
    if args.quick:
        names, lengths, steps, args.rounds = ["first"], [4, 6], 10, 1
    torch.set_num_threads(1)
    interventions.READOUT_ONLY = not args.full_swaps
    print(f"load average {os.getloadavg()[0]:.2f}; one thread{'; full-pass swaps' if args.full_swaps else ''}",
          flush=True)
    goals = Goals("bench_pairs.py", args.quick)
    print("| construction | design | median CPU s | median changed test pairs per variable |")
    print("|---|---|---|---|")
    for name in names:
        cpu: dict[str, list[float]] = {d: [] for d in DESIGNS}
        changed: dict[str, float] = {}
        for round_ in range(args.rounds):
            for design in DESIGNS if round_ % 2 == 0 else DESIGNS[::-1]:
                seconds, changed[design] = self_diff(name, design, lengths, steps)
                cpu[design].append(seconds)
        for design in DESIGNS:
            print(f"| {name} | {design} | {statistics.median(cpu[design]):.1f} | {changed[design]:.0f} |")
        ratio = statistics.median(cpu["designed"]) / statistics.median(cpu["random"])
        goals.add(f"{name} self-diff: designed / random pairs, process CPU", ratio, "x", "<= 1.2")
        goals.add(f"{name} self-diff: median changed test pairs, designed / random",
                  changed["designed"] / max(changed["random"], 1.0), "x", ">= 1")
    goals.write(args.results, args.overwrite)


if __name__ == "__main__":
    main()

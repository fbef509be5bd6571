"""Chiang & Cholak Fig. 2 at full settings: wall time against the goal, and the table.

    PYTHONPATH=src python benchmarks/bench_fig2.py [--threads 1] [--max-length 1000] [--strings 1000]
        [--quick] [--results PATH]   (--quick: lengths to 100, 100 strings, 4 points per decade)

Lengths on a logarithmic grid (8 per decade) up to 1000, 1000 random strings per
length, PARITY and FIRST, every setting of exactlens.papers.chiang_cholak.figures.FIG2_CURVES
(the brief's three -- no layer norm, layer norm eps = 1e-5, eps = 0 -- plus the two
with the Prop. 2 layer). Progress on stderr; the timing line and the table on stdout.
"""

from __future__ import annotations

import argparse
import os
import resource
import time

import torch
from goals import Goals, add_arguments

from exactlens.papers.chiang_cholak.figures import LANGUAGES, fig2_data

GOAL_SECONDS = 120.0  # on 2 CPU cores


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1; see viz.report)")
    parser.add_argument("--max-length", type=int, default=1000)
    parser.add_argument("--strings", type=int, default=1000)
    parser.add_argument("--points-per-decade", type=int, default=8)
    parser.add_argument("--dtype", choices=["float32", "float64"], default="float32")
    parser.add_argument("--quick", action="store_true", help="smoke run: lengths to 100, 100 strings, 4 per decade")
    add_arguments(parser)
    args = parser.parse_args()
    if args.quick:
        args.max_length, args.strings, args.points_per_decade = 100, 100, 4
    torch.set_num_threads(args.threads)

    cpu0 = resource.getrusage(resource.RUSAGE_SELF)
    start = time.perf_counter()
    data = fig2_data(max_length=args.max_length, strings=args.strings, points_per_decade=args.points_per_decade,
                     dtype=args.dtype)
    wall = time.perf_counter() - start
    cpu1 = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (cpu1.ru_utime - cpu0.ru_utime) + (cpu1.ru_stime - cpu0.ru_stime)

    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    verdict = "meets" if wall < GOAL_SECONDS else "MISSES"
    print(f"fig2_data: wall {wall:.1f} s, goal < {GOAL_SECONDS:.0f} s on 2 cores ({verdict} the goal); "
          f"CPU {cpu:.1f} s; {args.threads} torch thread(s), {os.cpu_count()} CPUs, load average {load:.2f}; "
          f"{len(data['lengths'])} lengths up to {args.max_length}, {args.strings} strings each, {args.dtype}; "
          f"method: {data['method']}")
    for group, seconds in data["timings"].items():
        print(f"  {group:22s} {seconds:7.1f} s")
    goals = Goals("bench_fig2.py", args.quick)
    goals.add(f"Fig. 2 data, lengths to {args.max_length}, {args.strings} strings each, {args.dtype}", wall, "s",
              f"< {GOAL_SECONDS:.0f}")
    goals.write(args.results, args.overwrite)
    print()
    settings = data["settings"]
    for language in LANGUAGES:
        print(f"{language}: cross-entropy, bits per string (minimum accuracy over all lengths in brackets)")
        print(f"{'n':>6s}  " + "  ".join(f"{s:>30s}" for s in settings))
        for j, n in enumerate(data["lengths"]):
            cells = [data["curves"][language][s]["cross_entropy_bits"][j] for s in settings]
            print(f"{n:6d}  " + "  ".join(f"{c:30.6f}" for c in cells))
        lowest = [min(data["curves"][language][s]["accuracy"]) for s in settings]
        print(f"{'[acc]':>6s}  " + "  ".join(f"{a:30.4f}" for a in lowest))
        print()


if __name__ == "__main__":
    main()

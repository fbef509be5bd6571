"""glibc's default allocator against the exactlens program's settings (exactlens.allocator: no mmap for large
blocks, freed memory kept up to 1 GiB), on work with large tensors.

glibc maps each allocation above its mmap threshold (at most 32 MiB) afresh and unmaps it when freed, so each
such tensor pays a page fault per 4 KiB page it touches. The settings are per process (glibc reads them at a
process's start), so the two sides cannot share one process: each round runs both in fresh interpreters, one
after the other (the order alternating), and the table gives the median process CPU seconds of the timed work
(after one warm-up call of the same work in that process) and the ratio default / tuned. Work:

- palindrome-hash's precision check at one length (exactlens.analysis.verify, the report's precision frontier:
  6 average-hard layers, [words, 1, n, n] patterns; ~100 words, the task's hard words included), float32 and
  float64;
- a float64 bool-to-float conversion of 8 x 1002 x 1002 values, 10 times (one large tensor op alone).

The outputs are the same either way (the settings change where memory comes from, not a value; the report's
data files came out identical, docs/architecture.md). No goal: this is one means to issue 44's report in 5
minutes, measured.

Usage: PYTHONPATH=src python benchmarks/bench_allocator.py [--length 1000] [--rounds 3] [--quick] [--results PATH]
       (--quick: length 300, 1 round)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

from goals import Goals, add_arguments

from exactlens.allocator import ENVIRONMENT

CHILD = """
import json, sys, time
import torch
torch.set_num_threads(1)
work, length = sys.argv[1], int(sys.argv[2])
if work == "convert":
    tied = torch.rand(8, 1, 1002, 1002, generator=torch.Generator().manual_seed(0)) < 0.5
    run = lambda: [tied.to(torch.float64) for _ in range(10)]
else:
    import exactlens
    from exactlens import tasks
    from exactlens.analysis.verify import _check_length
    model = exactlens.build("palindrome-hash", dtype=work)
    reader = tasks.reader(model)
    run = lambda: _check_length(None, reader, model, length, 4, 0)
run()
start = time.process_time()
run()
run()
print(json.dumps({"cpu_s": (time.process_time() - start) / 2}))
"""


def measure(work: str, length: int, tuned: bool) -> float:
    """CPU seconds of one timed call of ``work`` in a fresh interpreter, with or without the settings."""
    env = {k: v for k, v in os.environ.items() if k not in (*ENVIRONMENT, "MALLOC_MMAP_THRESHOLD_")}
    if tuned:
        env.update(ENVIRONMENT)
    out = subprocess.run([sys.executable, "-c", CHILD, work, str(length)], env=env, capture_output=True, text=True,
                         check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])["cpu_s"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--length", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="smoke run: length 300, 1 round")
    add_arguments(parser)
    args = parser.parse_args()
    if args.quick:
        args.length, args.rounds = 300, 1
    goals = Goals("bench_allocator.py", args.quick)
    print(f"load average {os.getloadavg()[0]:.2f}; one thread per side; median of {args.rounds} alternating rounds")
    print("| work | default allocator CPU s | exactlens settings CPU s | default / tuned |")
    print("|---|---|---|---|")
    works = [("float32", f"palindrome-hash precision check, |w| = {args.length}, float32"),
             ("float64", f"palindrome-hash precision check, |w| = {args.length}, float64"),
             ("convert", "bool -> float64, 8 x 1002 x 1002 values, 10 times")]
    for work, label in works:
        times: dict[bool, list[float]] = {False: [], True: []}
        for r in range(args.rounds):
            for tuned in ((False, True) if r % 2 == 0 else (True, False)):
                times[tuned].append(measure(work, args.length, tuned))
        default, tuned = statistics.median(times[False]), statistics.median(times[True])
        shown = label.replace("|", "\\|")  # a markdown cell
        print(f"| {shown} | {default:.3f} | {tuned:.3f} | **{default / tuned:.2f}x** |", flush=True)
        goals.add(f"{label}: default allocator / exactlens's settings, CPU", default / tuned, "x")
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    goals.write(args.results, args.overwrite)


if __name__ == "__main__":
    main()

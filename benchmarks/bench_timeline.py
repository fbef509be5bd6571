"""A timeline of 20 checkpoints against one full diff of the final model, side by side in one process.

Goal (issue 32, item 5): ``exactlens timeline`` over 20 checkpoints costs at most 5x one full diff (every
part, the untrained DAS baseline included, the diff's defaults otherwise) of the run's final model, at the
same lengths and words. The run is FIRST (the Chiang & Cholak preset, a short run) with ``checkpoints="log:20"``;
the timeline runs its default parts (behaviour, probes, attention, alignment, circuit) with the words, the exact
side, the DAS pairs and the exact circuit computed once and each checkpoint's DAS warm-started. Rounds
alternate which side runs first; the table gives the median and the fastest round, and the median CPU seconds
(on a shared machine the wall seconds grow with the load, the CPU seconds much less).

Usage: PYTHONPATH=src python benchmarks/bench_timeline.py [--max-length 8] [--strings 64] [--checkpoints 20]
       [--rounds 1] [--threads 2] [--quick] [--results PATH]
       (--quick: lengths 1..4, 16 words, 4 checkpoints, 40 DAS steps, a shorter training run)
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
from goals import Goals, add_arguments

from exactlens.analysis.diff import PARTS, diff
from exactlens.analysis.timeline import timeline
from exactlens.train import train

GOAL_X = 5.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--max-length", type=int, default=8)
    parser.add_argument("--strings", type=int, default=64)
    parser.add_argument("--checkpoints", type=int, default=20)
    parser.add_argument("--das-steps", type=int, default=80)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--quick", action="store_true",
                        help="smoke run: lengths 1..4, 16 words, 4 checkpoints, 40 DAS steps, 20 training epochs")
    add_arguments(parser)
    args = parser.parse_args()
    if args.quick:
        args.max_length, args.strings, args.checkpoints, args.das_steps, args.rounds = 4, 16, 4, 40, 1
    torch.set_num_threads(args.threads)
    print(f"load average {os.getloadavg()[0]:.2f}; torch threads {args.threads}", flush=True)
    run = train("first", seed=0, epochs=20 if args.quick else 100, strings_per_epoch=100, batch_size=10,
                train_length=[1, 10], test_length=50, test_strings=100, eval_every=0, lr=1e-3,
                checkpoints=f"log:{args.checkpoints}")
    lengths = list(range(1, args.max_length + 1))
    common = dict(lengths=lengths, strings=args.strings, das_steps=args.das_steps)
    times: dict[str, list[float]] = {"one full diff": [], f"timeline of {len(run.checkpoints)} checkpoints": []}
    cpu: dict[str, list[float]] = {name: [] for name in times}  # CPU seconds beside wall: the machine is shared
    data = None
    for round_ in range(args.rounds):
        order = list(times)
        for name in order if round_ % 2 == 0 else order[::-1]:
            start, start_cpu = time.perf_counter(), time.process_time()
            if name == "one full diff":
                diff(run.model, "first", parts=PARTS, **common)
            else:
                data = timeline(run, "first", long_lengths=[2 * args.max_length], **common)
            times[name].append(time.perf_counter() - start)
            cpu[name].append(time.process_time() - start_cpu)
            print(f"  {name}: {times[name][-1]:.1f} s, CPU {cpu[name][-1]:.1f} s", flush=True)
    assert data is not None
    print(f"FIRST, lengths 1..{args.max_length}, {args.strings} words per length, DAS {args.das_steps} steps "
          f"(warm-started fits: {data['settings']['das_warm_steps']})")
    print("| run | median s | fastest s | median CPU s |")
    print("|---|---|---|---|")
    for name, values in times.items():
        print(f"| {name} | {statistics.median(values):.1f} | {min(values):.1f} | {statistics.median(cpu[name]):.1f} |")
    full, line = (statistics.median(v) for v in times.values())
    ratio = line / full
    print(f"the timeline costs {ratio:.2f}x one full diff ({'within' if ratio <= GOAL_X else 'OVER'} the "
          f"{GOAL_X:.0f}x goal); {line / len(run.checkpoints):.1f} s per checkpoint")
    print(f"order: {data['events']['order']}")
    goals = Goals("bench_timeline.py", args.quick)
    goals.add(f"timeline of {len(run.checkpoints)} checkpoints / one full diff, FIRST, lengths 1..{args.max_length}, "
              f"{args.strings} words per length", ratio, "x", f"<= {GOAL_X:.0f}")
    cpu_full, cpu_line = (statistics.median(v) for v in cpu.values())
    print(f"in CPU seconds: {cpu_line / cpu_full:.2f}x")
    goals.add("timeline / one full diff, in CPU seconds", cpu_line / cpu_full, "x")
    goals.add("one full diff", full, "s")
    goals.add(f"timeline of {len(run.checkpoints)} checkpoints", line, "s")
    goals.write(args.results, args.overwrite)


if __name__ == "__main__":
    main()

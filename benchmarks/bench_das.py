"""One full circuit diff with DAS, against the same diff without it, side by side in one process.

Goal (issue 14): a diff of a trained model against its exact construction with every part, DAS
over every variable x site included, at lengths 1..32 with 256 words per length, in under 60 s on
2 cores. The trained model is FIRST (the Chiang & Cholak preset, a short run); the baseline is
the same diff without the alignment part, so the ratio is what DAS costs on top of the rest.
The full diff runs twice, with counterfactual pairs designed from the exact circuit (the default) and
with random pairs (``pairs="random"``, the old draw), and each variable's changed test pairs and
interval are printed side by side (issue 41: designed pairs should need no more time for a narrower
interval). Rounds rotate which runs first; the table gives the median and the fastest round, and the median CPU
seconds of the process (on a shared machine the wall seconds grow with the load, the CPU seconds much less).

Usage: PYTHONPATH=src python benchmarks/bench_das.py [--max-length 32] [--strings 256] [--rounds 2]
       [--das-steps 80] [--threads 2] [--quick] [--results PATH]
       (--quick: lengths 1..4, 16 words, 1 round, 5 DAS steps, a shorter training run)
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
from goals import Goals, add_arguments

from exactlens.analysis.diff import PARTS, diff
from exactlens.train import train

GOAL_S = 60.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--max-length", type=int, default=32)
    parser.add_argument("--strings", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--das-steps", type=int, default=80)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--quick", action="store_true",
                        help="smoke run: lengths 1..4, 16 words, 1 round, 5 DAS steps, 20 training epochs")
    add_arguments(parser)
    args = parser.parse_args()
    if args.quick:
        args.max_length, args.strings, args.rounds, args.das_steps = 4, 16, 1, 5
    torch.set_num_threads(args.threads)
    print(f"load average {os.getloadavg()[0]:.2f}; torch threads {args.threads}", flush=True)
    model = train("first", seed=0, epochs=20 if args.quick else 100, strings_per_epoch=100, batch_size=10,
                  train_length=[1, 10], test_length=50, test_strings=100, eval_every=0, lr=1e-3).model
    lengths = list(range(1, args.max_length + 1))
    without = tuple(p for p in PARTS if p != "alignment")
    times: dict[str, list[float]] = {"full": [], "full, random pairs": [], "without DAS": []}
    cpu: dict[str, list[float]] = {name: [] for name in times}  # CPU seconds beside wall: the machine is shared
    results: dict[str, dict] = {}
    order = [("full", PARTS, "designed"), ("full, random pairs", PARTS, "random"), ("without DAS", without, "designed")]
    for round_ in range(args.rounds):
        for name, parts, pairs in order[round_ % 3:] + order[:round_ % 3]:
            start, start_cpu = time.perf_counter(), time.process_time()
            out = diff(model, "first", lengths=lengths, strings=args.strings, parts=parts, das_steps=args.das_steps,
                       pairs=pairs)
            times[name].append(time.perf_counter() - start)
            cpu[name].append(time.process_time() - start_cpu)
            results[name] = out
    result = results["full"]
    rows = result["alignment"]
    n_variables, n_sites = len({r["variable"] for r in rows}), len({r["site"] for r in rows})
    print(f"FIRST, lengths 1..{args.max_length}, {args.strings} words per length; DAS: "
          f"{n_variables} variables x {n_sites} sites = {len(rows)} rows, "
          f"{args.das_steps} steps, dims 1..3, untrained baseline on")
    print("| diff | median s | fastest s | median CPU s |")
    print("|---|---|---|---|")
    for name, values in times.items():
        print(f"| {name} | {statistics.median(values):.1f} | {min(values):.1f} | {statistics.median(cpu[name]):.1f} |")
    full, base = statistics.median(times["full"]), statistics.median(times["without DAS"])
    print(f"DAS costs {full / base:.2f}x the rest of the diff; full diff {full:.1f} s "
          f"({'under' if full < GOAL_S else 'OVER'} the {GOAL_S:.0f} s goal)")
    goals = Goals("bench_das.py", args.quick)
    goals.add(f"full diff with DAS, FIRST, lengths 1..{args.max_length}, {args.strings} words per length", full, "s",
              f"< {GOAL_S:.0f}")
    goals.add("DAS's cost: full diff / diff without DAS", full / base, "x")
    goals.add("full diff, CPU seconds", statistics.median(cpu["full"]), "s")
    summary = result["summary"]
    print(f"summary: mean DAS IIA (changed) {summary['mean_das_iia_changed']}, random "
          f"{summary['mean_random_iia_changed']}, untrained {summary['mean_untrained_iia_changed']}")
    random_full = statistics.median(times["full, random pairs"])
    goals.add("full diff with designed pairs / with random pairs", full / random_full, "x", "<= 1")
    print("| variable | designed: verdict, changed pairs, interval | random: verdict, changed pairs, interval |")
    print("|---|---|---|")
    lines = {name: results[name]["summary"]["verdicts"] for name in ("full", "full, random pairs")}
    for variable in lines["full"]:
        cells = []
        for name in ("full", "full, random pairs"):
            v = lines[name].get(variable) or {}
            ci = v.get("iia_ci")
            cells.append(f"{v.get('verdict')}, {v.get('changed_pairs')}, "
                         f"{'-' if not ci else f'[{ci[0]:.2f}, {ci[1]:.2f}]'}")
        print(f"| {variable} | {cells[0]} | {cells[1]} |")
    goals.write(args.results, args.overwrite)


if __name__ == "__main__":
    main()

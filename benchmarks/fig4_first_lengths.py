"""Chiang & Cholak Fig. 4 / Nowak et al. Fig. 4: FIRST trained at |w| = 10, 30, 100, 300,
tested at |w| = 1000, standard vs log-n scaled attention, several runs each.

Each run is ``exactlens.train.train("first", seed=s, train_length=L, scaled=...)`` with the
preset's paper settings (d_model 16, d_FFNN 64, post-LN eps 1e-5, Adam lr 3e-4, 100 fresh
strings per epoch) and ``--epochs`` epochs; one epoch = one Adam step on the epoch's 100
strings (``--batch-size 1`` gives the papers' 100 steps per epoch). The final model is
tested on ``--test-strings`` fresh words of length 1000. The runs of one (length,
attention) cell are trained together, ``--group`` seeds at a time, by
``exactlens.train.train_many`` (each run equals its single ``train``); the groups go to
a process pool (``--workers``, one torch thread each), longest first. Prints a table (mean, standard deviation, min,
max of the final test accuracy over runs) next to the authors' reference figures and
writes all numbers to ``--json``.

Usage: PYTHONPATH=src python benchmarks/fig4_first_lengths.py [--runs 10] [--epochs 1000]
       [--lengths 10,30,100,300] [--workers 2] [--json fig4.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from concurrent.futures import ProcessPoolExecutor

# Authors' stored runs (20 runs x 1000 epochs, batch size 1): mean final accuracy at |w| = 1000.
REFERENCE = {False: {10: 0.513, 30: 0.733, 100: 0.889, 300: 0.974}, True: {10: 0.976, 30: 1.0, 100: 1.0, 300: 1.0}}


def one_group(job: dict) -> list[dict]:
    import torch

    torch.set_num_threads(1)
    from exactlens.train import train_many

    start = time.perf_counter()
    runs = train_many(
        "first",
        job["seeds"],
        train_length=job["length"],
        scaled=job["scaled"],
        epochs=job["epochs"],
        batch_size=job["batch_size"],
        test_length=1000,
        test_strings=job["test_strings"],
        eval_every=0,
    )
    wall = time.perf_counter() - start
    out = []
    for run in runs:
        final = run.final
        fields = {k: v for k, v in job.items() if k != "seeds"}
        out.append(
            dict(
                fields,
                seed=run.seed,
                accuracy=final["test_accuracy"],
                loss_bits=final["test_loss_bits"],
                attn_first=final["test_attn_first"],
                train_loss_bits=final["train_loss_bits"],
                group_wall_s=wall,
                group_size=len(runs),
            )
        )
    return out


def _chunks(items: list[int], size: int) -> list[list[int]]:
    if size < 1:
        raise SystemExit(f"--group must be >= 1, got {size}")
    return [items[i : i + size] for i in range(0, len(items), size)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--epochs", type=int, default=1000)
    parser.add_argument("--lengths", default="10,30,100,300")
    parser.add_argument("--batch-size", type=int, default=None)
    parser.add_argument("--test-strings", type=int, default=100)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--group", type=int, default=10, help="seeds trained together by one train_many")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    lengths = [int(v) for v in args.lengths.split(",")]
    jobs = [
        dict(
            length=L,
            scaled=s,
            seeds=seeds,
            epochs=args.epochs,
            batch_size=args.batch_size,
            test_strings=args.test_strings,
        )
        for L in sorted(lengths, reverse=True)
        for s in (False, True)
        for seeds in _chunks(list(range(args.runs)), args.group)
    ]
    print(
        f"fig4: {args.runs * len(lengths) * 2} runs in {len(jobs)} groups on {args.workers} workers, "
        f"load average {os.getloadavg()}",
        flush=True,
    )
    start = time.perf_counter()
    results = []
    with ProcessPoolExecutor(args.workers) as pool:
        for group in pool.map(one_group, jobs):
            results.extend(group)
            for res in group:
                print(
                    f"  |w|={res['length']:4d} scaled={res['scaled']!s:5} seed={res['seed']:2d} "
                    f"acc={res['accuracy']:.3f} (group of {res['group_size']}: {res['group_wall_s']:.0f} s)",
                    flush=True,
                )
    wall = time.perf_counter() - start
    print(
        f"\nFIRST, tested at |w| = 1000: final test accuracy over {args.runs} runs x {args.epochs} epochs "
        f"(wall {wall:.0f} s, {args.workers} workers, load average now {os.getloadavg()})"
    )
    print("| attention | train \\|w\\| | mean | std | min | max | reference (authors, 20 runs) |")
    print("|---|---|---|---|---|---|---|")
    table = []
    for scaled in (False, True):
        for L in lengths:
            accs = [r["accuracy"] for r in results if r["length"] == L and r["scaled"] == scaled]
            row = dict(
                scaled=scaled,
                length=L,
                mean=statistics.fmean(accs),
                std=statistics.stdev(accs) if len(accs) > 1 else 0.0,
                min=min(accs),
                max=max(accs),
                reference=REFERENCE[scaled].get(L),
            )
            table.append(row)
            print(
                f"| {'log n' if scaled else 'standard'} | {L} | {row['mean']:.3f} | {row['std']:.3f} | "
                f"{row['min']:.2f} | {row['max']:.2f} | {row['reference']} |"
            )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "wall_s": wall, "table": table, "runs": results}, f, indent=1)


if __name__ == "__main__":
    main()

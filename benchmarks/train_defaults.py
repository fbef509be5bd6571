"""The default run of every training name: held-out metrics and wall time (the README's table).

For each name (every paper preset and every construction name, which trains the construction's
task in its shape) this trains seed 0 with the name's defaults, exactly as ``exactlens train NAME``
does, and prints one row: task, kind, steps, held-out accuracy (per word; membership and
classification), per-position accuracy (prediction), MSE and R^2 (regression), and the seconds
of training. ``--processes 2`` trains two names at once (one torch thread each); the times are
then those of a machine with both cores busy. ``--json PATH`` writes the rows.

Usage: PYTHONPATH=src python benchmarks/train_defaults.py [--names dyck1,palindrome] [--processes 2] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import sys
import time

from exactlens.train import preset_names, train
from exactlens.train.presets import construction_names


def one(name: str) -> dict:
    import torch

    torch.set_num_threads(1)
    start = time.perf_counter()
    run = train(name, seed=0)
    final = run.final
    return {
        "name": name,
        "task": run.model.cfg.task["name"],
        "kind": run.model.cfg.task["kind"],
        "steps": run.info["steps"],
        "train_length": run.options["train_length"],
        "test_length": run.options["test_length"],
        "test_accuracy": final.get("test_accuracy"),
        "test_per_position_accuracy": final.get("test_per_position_accuracy"),
        "test_mse": final.get("test_mse"),
        "test_r2": final.get("test_r2"),
        "wall_s": time.perf_counter() - start,
    }


def _fmt(value, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--names", help="comma list (default: every preset and construction name)")
    parser.add_argument("--processes", type=int, default=1)
    parser.add_argument("--json", help="write the rows to this file")
    args = parser.parse_args()
    names = args.names.split(",") if args.names else preset_names() + construction_names()
    print(f"load average {os.getloadavg()[0]:.2f}; {len(names)} names, {args.processes} process(es)", flush=True)
    if args.processes > 1:
        with multiprocessing.get_context("spawn").Pool(args.processes) as pool:
            rows = pool.map(one, names, chunksize=1)
    else:
        rows = [one(n) for n in names]
    print("| name | task (kind) | steps | lengths train / test | held-out accuracy | per position | MSE (R^2) | s |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        mse = "-" if r["test_mse"] is None else f"{r['test_mse']:.3g} ({r['test_r2']:.3f})"
        print(f"| {r['name']} | {r['task']} ({r['kind']}) | {r['steps']} | {r['train_length']} / {r['test_length']} | "
              f"{_fmt(r['test_accuracy'])} | {_fmt(r['test_per_position_accuracy'])} | {mse} | {r['wall_s']:.0f} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    sys.stdout.flush()


if __name__ == "__main__":
    main()

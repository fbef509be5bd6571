"""Brody et al. (2023) Fig. 2-3: MAJORITY with and without LN's projection, several seeds.

Trains the training package's ``majority`` preset (one layer, one head, d = 8, 20 classes, |w| = 50,
pre-LN) with ``layer_norm="full"`` (projection + scaling) and ``"scale_only"`` (no projection) for
each seed, and prints per run the test accuracy, the Adam steps until the test accuracy first
reaches 0.5 / 0.9 / 0.99, and the angle between the CLS query (in the normalised residual space)
and the ones line; then the mean over seeds. The paper's schedule (batch 6000, lr 1e-3, 17K steps)
does not fit a CPU budget of minutes; the defaults here (``BENCH_OPTIONS``: batch 100, lr 1e-2,
constant) are printed with the result. A measurement, not a timing.

Usage: PYTHONPATH=src python benchmarks/brody_majority.py [--seeds 0 1 2] [--epochs 60] [--quick] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np
import torch

from exactlens.papers.brody.majority_training import BENCH_OPTIONS, majority_data, report_options


def _fmt(v: object) -> str:
    return "never" if v is None else str(v)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--epochs", type=int, default=None, help="override the number of epochs")
    parser.add_argument("--quick", action="store_true", help="tiny settings for a smoke run")
    parser.add_argument("--out", default=None, help="write the full result as JSON to this file")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    options = dict(report_options(True) if args.quick else BENCH_OPTIONS)
    if args.epochs is not None:
        options["epochs"] = args.epochs
    start = time.perf_counter()
    data = majority_data(("full", "scale_only"), seeds=args.seeds, **options)
    print(f"options: {json.dumps(data['options'], sort_keys=True, default=str)}")
    print(
        f"{'layer norm':<11s} {'seed':>4s} {'final acc':>9s} {'angle':>7s} "
        + " ".join(f"{'steps>=' + str(t):>11s}" for t in data["thresholds"])
    )
    for run in data["runs"]:
        cells = " ".join(f"{_fmt(run['steps_to'][str(t)]):>11s}" for t in data["thresholds"])
        print(
            f"{run['layer_norm']:<11s} {run['seed']:>4d} {run['final_test_accuracy']:9.3f} "
            f"{run['final_angle_deg']:7.1f} {cells}"
        )
    for ln in data["layer_norms"]:
        runs = [r for r in data["runs"] if r["layer_norm"] == ln]
        acc = np.mean([r["final_test_accuracy"] for r in runs])
        ang = np.mean([r["final_angle_deg"] for r in runs])
        first_angle = np.mean([r["query_angle_deg"][0] for r in runs])
        print(f"mean {ln:<10s} final acc {acc:.3f}, angle {first_angle:.1f} -> {ang:.1f} deg over {len(runs)} seeds")
    print(f"wall time {time.perf_counter() - start:.0f} s")
    if args.out:
        with open(args.out, "w", encoding="utf-8") as fh:
            json.dump(data, fh)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Shin & Matzinger §4 training cost: the Fig. 2 grid (4 flavours x K seeds) on 2 processes, and the
gathered forward used in training against the model's own forward, side by side in one process.

    .venv/bin/python benchmarks/bench_pairlogic.py [--seeds 10] [--processes 2] [--iterations 50]

Goal: the 4-flavour x 10-seed grid at the paper's sizes (N=10, M=50, batch 1000, 50 LBFGS
iterations) in under 10 minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import time

import torch


def forward_ratio(repeats: int = 5) -> tuple[float, float]:
    from exactlens.papers.shin_matzinger.task import PairGenerator, make_q
    from exactlens.papers.shin_matzinger.training import PairTrainConfig, masked_mse, new_model

    model = new_model(PairTrainConfig())
    batch = PairGenerator(make_q("normal", 10, 0), 50, seed=0).batch(1000)
    times = {True: [], False: []}
    for _ in range(repeats):
        for fast in (True, False):
            t0 = time.perf_counter()
            model.zero_grad()
            masked_mse(model, batch, fast=fast).backward()
            times[fast].append(time.perf_counter() - t0)
    return min(times[False]), min(times[True])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--iterations", type=int, default=50)
    args = parser.parse_args()
    torch.set_num_threads(1)
    model_s, fast_s = forward_ratio()
    print(
        f"forward+backward, batch 1000: model {model_s:.3f} s, gathered {fast_s:.3f} s, ratio {model_s / fast_s:.2f}x"
    )
    from exactlens.papers.shin_matzinger.training import GRID, train_grid

    t0 = time.perf_counter()
    runs = train_grid(seeds=args.seeds, grid=GRID[:4], processes=args.processes, iterations=args.iterations)
    seconds = time.perf_counter() - t0
    print(
        f"Fig. 2 grid: 4 flavours x {args.seeds} seeds, {args.iterations} iterations, {args.processes} processes: "
        f"{seconds:.0f} s ({seconds / len(runs):.1f} s per run; goal 600 s for 10 seeds)"
    )
    for flavour in ("solution1", "solution2", "solution3", "unconstrained"):
        mses = [r["test_mse"] for r in runs if r["config"]["flavour"] == flavour]
        mean = sum(mses) / len(mses)
        print(f"  {flavour:13s} test MSE mean {mean:.4f} min {min(mses):.4f} max {max(mses):.4f}")


if __name__ == "__main__":
    main()

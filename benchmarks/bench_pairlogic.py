"""Shin & Matzinger §4 training cost: the Fig. 2 grid (4 flavours x K seeds) on 2 processes, and the
training forward (the loop's runner for one run, SingleRun, as the loop runs it) against the
model's plain readout, forward + backward at batch 1000, side by side in one process.

    .venv/bin/python benchmarks/bench_pairlogic.py [--seeds 10] [--processes 2] [--iterations 50]
        [--quick] [--results PATH]   (--quick: 1 seed, 5 iterations, 1 process)

Goal: the 4-flavour x 10-seed grid at the paper's sizes (N=10, M=50, batch 1000, 50 LBFGS
iterations) in under 10 minutes on 2 cores. (The hand-written gathered forward that training
used before is gone: training now runs the model's own forward (exactlens.model.stacked), so the
ratio printed is that path's overhead over a plain forward + backward; 1.0 = none.)
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time

import torch
from goals import Goals, add_arguments


def forward_ratio(calls: int = 7) -> tuple[float, float, float]:
    """Median seconds of forward + backward of the MSE at batch 1000: plain model.readout and
    the loop's runner for one model (training_runs: SingleRun), and the max |difference| of their gradients."""
    from exactlens.model.stacked import training_runs
    from exactlens.papers.shin_matzinger.training import PairTrainConfig, pair_preset
    from exactlens.tasks import kinds
    from exactlens.train.data import sample_batch
    from exactlens.train.loop import new_model, seed_generators

    cfg = PairTrainConfig()
    spec = pair_preset(cfg).spec({})
    gens = seed_generators(0)
    model = new_model(spec, gens["init"])
    batch = sample_batch(spec.task, cfg.batch, (cfg.positions, cfg.positions), gens["train"])
    runs = training_runs([copy.deepcopy(model)])
    names = [name for name, p in runs.params.items() if p.requires_grad]

    def plain() -> list[torch.Tensor]:
        model.zero_grad(set_to_none=True)
        out = model.readout(batch.tokens, batch.n_positions, readout_only=True)
        kinds.loss(spec.task, out, batch.targets, batch.n_positions).mean().backward()
        return [p.grad for p in model.parameters() if p.requires_grad and p.grad is not None]

    def stacked() -> list[torch.Tensor]:
        for p in runs.trainable:
            p.grad = None
        out = runs.readout(batch.tokens[None], batch.n_positions[None])[0]
        kinds.loss(spec.task, out, batch.targets, batch.n_positions).mean().backward()
        return [runs.grad(name)[0] for name in names if runs.grad(name) is not None]

    diff = max(float((a - b).abs().max()) for a, b in zip(plain(), stacked(), strict=True))
    times: dict = {plain: [], stacked: []}
    for i in range(calls):
        for fn in (plain, stacked) if i % 2 == 0 else (stacked, plain):
            t0 = time.perf_counter()
            fn()
            times[fn].append(time.perf_counter() - t0)
    return statistics.median(times[plain]), statistics.median(times[stacked]), diff


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--iterations", type=int, default=50)
    parser.add_argument("--quick", action="store_true", help="smoke run: 1 seed, 5 iterations, 1 process")
    add_arguments(parser)
    args = parser.parse_args()
    if args.quick:
        args.seeds, args.iterations, args.processes = 1, 5, 1
    torch.set_num_threads(1)
    goals = Goals("bench_pairlogic.py", args.quick)
    plain_s, stacked_s, diff = forward_ratio(3 if args.quick else 7)
    print(
        f"forward+backward, batch 1000: model.readout {plain_s * 1e3:.1f} ms, the loop's runner (SingleRun) "
        f"{stacked_s * 1e3:.1f} ms, overhead {stacked_s / plain_s:.2f}x (gradients differ by {diff:.1e})"
    )
    goals.add("forward + backward at batch 1000, the loop's runner / model.readout", stacked_s / plain_s, "x")
    from exactlens.papers.shin_matzinger.training import GRID, train_grid

    t0 = time.perf_counter()
    runs = train_grid(seeds=args.seeds, grid=GRID[:4], processes=args.processes, iterations=args.iterations)
    seconds = time.perf_counter() - t0
    print(
        f"Fig. 2 grid: 4 flavours x {args.seeds} seeds, {args.iterations} iterations, {args.processes} processes: "
        f"{seconds:.0f} s ({seconds / len(runs):.1f} s per run; goal 600 s for 10 seeds)"
    )
    goals.add(f"Fig. 2 grid, 4 flavours x {args.seeds} seeds, {args.iterations} LBFGS iterations, "
              f"{args.processes} processes", seconds, "s", "< 600")
    for flavour in ("solution1", "solution2", "solution3", "unconstrained"):
        mses = [r["test_mse"] for r in runs if r["config"]["flavour"] == flavour]
        mean = sum(mses) / len(mses)
        print(f"  {flavour:13s} test MSE mean {mean:.4f} min {min(mses):.4f} max {max(mses):.4f}")
    goals.write(args.results, args.overwrite)


if __name__ == "__main__":
    main()

"""SIIT training cost against plain training of the same model (issue 45's benchmark).

For each preset in ``--presets``: ``train(NAME, siit=True, ...)`` and the same run without SIIT, at the
same small settings (``SMALL``: 64 words per Adam step, one evaluation at the end), seed 0, one torch
thread, ``--rounds`` rounds alternating which side runs first. Measured: the training loop's wall-clock
time (run ``wall_s``: the steps, without building the model), the median over rounds per side, and the
ratio SIIT / plain (a SIIT step adds two forward passes of twice the pair batch, the IIT and the
strictness one, and their backward passes). Besides, once per preset: the time to prepare SIIT's high-level
side (the exact model's runs, variables, mapping and pairs: ``exactlens.train.siit.high_level``), paid once
per run. The load average is printed: the machine is shared, so ratios are noisy.

Usage: PYTHONPATH=src python benchmarks/bench_siit.py [--presets first,parity] [--epochs 100] [--rounds 3]
       [--quick] [--results PATH]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from goals import Goals, add_arguments

SMALL = {
    "first": dict(strings_per_epoch=64, batch_size=64, train_length=(1, 8), test_length=(1, 8), test_strings=50,
                  eval_every=0, lr=3e-3),
    "parity": dict(strings_per_epoch=64, batch_size=64, train_length=(1, 8), test_length=(1, 8), test_strings=50,
                   eval_every=0, lr=3e-3),
}
"""Small settings per preset (the presets' architectures)."""


def load() -> str:
    return ", ".join(f"{v:.1f}" for v in os.getloadavg())


def one(name: str, siit: bool, epochs: int) -> float:
    from exactlens.train import train

    run = train(name, siit=siit, epochs=epochs, seed=0, threads=1, **SMALL[name])
    return float(run.wall_s)


def prepare_seconds(name: str) -> float:
    from exactlens.train import get_preset
    from exactlens.train.siit import high_level

    start = time.perf_counter()
    high_level(get_preset(name).spec(dict(SMALL[name])))
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--presets", default="first,parity", help=f"comma list of {', '.join(SMALL)}")
    parser.add_argument("--epochs", type=int, default=100, help="Adam steps per run (default 100)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="first only, 20 steps, 2 rounds")
    add_arguments(parser)
    args = parser.parse_args()
    names = ["first"] if args.quick else [p for p in args.presets.split(",") if p]
    unknown = [n for n in names if n not in SMALL]
    if unknown:
        parser.error(f"unknown preset {unknown[0]!r}; choose from {', '.join(SMALL)}")
    epochs, rounds = (20, 2) if args.quick else (args.epochs, args.rounds)
    goals = Goals("bench_siit.py", quick=args.quick)
    print(f"SIIT vs plain training, {epochs} Adam steps of 64 words, {rounds} rounds, one thread; load {load()}",
          flush=True)
    print(f"{'preset':<10}{'plain s':>10}{'SIIT s':>10}{'ratio':>8}{'prepare s':>11}  load")
    for name in names:
        one(name, True, 1)  # warm-up: both code paths
        one(name, False, 1)
        times: dict[bool, list[float]] = {True: [], False: []}
        for r in range(rounds):
            for siit in ((True, False) if r % 2 == 0 else (False, True)):
                times[siit].append(one(name, siit, epochs))
        plain, siit = statistics.median(times[False]), statistics.median(times[True])
        prepare = prepare_seconds(name)
        print(f"{name:<10}{plain:>10.2f}{siit:>10.2f}{siit / plain:>7.2f}x{prepare:>11.1f}  {load()}", flush=True)
        goals.add(f"SIIT / plain training time, {name} ({epochs} steps)", siit / plain, "x", "<= 4")
        goals.add(f"SIIT high-level preparation, {name}", prepare, "s", None)
    goals.write(args.results, overwrite=args.overwrite)


if __name__ == "__main__":
    main()

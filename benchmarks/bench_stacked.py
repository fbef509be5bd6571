"""Stacked runs against separate plain runs: Chiang & Cholak's Fig. 4 sweep (FIRST at |w| = 10, 30, 100, 300,
standard and log-n attention, 10 seeds: 80 runs) by ``exactlens sweep`` on the local engine, against the same
80 runs as plain PyTorch loops, one after the other in this process (issue 44: stacked runs >= 10x).

The plain run is bench_vs_torch.py's (``nn.TransformerEncoder`` in the FIRST shape, 100 fresh words per Adam
step, one thread), at the stated epochs, plus the same final test as the sweep's runs (100 words of the test
length, one forward pass); its log-n variant is trained as the standard one (plain PyTorch has no log-n
attention; the factor is one multiply). The sweep trains each grid point's seeds as one stacked computation
(exactlens.train.train_many) in a pool of one-thread workers, one per core. Printed:

- the throughput ratio: 80 plain runs' wall time over the sweep's (the goal: >= 10x);
- the same per core: the plain loop on one core against the sweep's wall times its workers, i.e. whether
  stacking beats one plain process per core;
- per grid point, a plain run's seconds against a stacked run's share of its unit (the sweep's rows), which
  shows where stacking gains least;
- in this process, one thread, process CPU time: plain runs one after the other against one ``train_many`` of
  the same seeds, training only, per length: what stacking itself saves, without the sweep's worker start-up,
  the final tests (the same work on both sides) and the other load of a shared machine.

``--quick``: lengths 10 and 30, 4 seeds, 5 epochs, test length 100 (16 runs). Default: the full grid at 50 epochs
(Fig. 4 trains 1000; the ratio of a step does not depend on the number of steps, the final test's share does).

``--sweep-only``: the sweep alone, e.g. to compare two versions of exactlens (PYTHONPATH) in the same conditions.

``--device cuda`` (where a GPU is present): the in-process comparison alone, on the GPU (plain runs and one
``train_many`` there, wall seconds with the GPU synchronized), for reference beside the CPU's goal.

Usage: PYTHONPATH=src python benchmarks/bench_stacked.py [--quick] [--epochs N] [--seeds N] [--sweep-only]
       [--device cpu|cuda] [--results PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import torch
from bench_sweep import fig4_settings, spec_text
from bench_training import PaperLoopModel
from bench_vs_torch import CPU, clock, plain_epochs
from goals import Goals, add_arguments


def plain_run(length: int, epochs: int, test_length: int, test_strings: int, seed: int,
              device: torch.device = CPU) -> float:
    """One plain run (training and its final test), seconds."""
    start = time.perf_counter()
    torch.manual_seed(seed)
    model = PaperLoopModel().to(device)
    optim = torch.optim.Adam(model.parameters(), lr=3e-4)
    generator = torch.Generator(device=device).manual_seed(seed)
    plain_epochs(model, optim, length, epochs, generator)
    model.eval()
    with torch.no_grad():
        words = torch.randint(0, 2, (test_strings, test_length), generator=generator, device=device)
        tokens = torch.cat([torch.full((test_strings, 1), 2, device=device), words], dim=1)
        ((model(tokens) > 0) == (words[:, 0] == 1)).float().mean().item()
    return time.perf_counter() - start


def in_process(lengths: list[int], seeds: int, epochs: int, device: torch.device = CPU
               ) -> dict[int, tuple[float, float]]:
    """Per length: process CPU seconds per run of ``seeds`` plain runs one after the other and of one
    ``train_many`` of as many seeds, in this process on one thread, training only (a one-word test), the two
    sides alternating (plain first at even lengths): what stacking saves, without the sweep's worker start-up,
    its final tests and the machine's other load (CPU time, not wall; on a GPU, wall time: :func:`clock`)."""
    from exactlens.train import train_many

    options = dict(epochs=epochs, strings_per_epoch=100, batch_size=100, eval_every=0, test_strings=1, test_length=1,
                   lr=3e-4, device=device)
    if device.type != "cpu":  # warm-up: the GPU's kernels and the first allocations outside the timing
        plain_run(lengths[0], 2, 1, 1, 0, device)
        train_many("first", [0, 1], train_length=lengths[0], **dict(options, epochs=2))
    out = {}
    for i, length in enumerate(lengths):
        times = {}
        for side in (("plain", "stacked") if i % 2 == 0 else ("stacked", "plain")):
            start = clock(device)
            if side == "plain":
                for seed in range(seeds):
                    plain_run(length, epochs, 1, 1, seed, device)
            else:
                train_many("first", list(range(seeds)), train_length=length, **options)
            times[side] = (clock(device) - start) / seeds
        out[length] = (times["plain"], times["stacked"])
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="16 short runs instead of Fig. 4's 80")
    parser.add_argument("--epochs", type=int, default=None, help="epochs per run (default 50; --quick 5)")
    parser.add_argument("--seeds", type=int, default=None, help="seeds per grid point (default 10; --quick 4)")
    parser.add_argument("--sweep-only", action="store_true", help="only the sweep (to compare two versions of "
                        "exactlens in the same conditions: the plain runs do not depend on it)")
    parser.add_argument("--cpu-epochs", type=int, default=None, help="epochs of the in-process CPU comparison "
                        "(default: half of --epochs)")
    parser.add_argument("--device", default="cpu", help="cpu (default); cuda / cuda:N: the in-process comparison "
                        "alone, on that GPU")
    add_arguments(parser)
    args = parser.parse_args()
    lengths, seeds, epochs, test_length, test_strings = fig4_settings(args, 50)
    if args.device != "cpu":
        return on_device(args, lengths, seeds, epochs)
    cores = os.cpu_count() or 1
    runs = len(lengths) * 2 * seeds
    goals = Goals("bench_stacked.py", quick=args.quick)
    print(f"Fig. 4: {runs} runs ({len(lengths)} lengths x 2 attentions x {seeds} seeds), {epochs} epochs of 100 words, "
          f"final test {test_strings} words of length {test_length}; {cores} CPUs, load average "
          f"{os.getloadavg()[0]:.2f}", flush=True)
    import exactlens as el

    with tempfile.TemporaryDirectory(prefix="bench-stacked-") as tmp:
        spec = Path(tmp) / "fig4.toml"
        spec.write_text(spec_text(lengths, seeds, epochs, test_length, test_strings))
        el.sweep(str(spec), dry_run=True)  # imports and checks outside the timing
        start = time.perf_counter()
        result = el.sweep(str(spec), out=str(Path(tmp) / "out"), engine="local")
        sweep_wall = time.perf_counter() - start
        if result["failed"]:
            raise SystemExit(f"the sweep failed: {result['failed']} jobs")
        rows = [json.loads(line) for line in (Path(tmp) / "out" / "results.jsonl").read_text().splitlines()]
    workers = min(cores, len(lengths) * 2)
    print(f"sweep (local engine, {workers} one-thread workers): {sweep_wall:.1f} s wall, load average "
          f"{os.getloadavg()[0]:.2f}", flush=True)
    units = sum(r["seconds"] for r in rows)  # each row: its run's share of its unit's wall time in the worker
    print(f"units, summed: {units:.1f} s of wall inside the workers ({units / runs:.3f} s per run)", flush=True)
    if args.sweep_only:
        goals.add("sweep: seconds per run (wall)", sweep_wall / runs, "s")
        goals.write(args.results, args.overwrite)
        return 0
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    plain: dict[int, list[float]] = {length: [] for length in lengths}
    try:
        plain_run(lengths[0], 2, test_length, test_strings, 0)  # warm-up
        start = time.perf_counter()
        for length in lengths:
            for _scaled in (False, True):
                plain[length] += [plain_run(length, epochs, test_length, test_strings, s) for s in range(seeds)]
        plain_wall = time.perf_counter() - start
        cpu = in_process(lengths, seeds, args.cpu_epochs or max(2, epochs // 2))
    finally:
        torch.set_num_threads(threads)
    print(f"plain PyTorch: {runs} runs one after the other, one thread: {plain_wall:.1f} s, load average "
          f"{os.getloadavg()[0]:.2f}")
    stacked = {length: [r["seconds"] for r in rows if r["grid"]["train_length"] == length] for length in lengths}
    print("| \\|w\\| | plain s/run | stacked s/run (share of its unit) | plain / stacked per run |")
    print("|---|---|---|---|")
    for length in lengths:
        p, s = sum(plain[length]) / len(plain[length]), sum(stacked[length]) / len(stacked[length])
        print(f"| {length} | {p:.3f} | {s:.3f} | {p / s:.2f}x |")
        goals.add(f"stacked vs plain, |w| = {length}, {epochs} epochs: plain s/run over stacked s/run", p / s, "x")
    print(f"in this process, one thread, training only ({args.cpu_epochs or max(2, epochs // 2)} epochs, {seeds} seeds "
          "per length), process CPU:")
    print("| \\|w\\| | plain CPU s/run | train_many CPU s/run | plain / stacked |")
    print("|---|---|---|---|")
    for length, (p, s) in cpu.items():
        print(f"| {length} | {p:.3f} | {s:.3f} | **{p / s:.2f}x** |")
        goals.add(f"plain runs vs train_many of {seeds} seeds, |w| = {length}, training only, CPU time", p / s, "x")
    print(f"load average {os.getloadavg()[0]:.2f}")
    ratio = plain_wall / sweep_wall
    per_core = plain_wall / (sweep_wall * workers)
    print(f"throughput: {runs}-run plain loop / sweep = **{ratio:.2f}x** (goal >= 10x); per core (the sweep's wall x "
          f"{workers} workers): {per_core:.2f}x; per run: plain {plain_wall / runs:.3f} s, sweep "
          f"{sweep_wall / runs:.3f} s wall ({sweep_wall * workers / runs:.3f} core-s)")
    if per_core < 1:
        print("stacking loses to one plain process per core at these settings")
    goals.add(f"Fig. 4 sweep ({runs} runs, {epochs} epochs) vs {runs} plain runs in a loop: wall ratio", ratio, "x",
              ">= 10")
    goals.add(f"the same per core ({workers} workers)", per_core, "x")
    goals.add("sweep: seconds per run (wall)", sweep_wall / runs, "s")
    goals.write(args.results, args.overwrite)
    return 0


def on_device(args: argparse.Namespace, lengths: list[int], seeds: int, epochs: int) -> int:
    """``--device cuda``: plain runs one after the other against one ``train_many`` of as many seeds, on the GPU."""
    from exactlens.devices import device_name, resolve_device

    device = resolve_device(args.device)
    goals = Goals("bench_stacked.py", quick=args.quick)
    cpu_epochs = args.cpu_epochs or max(2, epochs // 2)
    print(f"torch {torch.__version__}, {device_name(device)} ({torch.cuda.get_device_name(device)}); {seeds} seeds "
          f"per length, {cpu_epochs} epochs of 100 words, training only, wall time", flush=True)
    print("| \\|w\\| | plain wall s/run | train_many wall s/run | plain / stacked |")
    print("|---|---|---|---|")
    for length, (p, s) in in_process(lengths, seeds, cpu_epochs, device).items():
        print(f"| {length} | {p:.3f} | {s:.3f} | **{p / s:.2f}x** |", flush=True)
        goals.add(f"plain runs vs train_many of {seeds} seeds on {device_name(device)}, |w| = {length}, training only, "
                  "wall time", p / s, "x")
    goals.write(args.results, args.overwrite)
    return 0


if __name__ == "__main__":
    sys.exit(main())

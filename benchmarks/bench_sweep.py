"""Benchmark of ``exactlens sweep``: Chiang & Cholak Fig. 4 (FIRST trained at |w| = 10, 30, 100, 300,
standard vs log-n scaled attention, 10 seeds each: 80 runs) as one sweep, on the local engine and on a
local Ray cluster of the same machine, and the measured cost per job with an estimate for N machines.

Both engines run the same units (the 10 seeds of one grid point trained as one train_many computation),
so the tables must agree (checked: every job's test accuracy equal); the ratio local / Ray wall time
(Ray's on a running cluster; the cluster's start is printed beside it) is Ray's overhead on one machine.
The estimate for N machines of C cores schedules the measured units longest first on N x C slots, plus the
start-up measured here: a unit (a grid point's stack of seeds) is the indivisible piece, so 8 grid points
use at most 8 cores however many machines (``stack = K`` in the spec cuts them finer).

``--quick``: lengths 10 and 30, 4 seeds, 5 epochs, 20 test words of length 100 (16 runs, about a minute or two
on 2 cores). The full settings (1000 epochs, test length 1000) take about 20 minutes per engine on 2 cores.

Usage: PYTHONPATH=src python benchmarks/bench_sweep.py [--quick] [--epochs N] [--seeds N] [--results PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from goals import Goals, add_arguments, fmt


def spec_text(lengths: list[int], seeds: int, epochs: int, test_length: int, test_strings: int) -> str:
    return f"""[sweep]
seeds = {list(range(seeds))}

[[job]]
verb = "train"
name = "first"
options = {{ epochs = {epochs}, test_length = {test_length}, test_strings = {test_strings}, eval_every = 0 }}
grid = {{ train_length = {lengths}, scaled = [false, true] }}
"""


def fig4_settings(args: argparse.Namespace, epochs: int) -> tuple[list[int], int, int, int, int]:
    """(lengths, seeds, epochs, test length, test words) of Fig. 4 as the arguments ask; ``epochs`` the full
    default (``--quick``: lengths 10 and 30, 4 seeds, 5 epochs, 20 test words of length 100)."""
    lengths = [10, 30] if args.quick else [10, 30, 100, 300]
    seeds = args.seeds or (4 if args.quick else 10)
    test_length, test_strings = (100, 20) if args.quick else (1000, 100)
    return lengths, seeds, args.epochs or (5 if args.quick else epochs), test_length, test_strings


def run(engine: str, spec: Path, out: Path) -> tuple[float, list[dict]]:
    import exactlens as el

    start = time.perf_counter()
    result = el.sweep(str(spec), out=str(out), engine=engine)
    wall = time.perf_counter() - start
    if result["failed"]:
        raise SystemExit(f"{engine}: {result['failed']} jobs failed: "
                         + "; ".join(r["error"] for r in result["rows"] if r["error"]))
    return wall, [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]


def _unit_times(rows: list[dict]) -> list[float]:
    """Seconds per unit: the rows of one grid point share their stack's time."""
    units: dict[str, float] = {}
    for row in rows:
        key = json.dumps(row["grid"], sort_keys=True)
        units[key] = units.get(key, 0.0) + row["seconds"]
    return list(units.values())


def makespan(times: list[float], slots: int) -> float:
    """Wall time of the units on ``slots`` parallel workers, longest first to the least loaded."""
    loads = [0.0] * max(1, slots)
    for t in sorted(times, reverse=True):
        loads[loads.index(min(loads))] += t
    return max(loads)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="16 short runs instead of Fig. 4's 80")
    parser.add_argument("--epochs", type=int, default=None)
    parser.add_argument("--seeds", type=int, default=None)
    parser.add_argument("--skip-ray", action="store_true", help="the local engine only")
    add_arguments(parser)
    args = parser.parse_args()
    lengths, seeds, epochs, test_length, test_strings = fig4_settings(args, 1000)
    cores = os.cpu_count() or 1
    goals = Goals("bench_sweep.py", quick=args.quick)
    with tempfile.TemporaryDirectory(prefix="bench-sweep-") as tmp:
        spec = Path(tmp) / "fig4.toml"
        spec.write_text(spec_text(lengths, seeds, epochs, test_length, test_strings))
        jobs = len(lengths) * 2 * seeds
        units = len(lengths) * 2
        print(f"Fig. 4 as a sweep: {jobs} runs ({units} grid points x {seeds} seeds, {epochs} epochs), {cores} CPUs, "
              f"load average {os.getloadavg()[0]:.2f}", flush=True)
        import exactlens as el

        el.sweep(str(spec), dry_run=True)  # the driver's imports and the spec's checks, outside both timings
        local_wall, local_rows = run("local", spec, Path(tmp) / "local")
        per_unit = sum(r["seconds"] for r in local_rows) / units  # a row's seconds: its share of its stack's
        print(f"local engine: {local_wall:.1f} s wall; {per_unit:.1f} s per unit (a stack of {seeds} seeds), "
              f"{per_unit / seeds:.2f} s per run", flush=True)
        goals.add(f"sweep local: wall for {jobs} runs", local_wall, "s")
        goals.add("sweep: measured seconds per run (stacked)", per_unit / seeds, "s")
        if not args.skip_ray:
            try:
                import ray
            except ModuleNotFoundError:
                print("ray is not installed (pip install 'exactlens[ray]'): Ray engine skipped")
                ray = None
            if ray is not None:
                started = time.perf_counter()
                ray.init(num_cpus=cores, include_dashboard=False, log_to_driver=False)
                init_s = time.perf_counter() - started
                try:
                    ray_wall, ray_rows = run("ray", spec, Path(tmp) / "ray")
                finally:
                    ray.shutdown()
                same = all(a["job"] == b["job"] and a["headline"].get("test_accuracy") == b["headline"].get(
                    "test_accuracy") for a, b in zip(local_rows, ray_rows, strict=True))
                ratio = local_wall / ray_wall
                print(f"ray engine: {ray_wall:.1f} s wall on a running cluster (local / ray = {ratio:.2f}x); starting "
                      f"the local cluster took {init_s:.1f} s more (local / (start + ray) = "
                      f"{local_wall / (init_s + ray_wall):.2f}x); same test accuracies: {same}", flush=True)
                goals.add("sweep: local / ray wall time on one machine", ratio, "x", ">= 0.5")
                goals.add("sweep: ray table equals local (1 = yes)", float(same), "", ">= 1")
        unit_times = _unit_times(local_rows)
        overhead = max(0.0, local_wall - makespan(unit_times, min(cores, units)))
        print(f"estimate for N machines of {cores} cores: the measured units ({min(unit_times):.0f} to "
              f"{max(unit_times):.0f} s each, {seeds} stacked seeds) scheduled longest first on N x {cores} slots, "
              f"plus the start-up measured here ({overhead:.0f} s):")
        for n in (1, 2, 4, 8):
            slots = min(n * cores, units)
            print(f"  N = {n}: about {makespan(unit_times, slots) + overhead:.0f} s ({slots} units at a time)")
        print("  (a unit's time includes its final test at the test length, which does not grow with the epochs)")
    goals.write(args.results, overwrite=args.overwrite)
    print(fmt(local_wall, "s"), "local wall")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Benchmark of the unselectable-keys check: naive (one LP per key) vs fast.

Runs, in one process:

* n = 1024 standard-normal keys in d = 8, the same keys for both methods: naive once, fast
  ``--repeats`` times (2 runs before naive, the rest after, so both see the same load), the
  speed-up naive / median(fast) in wall-clock time (goal: at least 50x), its range over the fast
  runs, the same ratio in CPU time, and whether the selectable masks agree;
* n = 100000 keys in d = 64, fast alone: standard-normal keys (goal: under 60 s) and the same
  keys after layer norm (Brody's setting; every key is selectable there).

``--quick`` uses smaller sizes (n = 256 in d = 8, n = 5000 in d = 64) for a smoke run.
``--threads`` sets numpy's BLAS threads (OPENBLAS/OMP/MKL_NUM_THREADS, default 1, before numpy
loads). The check runs its large matrix products on one thread whatever this says
(``hull_products.THREADS``): on a loaded machine a multi-threaded BLAS spins on cores that other
processes hold; HiGHS, which the naive method runs on, is single-threaded.

Usage: PYTHONPATH=src python benchmarks/bench_hull.py [--quick] [--seed 0] [--repeats 5] [--threads 1]
       [--results PATH [--overwrite]]
"""

from __future__ import annotations

import os
import sys


def _threads_from_argv(argv: list[str]) -> str:
    for k, arg in enumerate(argv):
        if arg == "--threads" and k + 1 < len(argv):
            return argv[k + 1]
        if arg.startswith("--threads="):
            return arg.split("=", 1)[1]
    return "1"


if __name__ == "__main__":  # BLAS reads its thread count when numpy loads: set it before any import loads numpy
    for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[_var] = _threads_from_argv(sys.argv[1:])

import argparse  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402
from goals import Goals, add_arguments  # noqa: E402

from exactlens.analysis.hull import SelectabilityResult, layer_norm_geometric, selectable_keys  # noqa: E402


def _timed(keys: np.ndarray, method: str) -> tuple[SelectabilityResult, float, float]:
    """The result, wall-clock seconds and CPU seconds of one call."""
    wall, cpu = time.perf_counter(), time.process_time()
    res = selectable_keys(keys, method=method)
    return res, time.perf_counter() - wall, time.process_time() - cpu


def _stages(res: SelectabilityResult) -> str:
    return ", ".join(f"{k}={v}" for k, v in res.stats.items() if v)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller sizes for a smoke run")
    parser.add_argument("--seed", type=int, default=0, help="seed of the normal keys (default 0)")
    parser.add_argument("--repeats", type=int, default=5, help="fast runs at the side-by-side size (default 5)")
    parser.add_argument("--threads", type=int, default=1, help="BLAS threads (default 1; set before numpy loads)")
    add_arguments(parser)
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error("--repeats must be >= 1")

    n_cmp, d_cmp = (256, 8) if args.quick else (1024, 8)
    n_big, d_big = (5000, 64) if args.quick else (100_000, 64)
    rng = np.random.default_rng(args.seed)
    keys_cmp = rng.standard_normal((n_cmp, d_cmp))
    keys_big = rng.standard_normal((n_big, d_big))
    print(f"BLAS threads {os.environ.get('OPENBLAS_NUM_THREADS', 'default')}, "
          f"load average {os.getloadavg()[0]:.2f} (2-core machines shared with other work are noisy)")

    selectable_keys(rng.standard_normal((64, d_cmp)))  # warm-up: imports and first calls
    fast_runs = [_timed(keys_cmp, "fast") for _ in range(min(2, args.repeats))]
    naive_cmp, t_naive, c_naive = _timed(keys_cmp, "naive")
    fast_runs += [_timed(keys_cmp, "fast") for _ in range(args.repeats - len(fast_runs))]
    fast_cmp = fast_runs[0][0]
    agree = all(np.array_equal(r.selectable, naive_cmp.selectable) for r, _, _ in fast_runs)
    t_fast = statistics.median(t for _, t, _ in fast_runs)
    c_fast = statistics.median(c for _, _, c in fast_runs)
    ratio = t_naive / t_fast
    low, high = t_naive / max(t for _, t, _ in fast_runs), t_naive / min(t for _, t, _ in fast_runs)

    print(f"\nside by side, n = {n_cmp}, d = {d_cmp}, the same keys (fast: median of {args.repeats} runs)")
    print(f"{'method':<7}{'wall [s]':>10}{'cpu [s]':>10}{'unselectable':>14}{'agree':>7}  stages")
    for name, res, t, c in (("naive", naive_cmp, t_naive, c_naive), ("fast", fast_cmp, t_fast, c_fast)):
        unsel = f"{res.n_unselectable} ({res.fraction_unselectable:.1%})"
        print(f"{name:<7}{t:>10.3f}{c:>10.3f}{unsel:>14}{'yes' if agree else 'NO':>7}  {_stages(res)}")
    print(f"speed-up fast vs naive: {ratio:.1f}x wall (range {low:.1f}x-{high:.1f}x over the fast runs), "
          f"{c_naive / c_fast:.1f}x CPU time (goal >= 50x)")

    print(f"\nfast alone, n = {n_big}, d = {d_big}")
    goals = Goals("bench_hull.py", args.quick)
    goals.add(f"unselectable keys, fast vs naive speed-up, n = {n_cmp}, d = {d_cmp}", ratio, "x", ">= 50")
    for label, keys in (("standard normal", keys_big), ("after layer norm", layer_norm_geometric(keys_big))):
        res, t, c = _timed(keys, "fast")
        print(f"{label:<17} {t:8.2f} s wall {c:8.2f} s CPU  unselectable {res.n_unselectable} "
              f"({res.fraction_unselectable:.2%})  {_stages(res)}  (goal < 60 s)", flush=True)
        goals.add(f"unselectable keys, fast, n = {n_big}, d = {d_big}, {label} keys", t, "s", "< 60")
    goals.write(args.results, args.overwrite)
    if not agree:
        print("ERROR: fast and naive disagree", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

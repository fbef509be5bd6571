"""Benchmark of the unselectable-keys check: naive (one LP per key) vs fast.

Runs, in one process and on the same keys:

* n = 1024 standard-normal keys in d = 8: naive and fast side by side, their times and the
  speed-up (goal: fast at least 20x faster), and whether their selectable masks agree;
* n = 10000 keys in d = 16: fast alone (goal: under 30 s).

``--quick`` uses smaller sizes (n = 256 in d = 8, n = 2000 in d = 16) for a smoke run.

Usage: PYTHONPATH=src python benchmarks/bench_hull.py [--quick] [--seed 0]
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

from exactlens.analysis.hull import SelectabilityResult, selectable_keys


def _timed(keys: np.ndarray, method: str) -> tuple[SelectabilityResult, float]:
    start = time.perf_counter()
    res = selectable_keys(keys, method=method)
    return res, time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller sizes for a smoke run")
    parser.add_argument("--seed", type=int, default=0, help="seed of the normal keys (default 0)")
    args = parser.parse_args(argv)

    n_cmp, d_cmp = (256, 8) if args.quick else (1024, 8)
    n_big, d_big = (2000, 16) if args.quick else (10000, 16)
    rng = np.random.default_rng(args.seed)
    keys_cmp = rng.standard_normal((n_cmp, d_cmp))
    keys_big = rng.standard_normal((n_big, d_big))

    rows = []
    fast_cmp, t_fast_cmp = _timed(keys_cmp, "fast")
    naive_cmp, t_naive_cmp = _timed(keys_cmp, "naive")
    agree = bool(np.array_equal(fast_cmp.selectable, naive_cmp.selectable))
    rows.append(("naive", n_cmp, d_cmp, t_naive_cmp, naive_cmp, "yes" if agree else "NO"))
    rows.append(("fast", n_cmp, d_cmp, t_fast_cmp, fast_cmp, "yes" if agree else "NO"))
    fast_big, t_fast_big = _timed(keys_big, "fast")
    rows.append(("fast", n_big, d_big, t_fast_big, fast_big, "-"))

    header = f"{'method':<7}{'n':>7}{'d':>4}{'time [s]':>11}{'unselectable':>14}{'agree':>7}  stages"
    print(header)
    print("-" * len(header))
    for method, n, d, t, res, ok in rows:
        stages = ", ".join(f"{k}={v}" for k, v in res.stats.items() if v)
        unsel = f"{res.n_unselectable} ({res.fraction_unselectable:.1%})"
        print(f"{method:<7}{n:>7}{d:>4}{t:>11.3f}{unsel:>14}{ok:>7}  {stages}")
    ratio = t_naive_cmp / t_fast_cmp
    print()
    print(f"speed-up fast vs naive (n={n_cmp}, d={d_cmp}): {ratio:.1f}x (goal >= 20x)")
    print(f"fast on n={n_big}, d={d_big}: {t_fast_big:.2f} s (goal < 30 s)")
    if not agree:
        print("ERROR: fast and naive disagree", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Benchmark of the command line's start-up: `exactlens --help` and `exactlens list` against the
imports they no longer pay.

Each command runs in a fresh interpreter (what a user waits for), in rounds that alternate the
commands one by one, and the table gives the median and fastest wall time per command:

* ``--version``, ``--help``, ``list``, ``list --json``: the commands as installed (``python -m
  exactlens.cli``), with whatever plug-ins are installed;
* baseline ``everything``: the same interpreter importing what ``--help`` and ``list`` used to
  (every verb's arguments and every plug-in's objects: ``build_parser()`` with no argv, then
  ``exactlens.plugins.check_declared_facts()``, which imports every lazily registered entry);
* baseline ``import torch``: the floor under any command that needs torch.

It also reports whether each command imported torch (a fresh interpreter prints ``sys.modules``).
Goals: ``--help`` and ``list`` under 1 s and without torch. The exit status is 0 unless a command
fails: timings on a shared, loaded machine are noisy and are reported, not failed.

Usage: python benchmarks/bench_cli_startup.py [--quick] [--rounds N] [--results PATH]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

from goals import Goals, add_arguments, fmt

PROBE = "import sys; print('TORCH' if 'torch' in sys.modules else 'NO-TORCH', file=sys.stderr)"
COMMANDS = {
    "exactlens --version": ["-c", f"import sys; from exactlens.cli import main; main(['--version']); {PROBE}"],
    "exactlens --help": ["-c", "import contextlib, io, sys\nfrom exactlens.cli import main\n"
                         "with contextlib.redirect_stdout(io.StringIO()):\n"
                         "    try:\n        main(['--help'])\n    except SystemExit:\n        pass\n" + PROBE],
    "exactlens list": ["-c", f"import sys; from exactlens.cli import main; main(['list']); {PROBE}"],
    "exactlens list --json": ["-c", f"import sys; from exactlens.cli import main; main(['list', '--json']); {PROBE}"],
    "baseline: everything": ["-c", "import sys\nfrom exactlens.cli import build_parser\nbuild_parser()\n"
                             "from exactlens import plugins\nplugins.check_declared_facts()\n" + PROBE],
    "baseline: import torch": ["-c", f"import torch; {PROBE}"],
}


def run_once(args: list[str]) -> tuple[float, bool]:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    start = time.perf_counter()
    done = subprocess.run([sys.executable, *args], env=env, capture_output=True, text=True, timeout=600)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"command failed ({done.returncode}): {args}\n{done.stderr}")
    return seconds, "NO-TORCH" not in done.stderr.splitlines()[-1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="2 rounds")
    parser.add_argument("--rounds", type=int, default=5)
    add_arguments(parser)
    args = parser.parse_args()
    rounds = 2 if args.quick else args.rounds
    print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs; {rounds} rounds, fresh interpreters")
    times: dict[str, list[float]] = {name: [] for name in COMMANDS}
    torch_loaded: dict[str, bool] = {}
    for _ in range(rounds):
        for name, command in COMMANDS.items():
            seconds, loaded = run_once(command)
            times[name].append(seconds)
            torch_loaded[name] = loaded
    goals = Goals("bench_cli_startup.py", quick=args.quick)
    everything = statistics.median(times["baseline: everything"])
    print(f"{'command':26s} {'median':>8s} {'fastest':>8s} {'/ everything':>13s}  torch")
    for name, values in times.items():
        median = statistics.median(values)
        print(f"{name:26s} {median:7.2f}s {min(values):7.2f}s {median / everything:12.2f}x  "
              f"{'imported' if torch_loaded[name] else 'not imported'}")
    for name in ("exactlens --help", "exactlens list"):
        result = goals.add(f"{name}: median wall time", statistics.median(times[name]), "s", "< 1.0")
        print(f"{name}: {fmt(result.measured, 's')} (goal {result.goal}: {'met' if result.met else 'not met'}); "
              f"torch {'imported' if torch_loaded[name] else 'not imported'}")
        goals.add(f"{name}: imports torch (1 = yes)", float(torch_loaded[name]), "", "< 0.5")
    goals.write(args.results, overwrite=args.overwrite)
    return 0


if __name__ == "__main__":
    sys.exit(main())

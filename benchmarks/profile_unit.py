"""Where a stacked Fig. 4 sweep unit's time goes: one grid point (FIRST at one |w|, standard or log-n attention) of
``--seeds`` stacked seeds, ``--epochs`` epochs, final test of 100 words at |w| = 1000, in this process on one
thread, in process CPU seconds (not wall: the machine may be shared).

Phases, each measured on its own:

- start-up: a fresh interpreter importing what a sweep worker imports (``exactlens.train.loop``,
  ``exactlens.sweep.runner``), then the first optimizer it makes (torch imports ``torch._dynamo`` there);
- the whole unit: ``exactlens.sweep.runner.run_unit`` on the grid point's jobs (what a sweep worker runs: training,
  final tests, checkpoints, JSON), after a warm-up;
- training: ``train_many`` of the same seeds with a one-word test (the weights are the same: training never depends
  on the test options), and of that the words: the ``sample_batch`` calls of every run's epochs;
- final tests: ``evaluate`` of every trained model on its run's test words, with the preset's metric
  (attention to the first symbol) and without it;
- the rest (checkpoints, history and JSON writing, the rows): the unit less training and tests.

Runs against whatever ``exactlens`` is on PYTHONPATH, so one command measures two versions in the same conditions.

Usage: PYTHONPATH=src python benchmarks/profile_unit.py [--length 10] [--scaled] [--seeds 10] [--epochs 50] [--quick]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time

import torch

STARTUP = """
import time
start = time.process_time()
import exactlens.train.loop, exactlens.sweep.runner
imported = time.process_time()
import torch
torch.optim.Adam([torch.zeros(1, requires_grad=True)])
print(imported - start, time.process_time() - imported)
"""


def startup() -> tuple[float, float]:
    """(imports, first optimizer) CPU seconds of a fresh interpreter."""
    out = subprocess.run([sys.executable, "-c", STARTUP], capture_output=True, text=True, check=True, env=os.environ)
    imports, optimizer = (float(v) for v in out.stdout.split())
    return imports, optimizer


def cpu(fn):
    start = time.process_time()
    value = fn()
    return time.process_time() - start, value


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--length", type=int, default=10, help="training |w| (default 10)")
    parser.add_argument("--scaled", action="store_true", help="log-n scaled attention")
    parser.add_argument("--seeds", type=int, default=10, help="stacked seeds (default 10)")
    parser.add_argument("--epochs", type=int, default=50, help="epochs (default 50)")
    parser.add_argument("--quick", action="store_true", help="3 seeds, 5 epochs, test |w| = 100")
    args = parser.parse_args()
    seeds = 3 if args.quick else args.seeds
    epochs = 5 if args.quick else args.epochs
    test_length = 100 if args.quick else 1000
    if min(seeds, epochs, args.length) < 1:
        raise SystemExit("--seeds, --epochs and --length are positive integers")
    torch.set_num_threads(1)
    imports, optimizer = startup()

    from exactlens.sweep.runner import run_unit
    from exactlens.sweep.spec import parse_sweep
    from exactlens.train import train_many
    from exactlens.train.data import sample_batch
    from exactlens.train.evaluation import evaluate
    from exactlens.train.loop import seed_generators
    from exactlens.train.presets import get_preset

    options = dict(epochs=epochs, train_length=args.length, scaled=args.scaled, test_length=test_length,
                   test_strings=100, eval_every=0)
    spec_text = (f"[sweep]\nseeds = {list(range(seeds))}\n\n[[job]]\nverb = \"train\"\nname = \"first\"\n"
                 f"options = {{ {', '.join(f'{k} = {str(v).lower()}' for k, v in options.items())} }}\n")
    jobs = [j.to_dict() for j in parse_sweep(spec_text).jobs]
    train_many("first", [0], epochs=1, train_length=5, test_length=5, test_strings=1)  # warm-up
    with tempfile.TemporaryDirectory(prefix="profile-unit-") as tmp:
        unit, rows = cpu(lambda: run_unit(jobs, tmp))
    if any(r["status"] != "ok" for r in rows):
        raise SystemExit(f"the unit failed: {[r['error'] for r in rows]}")
    training, runs = cpu(lambda: train_many("first", list(range(seeds)), **{**options, "test_strings": 1,
                                                                            "test_length": 1}))
    spec = get_preset("first").spec(options)

    def words() -> None:
        for s in range(seeds):
            gen = seed_generators(s)["train"]
            for _ in range(epochs):
                sample_batch(spec.task, 100, (args.length, args.length), gen)

    drawing, _ = cpu(words)
    tests = [sample_batch(spec.task, 100, (test_length, test_length), seed_generators(r.seed)["test"], held_out=True)
             for r in runs]
    for run in runs:
        run.model.set_fused(True)  # as the loop's final test sees it (the loop turns fused kernels off after)
    tested, _ = cpu(lambda: [evaluate(r.model, w, spec.task, spec.metrics) for r, w in zip(runs, tests, strict=True)])
    bare, _ = cpu(lambda: [evaluate(r.model, w, spec.task, ()) for r, w in zip(runs, tests, strict=True)])
    rest = unit - training - tested
    print(f"one grid point: FIRST |w| = {args.length}{' (log-n)' if args.scaled else ''}, {seeds} stacked seeds, "
          f"{epochs} epochs, final test 100 words at |w| = {test_length}; one thread, process CPU s; load average "
          f"{os.getloadavg()[0]:.2f}")
    print("| phase | CPU s per unit | per run | share of the unit |")
    print("|---|---|---|---|")
    for name, value in (("whole unit (run_unit)", unit), ("training (train_many, one-word test)", training),
                        ("  of which drawing the words", drawing), ("final tests (evaluate, with the metric)", tested),
                        ("  of which the metric (with less without)", tested - bare),
                        ("checkpoints, JSON, rows (the rest)", rest)):
        print(f"| {name} | {value:.3f} | {value / seeds:.4f} | {value / unit:.0%} |")
    print(f"| worker start-up (once per worker): imports, first optimizer | {imports:.2f}, {optimizer:.2f} | | |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

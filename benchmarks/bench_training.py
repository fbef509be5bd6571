"""Training speed, each exactlens path against its baseline, side by side in one process.

(a) stacked runs: ``train_many(preset, seeds=range(R))`` (R runs as one computation,
    StackedRuns) against R sequential ``train(preset, seed=s)`` calls (the baseline), for
    R in ``--runs`` on the first / parity / majority presets at small settings (``SMALL``:
    100 words per epoch, short words, ``--epochs`` epochs, one evaluation on a few test words
    at the end). Rounds alternate which side runs first; the ratio is median(sequential) /
    median(stacked). Honesty check: each stacked run's final parameters against its own
    ``train`` (max |difference| over every parameter and run). Runs agree only to rounding
    (~1e-4 in float32, where Adam turns rounding in near-zero gradients into lr-sized steps),
    so the same check is repeated in float64 (R = the largest, ``--check-epochs`` epochs), where
    they must agree to ~1e-10.
(b) fused kernels: one training step-loop (the loop's runner for one run, SingleRun, run_losses,
    backward, Adam: the loop's step) of the same model on the same batches, ``set_fused(True)`` (the loop's
    setting: attention through scaled_dot_product_attention, layer norm through layer_norm)
    against ``set_fused(False)`` (the formulas); steps alternate one by one between the two
    copies; the ratio is median unfused / median fused step, and the two copies' parameters
    after every step are compared (rounding only).
(c) the runner's overhead: forward + backward of the loss through ``training_runs([model])``
    (SingleRun, what ``train`` runs for one run) against ``model.readout(..., readout_only=True)``
    of the same model on the same batch (fused on in both); calls alternate; ratio runner / plain
    (1 = no overhead); outputs and gradients are checked equal.
(d) ``--paper-loop 10,30,...``: the papers' batch-size-1 loop (torch.nn.TransformerEncoder,
    one word per Adam step, FIRST) against ``train("first")`` (one Adam step per epoch of 100
    words) and ``train_many`` with the largest R (time per run), as the README's speed table.

(b) and (c) run each preset at its small length and, with ``--long-length L`` (default 100,
0 = skip), FIRST at |w| = L, where the attention kernels dominate. One torch thread by
default (``--threads``). The load average is printed: on a shared machine ratios are noisy, so
each table also gives the ratio of the fastest round / step / call of each side as a cross-check.

Usage: PYTHONPATH=src python benchmarks/bench_training.py [--presets first,parity,majority] [--runs 1,4,10]
       [--epochs 20] [--rounds 3] [--steps 30] [--long-length 100] [--paper-loop 10,30,100,300] [--quick]
       [--results PATH]
"""

from __future__ import annotations

import argparse
import copy
import os
import random
import statistics
import time
from collections.abc import Callable

import torch
from goals import Goals, add_arguments

from exactlens.model import ExactTransformer
from exactlens.model.stacked import training_runs
from exactlens.tasks import kinds
from exactlens.train import get_preset, train, train_many
from exactlens.train.data import sample_batch
from exactlens.train.loop import new_model, run_losses, seed_generators, stack_batches

SMALL: dict[str, dict] = {
    "first": dict(train_length=10, strings_per_epoch=100, test_strings=10, test_length=10, eval_every=0),
    "parity": dict(train_length=10, strings_per_epoch=100, test_strings=10, test_length=10, eval_every=0),
    "majority": dict(train_length=50, strings_per_epoch=100, test_strings=10, test_length=50, eval_every=0),
}
"""Small settings per preset (the presets' architectures, 100 words per epoch)."""


def load() -> str:
    return ", ".join(f"{v:.1f}" for v in os.getloadavg())


def max_param_diff(a: ExactTransformer, b: ExactTransformer) -> float:
    pairs = zip(a.state_dict().values(), b.state_dict().values(), strict=True)
    return max((float((x - y).abs().max()) for x, y in pairs if x.numel()), default=0.0)


# ---- (a) train_many vs sequential train --------------------------------------------------------


def stacked_vs_sequential(preset: str, runs: list[int], options: dict, rounds: int) -> list[dict]:
    train(preset, seed=0, **dict(options, epochs=1))  # warm-up: both code paths, vmap included
    train_many(preset, range(2), **dict(options, epochs=1))
    rows = []
    for r_count in runs:
        seeds = list(range(r_count))
        times: dict[str, list[float]] = {"sequential": [], "stacked": []}
        diff = 0.0
        for r in range(rounds):
            order = ("sequential", "stacked") if r % 2 == 0 else ("stacked", "sequential")
            for side in order:
                start = time.perf_counter()
                if side == "sequential":
                    single = [train(preset, seed=s, **options) for s in seeds]
                else:
                    many = train_many(preset, seeds, **options)
                times[side].append(time.perf_counter() - start)
            diff = max(diff, max(max_param_diff(m.model, s.model) for m, s in zip(many, single, strict=True)))
        seq, stk = statistics.median(times["sequential"]), statistics.median(times["stacked"])
        best = min(times["sequential"]) / min(times["stacked"])
        rows.append(dict(preset=preset, runs=r_count, sequential=seq, stacked=stk, ratio=seq / stk, best=best,
                         diff=diff, per_run_epoch=stk / r_count / options["epochs"]))
    return rows


def float64_agreement(preset: str, r_count: int, options: dict) -> float:
    opts = dict(options, dtype="float64")
    many = train_many(preset, range(r_count), **opts)
    return max(max_param_diff(m.model, train(preset, seed=m.seed, **opts).model) for m in many)


# ---- (b) fused vs unfused, (c) StackedRuns vs model.readout ------------------------------------


class Case:
    """A preset's model (seed 0, prepared as the loop prepares it) and training batches."""

    def __init__(self, preset: str, options: dict, batches: int):
        self.label = f"{preset} (\\|w\\| = {options['train_length']})"
        self.spec = get_preset(preset).spec(dict(options, epochs=batches))
        gens = seed_generators(0)
        self.model = new_model(self.spec, gens["init"])  # train mode, fused on: the loop's model
        opts = self.spec.options
        count, lengths = opts["strings_per_epoch"], opts["train_length"]
        self.batches = [
            stack_batches([sample_batch(self.spec.task, count, lengths, gens["train"])]) for _ in range(batches)
        ]


def fused_vs_unfused(case: Case, warmup: int) -> dict:
    lr = case.spec.options["lr"]
    sides = {}
    for fused in (True, False):
        runs = training_runs([copy.deepcopy(case.model).set_fused(fused)])
        sides[fused] = (runs, torch.optim.Adam(runs.trainable, lr=lr, foreach=True), [])

    def step(fused: bool, tokens: torch.Tensor, n_positions: torch.Tensor, targets: torch.Tensor) -> float:
        runs, optim, _ = sides[fused]
        start = time.perf_counter()
        losses, _ = run_losses(case.spec.task, runs.readout(tokens, n_positions), targets, n_positions)
        optim.zero_grad(set_to_none=True)
        losses.sum().backward()
        optim.step()
        return time.perf_counter() - start

    for i, (tokens, n_positions, targets) in enumerate(case.batches):
        for fused in (True, False) if i % 2 == 0 else (False, True):
            seconds = step(fused, tokens, n_positions, targets)
            if i >= warmup:
                sides[fused][2].append(seconds)
    fused_s, plain_s = statistics.median(sides[True][2]), statistics.median(sides[False][2])
    a, b = sides[True][0].params, sides[False][0].params
    diff = max((float((a[k] - b[k]).detach().abs().max()) for k in a if a[k].numel()), default=0.0)
    best = min(sides[False][2]) / min(sides[True][2])
    return dict(case=case.label, fused=fused_s, unfused=plain_s, ratio=plain_s / fused_s, best=best, diff=diff)


def stacked_overhead(case: Case, calls: int) -> dict:
    model = copy.deepcopy(case.model)
    runs = training_runs([copy.deepcopy(case.model)])
    names = [name for name, p in runs.params.items() if p.requires_grad]
    task = case.spec.task
    tokens, n_positions, targets = case.batches[0]

    def stacked() -> tuple[torch.Tensor, list[torch.Tensor]]:
        for p in runs.trainable:
            p.grad = None
        out = runs.readout(tokens, n_positions)[0]
        kinds.loss(task, out, targets[0], n_positions[0]).mean().backward()
        return out, [runs.grad(n)[0] if runs.grad(n) is not None else torch.zeros_like(runs.params[n][0])
                     for n in names]

    def plain() -> tuple[torch.Tensor, list[torch.Tensor]]:
        model.zero_grad(set_to_none=True)
        out = model.readout(tokens[0], n_positions[0], readout_only=True)
        kinds.loss(task, out, targets[0], n_positions[0]).mean().backward()
        trainable = [p for p in model.parameters() if p.requires_grad]
        return out, [p.grad if p.grad is not None else torch.zeros_like(p) for p in trainable]

    (out_s, grad_s), (out_p, grad_p) = stacked(), plain()
    out_diff = float((out_s - out_p).detach().abs().max())
    grad_diff = max((float((g - h).abs().max()) for g, h in zip(grad_s, grad_p, strict=True) if g.numel()), default=0.0)
    times: dict[Callable, list[float]] = {stacked: [], plain: []}
    for i in range(calls):
        for fn in (stacked, plain) if i % 2 == 0 else (plain, stacked):
            start = time.perf_counter()
            fn()
            times[fn].append(time.perf_counter() - start)
    s, p = statistics.median(times[stacked]), statistics.median(times[plain])
    best = min(times[stacked]) / min(times[plain])
    return dict(case=case.label, stacked=s, plain=p, ratio=s / p, best=best, out_diff=out_diff, grad_diff=grad_diff)


# ---- (d) the papers' batch-size-1 loop -----------------------------------------------------------


class PaperLoopModel(torch.nn.Module):
    """FIRST model as in the papers' description (Chiang & Cholak §5.1), PyTorch's own encoder layers.
    ``forward`` takes one word [pos] (the papers' loop) or a batch [batch, pos] (bench_vs_torch.py)."""

    def __init__(self, size: int = 16):
        super().__init__()
        self.word_embedding = torch.nn.Embedding(3, size)
        self.pos_adapter = torch.nn.Linear(1, size, bias=False)
        layer = torch.nn.TransformerEncoderLayer(size, 1, dim_feedforward=4 * size, dropout=0.0, norm_first=False,
                                                 batch_first=True)
        self.encoder = torch.nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False)
        self.output_layer = torch.nn.Linear(size, 1)

    def forward(self, w: torch.Tensor) -> torch.Tensor:
        words = w if w.ndim == 2 else w.unsqueeze(0)
        is_first = (torch.arange(words.shape[1], device=words.device) == 1).float().view(1, -1, 1)  # I[i = 1]
        y = self.encoder(self.word_embedding(words) + self.pos_adapter(is_first))
        logits = self.output_layer(y[:, 0])[:, 0]
        return logits if w.ndim == 2 else logits[0]


def paper_epochs(model: PaperLoopModel, optim: torch.optim.Optimizer, length: int, epochs: int,
                 rng: random.Random) -> None:
    """One word per step: Python-list sampling, forward, loss, backward, Adam step, loss.item()."""
    for _ in range(epochs):
        for _ in range(100):
            w = torch.tensor([2] + [rng.randrange(2) for _ in range(length)])
            target = torch.tensor(float(w[1] == 1))
            loss = torch.nn.functional.binary_cross_entropy_with_logits(model(w), target)
            optim.zero_grad()
            loss.backward()
            optim.step()
            loss.item()


def paper_loop(length: int, epochs: int, rounds: int, runs: int) -> dict:
    model = PaperLoopModel()
    optim = torch.optim.Adam(model.parameters(), lr=3e-4)
    rng = random.Random(0)
    common = dict(epochs=epochs, train_length=length, eval_every=0, test_strings=1, test_length=1)
    paper_epochs(model, optim, length, 1, rng)  # warm-up
    train("first", **dict(common, epochs=1))
    times: dict[str, list[float]] = {"paper": [], "one": [], "many": []}
    for r in range(rounds):
        start = time.perf_counter()
        paper_epochs(model, optim, length, epochs, rng)
        times["paper"].append((time.perf_counter() - start) / epochs)
        start = time.perf_counter()
        train("first", seed=r, **common)
        times["one"].append((time.perf_counter() - start) / epochs)
        start = time.perf_counter()
        train_many("first", range(r * runs, (r + 1) * runs), **common)
        times["many"].append((time.perf_counter() - start) / epochs / runs)
    med = {k: statistics.median(v) for k, v in times.items()}
    return dict(length=length, runs=runs, **med)


# ---- main ------------------------------------------------------------------------------------------


def ints(text: str) -> list[int]:
    return [int(v) for v in text.split(",") if v.strip()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--presets", default="first,parity,majority")
    parser.add_argument("--runs", default="1,4,10", help="R values for (a)")
    parser.add_argument("--epochs", type=int, default=20, help="epochs per run in (a) and (d)")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds in (a) and (d)")
    parser.add_argument("--check-epochs", type=int, default=5, help="epochs of the float64 agreement check")
    parser.add_argument("--steps", type=int, default=30, help="timed steps in (b), timed calls in (c)")
    parser.add_argument("--long-length", type=int, default=100, help="FIRST at this |w| in (b) and (c); 0 = skip")
    parser.add_argument("--paper-loop", default="", help="lengths for (d), e.g. 10,30,100,300 (default: skip)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--quick", action="store_true", help="smoke run: R in 1,4, 5 epochs, 1 round, 10 steps")
    add_arguments(parser)
    args = parser.parse_args()
    goals = Goals("bench_training.py", args.quick)
    if args.quick:
        args.runs, args.epochs, args.rounds, args.steps, args.check_epochs = "1,4", 5, 1, 10, 2
    torch.set_num_threads(args.threads)
    presets = [p.strip() for p in args.presets.split(",") if p.strip()]
    runs = ints(args.runs)
    wall = time.perf_counter()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread(s), {os.cpu_count()} CPUs, "
          f"load average {load()}")

    print(f"\n(a) train_many(preset, seeds=range(R)) vs R sequential train(preset, seed=s): {args.epochs} epochs of "
          f"100 words, median of {args.rounds} alternating rounds")
    print("| preset | R | sequential s | stacked s | stacked s/epoch per run | speed-up | best rounds | "
          "max abs param diff |")
    print("|---|---|---|---|---|---|---|---|")
    checks = []
    for preset in presets:
        options = dict(SMALL[preset], epochs=args.epochs)
        for row in stacked_vs_sequential(preset, runs, options, args.rounds):
            print(f"| {preset} (\\|w\\| = {options['train_length']}) | {row['runs']} | {row['sequential']:.3f} | "
                  f"{row['stacked']:.3f} | {row['per_run_epoch']:.4f} | **{row['ratio']:.2f}x** | {row['best']:.2f}x | "
                  f"{row['diff']:.1e} |", flush=True)
            goals.add(f"(a) {preset}: train_many R = {row['runs']} vs R sequential train", row["ratio"], "x")
        checks.append((preset, float64_agreement(preset, max(runs), dict(options, epochs=args.check_epochs))))
    print(f"float64, R = {max(runs)}, {args.check_epochs} epochs: max abs param diff stacked vs own train: "
          + ", ".join(f"{p} {d:.1e}" for p, d in checks))

    cases = [Case(p, SMALL[p], args.steps + 3) for p in presets]
    if args.long_length and "first" in presets:
        cases.append(Case("first", dict(SMALL["first"], train_length=args.long_length), args.steps + 3))

    print(f"\n(b) one training step (StackedRuns R = 1, loss, backward, Adam), set_fused(True) vs set_fused(False), "
          f"median of {args.steps} alternating steps after 3 warm-up steps")
    print("| case | unfused ms/step | fused ms/step | speed-up | fastest steps | max abs param diff after all steps |")
    print("|---|---|---|---|---|---|")
    for case in cases:
        row = fused_vs_unfused(case, warmup=3)
        print(f"| {row['case']} | {row['unfused'] * 1e3:.2f} | {row['fused'] * 1e3:.2f} | **{row['ratio']:.2f}x** | "
              f"{row['best']:.2f}x | {row['diff']:.1e} |", flush=True)
        goals.add(f"(b) {row['case']}: fused vs formulas, one training step", row["ratio"], "x")

    print(f"\n(c) forward + backward of the loss: the loop's runner (SingleRun) vs model.readout(readout_only=True), "
          f"fused on, median of {args.steps} alternating calls")
    print("| case | plain ms | runner ms | overhead (runner / plain) | fastest calls | "
          "max abs diff outputs / gradients |")
    print("|---|---|---|---|---|---|")
    for case in cases:
        row = stacked_overhead(case, args.steps)
        print(f"| {row['case']} | {row['plain'] * 1e3:.2f} | {row['stacked'] * 1e3:.2f} | **{row['ratio']:.2f}x** | "
              f"{row['best']:.2f}x | {row['out_diff']:.1e} / {row['grad_diff']:.1e} |", flush=True)
        goals.add(f"(c) {row['case']}: the loop's runner / model.readout, forward + backward", row["ratio"], "x")

    if args.paper_loop:
        many = max(runs)
        print(f"\n(d) FIRST, the papers' batch-size-1 loop vs train (1 run) and train_many ({many} runs, per run), "
              f"s per epoch of 100 words, median of {args.rounds} rounds")
        print(f"| \\|w\\| | paper loop s/epoch | 1 run s/epoch | {many} runs s/epoch per run | paper / 1 run | "
              f"paper / {many} runs |")
        print("|---|---|---|---|---|---|")
        for length in ints(args.paper_loop):
            row = paper_loop(length, args.epochs, args.rounds, many)
            print(f"| {length} | {row['paper']:.3f} | {row['one']:.4f} | {row['many']:.4f} | "
                  f"{row['paper'] / row['one']:.0f}x | **{row['paper'] / row['many']:.0f}x** |", flush=True)
            goals.add(f"(d) FIRST |w| = {length}: papers' batch-1 loop / train_many ({many} runs), per run",
                      row["paper"] / row["many"], "x", ">= 50")
            goals.add(f"(d) FIRST |w| = {length}: papers' batch-1 loop / train (1 run)", row["paper"] / row["one"], "x")
    print(f"\nwall {time.perf_counter() - wall:.0f} s, load average after: {load()}")
    goals.write(args.results, args.overwrite)


if __name__ == "__main__":
    main()

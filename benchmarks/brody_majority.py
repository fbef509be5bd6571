"""Brody et al. (2023) Fig. 2-3 at the paper's scale: MAJORITY with and without LN's projection.

Trains the ``majority-per-position`` preset (the authors' layer: d = 8, one head, FFN 8, pre-LN,
no positions; the majority class predicted at every position of words of length 50 over 20
classes) with ``layer_norm="full"`` (projection + scaling) and ``"scale_only"`` (x / RMS(x), no
projection), ``--runs`` seeds per variant trained together as one stacked computation
(``exactlens.train.train_many``). Defaults are App. E.1's: Adam lr 1e-3 with a linear schedule,
batch 6000, 17K steps (1000 epochs of 17 steps), 10 runs; the test accuracy and the query angle are
measured every 17 steps (one of the paper's epochs) on 2000 fresh words.

The training loss is computed from each word's token counts (exactlens.papers.brody.counted: the
model has no positions, so this is the same loss; ``--per-position-loss`` trains through the
model's per-position forward instead). Prints the cost per step first (``--time-only`` stops
there, after timing the per-position path beside it), a progress line at each evaluation,
then per variant: final training loss, test accuracy and angle (mean and std over runs) and the
first step at which the mean test accuracy reaches 0.5 / 0.9. Writes ``majority_<variant>.json``
after each variant and ``majority.json`` + ``majority.png`` (the curves: mean and min-max band)
at the end to ``--out``. A measurement of training, not a speed goal.

Usage: PYTHONPATH=src python benchmarks/brody_majority.py [--steps 17000] [--runs 10] [--batch 6000]
       [--lr 1e-3] [--lr-schedule linear|constant] [--quick] [--out DIR] [--overwrite] [--time-only]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shlex
import sys
import time
from pathlib import Path

import torch

from exactlens.jsonio import dumps
from exactlens.outputs import check_output, write_text
from exactlens.papers.brody.majority_training import (
    PAPER_SETTINGS,
    QUICK_SETTINGS,
    merge_runs,
    paper_variant,
    plot_paper_majority,
    summarize_paper_majority,
)


def _fmt(value: object, spec: str = ".3f") -> str:
    return "-" if value is None else format(value, spec)


def time_one_step(settings: dict, layer_norm: str = "full", steps: int = 4) -> float:
    """Seconds per Adam step of ``settings['runs']`` stacked runs at ``settings['batch']`` words
    (sampling, forward, backward, update; no evaluation): a run of 1 + steps steps less a run of 1
    step, so that set-up costs cancel, after a first run of 1 step that pays the first-call costs."""
    seconds = []
    for n in (1, 1, 1 + steps):
        probe = dict(settings, steps=n, eval_every=0, test_strings=10)
        start = time.perf_counter()
        paper_variant(layer_norm, probe)
        seconds.append(time.perf_counter() - start)
    return max(seconds[2] - seconds[1], 0.0) / steps


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="seconds: 6 steps of 60 words, 2 runs")
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--runs", type=int, default=None, help="seeds per variant, trained as one computation")
    parser.add_argument("--batch", type=int, default=None)
    parser.add_argument("--lr", type=float, default=None)
    parser.add_argument("--lr-schedule", choices=("linear", "constant"), default=None)
    parser.add_argument("--eval-every", type=int, default=None, help="steps between evaluations")
    parser.add_argument("--test-strings", type=int, default=None)
    parser.add_argument("--min-margin", type=int, default=None,
                        help="majority count minus the runner-up's (default: the preset's 6, the authors' data)")
    parser.add_argument("--per-position-loss", action="store_true",
                        help="train through the model's per-position forward (counted_loss=False), not from token "
                        "counts (the same loss, ~10x slower at batch 6000)")
    parser.add_argument("--variants", nargs="+", default=["full", "scale_only"])
    parser.add_argument("--first-seed", type=int, default=0,
                        help="seeds first-seed .. first-seed + runs - 1 (to add runs later: --combine merges them)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--time-only", action="store_true", help="measure the cost per step and stop")
    parser.add_argument("--combine", nargs="+", default=None, metavar="VARIANT_JSON",
                        help="train nothing: build majority.json and the figure from majority_<variant>.json files "
                        "of earlier runs (same settings; files of one variant over other seeds are merged)")
    parser.add_argument("--source-command", action="append", default=[],
                        help="with --combine: the command that wrote each variant file (recorded as the provenance)")
    parser.add_argument("--out", default=None, help="directory for the JSON results and the figure")
    parser.add_argument("--overwrite", action="store_true")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    settings = dict(QUICK_SETTINGS if args.quick else PAPER_SETTINGS)
    for key in ("steps", "runs", "batch", "lr", "lr_schedule", "eval_every", "test_strings", "min_margin"):
        if getattr(args, key) is not None:
            settings[key] = getattr(args, key)
    if args.per_position_loss:
        settings["counted_loss"] = False
    out = Path(args.out) if args.out else None
    if out is not None:
        for name in ("majority.json", "majority.png", *(f"majority_{v}.json" for v in args.variants)):
            check_output(out / name, overwrite=args.overwrite, kind="file", what="benchmark output")
    given = argv if argv is not None else sys.argv[1:]
    command = "PYTHONPATH=src python benchmarks/brody_majority.py " + shlex.join(given)
    if args.combine:
        return combine(args, out, command)
    print(f"settings: {settings}; {args.threads} thread(s); load average {os.getloadavg()}", flush=True)

    per_step = time_one_step(settings)
    if args.time_only and settings.get("counted_loss", True):  # the per-position path beside it, same process
        direct = time_one_step(dict(settings, counted_loss=False))
        print(f"per-position loss: {direct:.2f} s per step; counted loss: {per_step:.2f} s per step "
              f"({direct / max(per_step, 1e-9):.1f}x faster, same loss: tests/papers/brody/test_counted_loss.py)",
              flush=True)
    full = PAPER_SETTINGS["steps"] * len(args.variants) * per_step
    print(f"cost: {per_step:.2f} s per step for {settings['runs']} stacked runs of batch {settings['batch']} "
          f"({per_step / settings['runs']:.3f} s per run-step); this run "
          f"~{settings['steps'] * len(args.variants) * per_step / 60:.0f} min + evaluations; the paper's "
          f"{PAPER_SETTINGS['steps']} steps x {len(args.variants)} variants at this size ~{full / 3600:.1f} h",
          flush=True)
    if args.time_only:
        return 0

    started = time.perf_counter()
    variants = []
    for ln in args.variants:
        variant_start = time.perf_counter()

        def progress(line: str, ln: str = ln, variant_start: float = variant_start) -> None:
            if f" seed {args.first_seed} " in line:
                print(f"  {ln}: {line} ({time.perf_counter() - variant_start:.0f} s)", flush=True)

        seeds = range(args.first_seed, args.first_seed + settings["runs"])
        variant = paper_variant(ln, settings, seeds=seeds, progress=progress)
        variants.append(variant)
        print(f"{ln}: {len(variant['steps'])} steps x {settings['runs']} runs in {variant['wall_s']:.0f} s "
              f"({variant['s_per_step']:.2f} s per step)", flush=True)
        if out is not None:
            write_text(out / f"majority_{ln}.json", dumps(variant) + "\n", overwrite=args.overwrite)

    wall = time.perf_counter() - started
    data = {
        "command": command,
        "date": datetime.date.today().isoformat(),
        "settings": settings,
        "paper_settings": PAPER_SETTINGS,
        "threads": args.threads,
        "torch": torch.__version__,
        "wall_s": wall,
        "s_per_step_measured": per_step,
        "variants": variants,
    }
    report(data, out, args.overwrite)
    return 0


def combine(args: argparse.Namespace, out: Path | None, command: str) -> int:
    """majority.json from per-variant files of earlier runs of this script (same settings)."""
    if out is None:
        raise SystemExit("--combine needs --out")
    loaded = [json.loads(Path(f).read_text(encoding="utf-8")) for f in args.combine]
    options = {json.dumps(v["options"], sort_keys=True) for v in loaded}
    if len(options) != 1:
        raise SystemExit("--combine: the variant files were trained with different settings")
    by_variant: dict[str, list[dict]] = {}
    for part in loaded:  # files of one variant over other seeds are merged into one
        by_variant.setdefault(part["layer_norm"], []).append(part)
    variants = [merge_runs(parts) for parts in by_variant.values()]
    first = variants[0]
    settings = {"steps": len(first["steps"]), "batch": first["options"]["batch_size"], "lr": first["options"]["lr"],
                "lr_schedule": first["options"]["lr_schedule"], "runs": len(first["seeds"]),
                "eval_every": first["options"]["eval_every"], "test_strings": first["options"]["test_strings"]}
    data = {
        "command": " && ".join([*args.source_command, command]),
        "date": datetime.date.today().isoformat(),
        "settings": settings,
        "paper_settings": PAPER_SETTINGS,
        "threads": args.threads,
        "torch": torch.__version__,
        "wall_s": sum(v["wall_s"] for v in variants),
        "s_per_step_measured": None,
        "variants": variants,
    }
    report(data, out, args.overwrite)
    return 0


def report(data: dict, out: Path | None, overwrite: bool) -> None:
    """Print the summary table; write majority.json and majority.png to ``out``."""
    settings, variants, wall = data["settings"], data["variants"], data["wall_s"]
    data["summary"] = summarize_paper_majority(data)
    print(f"\nMAJORITY (Brody et al. Fig. 2-3): {settings['runs']} runs per variant, {settings['steps']} steps "
          f"of {settings['batch']} words, lr {settings['lr']} {settings['lr_schedule']}; wall {wall:.0f} s")
    print("| variant | params | final train loss | final test acc | angle first -> final (deg) | "
          "mean acc >= 0.5 at step | >= 0.9 at step |")
    print("|---|---|---|---|---|---|---|")
    for row, variant in zip(data["summary"], variants, strict=True):
        print(f"| {row['label']} | {variant['n_parameters']} | {_fmt(row['final_train_loss'])} "
              f"+- {_fmt(row['final_train_loss_std'])} | {_fmt(row['final_test_accuracy'])} "
              f"+- {_fmt(row['final_test_accuracy_std'])} | {_fmt(row['first_angle_deg'], '.1f')} -> "
              f"{_fmt(row['final_angle_deg'], '.1f')} +- {_fmt(row['final_angle_deg_std'], '.1f')} | "
              f"{_fmt(row['mean_steps_to_0.5'], 'd')} | {_fmt(row['mean_steps_to_0.9'], 'd')} |")
    if out is not None:
        write_text(out / "majority.json", dumps(data) + "\n", overwrite=overwrite)
        plot_paper_majority(data, out / "majority.png")
        print(f"wrote {out / 'majority.json'} and {out / 'majority.png'}")


if __name__ == "__main__":
    sys.exit(main())

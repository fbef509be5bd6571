"""`exactlens train TASK --out DIR [options] [--json]`: train a model with a paper preset.

Writes DIR/config.json + DIR/weights.pt (load with ExactTransformer.load(DIR)),
DIR/history.jsonl (one record per epoch) and DIR/run.json (task, seed, options, timing,
final metrics). Options not given keep the preset's value (the paper's setting); see
`exactlens train --help` for the presets. With --json, stdout carries exactly one JSON
object (run.json's content); progress goes to stderr.

--seeds 0:9 (or 0,3,7) trains one run per seed together (exactlens.train.train_many;
each run equals its single --seed run) into DIR/seed{s}/; --json then prints one object
{"runs": [run.json of each seed]}.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

__all__ = ["add_train_parser", "cmd_train", "parse_length", "parse_seeds"]

TASKS = ("first", "parity", "one", "majority")  # = exactlens.train.PRESETS (checked by a test)


def parse_length(text: str) -> int | tuple[int, int]:
    """'100' -> 100; '1:100' -> (1, 100) (inclusive range, drawn uniformly per word)."""
    from exactlens.errors import ExactLensError

    try:
        if ":" in text:
            lo, hi = text.split(":")
            return int(lo), int(hi)
        return int(text)
    except ValueError:
        raise ExactLensError(f"a length is an integer |w| or an inclusive range LO:HI, got {text!r}") from None


def parse_seeds(text: str) -> list[int]:
    """'0:9' -> [0, ..., 9] (inclusive); '0,3,7' -> [0, 3, 7]."""
    from exactlens.errors import ExactLensError

    try:
        if ":" in text:
            lo, hi = (int(v) for v in text.split(":"))
            seeds = list(range(lo, hi + 1))
        else:
            seeds = [int(v) for v in text.split(",")]
    except ValueError:
        raise ExactLensError(f"--seeds takes LO:HI (inclusive) or a comma list of integers, got {text!r}") from None
    if not seeds or min(seeds) < 0:
        raise ExactLensError(f"--seeds must name at least one seed, all >= 0, got {text!r}")
    return seeds


def cmd_train(args: argparse.Namespace) -> None:
    from exactlens.train import train, train_many

    names = (
        "epochs",
        "strings_per_epoch",
        "batch_size",
        "test_strings",
        "eval_every",
        "lr",
        "lr_schedule",
        "dtype",
        "d_model",
        "d_mlp",
        "ln_eps",
        "layer_norm",
        "positions",
        "num_classes",
        "threads",
    )
    options: dict[str, Any] = {n: getattr(args, n) for n in names if getattr(args, n) is not None}
    for name in ("train_length", "test_length"):
        if getattr(args, name) is not None:
            options[name] = parse_length(getattr(args, name))
    if args.scaled:
        options["scaled"] = True

    def progress(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    if args.seeds is not None:
        runs = train_many(args.task, parse_seeds(args.seeds), out=args.out, progress=progress, **options)
        if args.json:
            sys.stdout.write(json.dumps({"runs": [r.info for r in runs]}) + "\n")
            return
        for r in runs:
            sys.stdout.write(
                f"{args.task} seed {r.seed}: final test accuracy {r.final['test_accuracy']:.4f}, test cross-entropy "
                f"{r.final['test_loss_bits']:.4f} bits/string; checkpoint {r.checkpoint}\n"
            )
        sys.stdout.write(f"{len(runs)} runs trained together in {runs[0].wall_s:.1f} s\n")
        return
    run = train(args.task, out=args.out, seed=args.seed, progress=progress, **options)
    final = run.final
    if args.json:
        sys.stdout.write(json.dumps(run.info) + "\n")
    else:
        sys.stdout.write(
            f"{args.task} seed {args.seed}: {run.info['steps']} steps in {run.wall_s:.1f} s; final test accuracy "
            f"{final['test_accuracy']:.4f}, test cross-entropy {final['test_loss_bits']:.4f} bits/string; "
            f"checkpoint {args.out}\n"
        )


def add_train_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register the `train` subcommand."""
    p = subparsers.add_parser(
        "train",
        help="train a comparable model with a paper preset (Chiang & Cholak, Nowak et al., Brody et al.)",
        description=__doc__.split("\n\n")[1],
    )
    p.add_argument(
        "task", choices=TASKS, help="preset: first/parity (Chiang & Cholak §5), one (Nowak §4.2), majority (Brody §4.1)"
    )
    p.add_argument("--out", required=True, help="checkpoint directory")
    seeds = p.add_mutually_exclusive_group()
    seeds.add_argument("--seed", type=int, default=0, help="fixes initialization, training and test data")
    seeds.add_argument(
        "--seeds", help="LO:HI or a comma list: one run per seed, trained together, into OUT/seed{s}/"
    )
    p.add_argument("--json", action="store_true", help="print one JSON object (run.json) on stdout")
    p.add_argument("--scaled", action="store_true", help="attention logits times log n (Chiang & Cholak §5.3)")
    p.add_argument("--epochs", type=int)
    p.add_argument("--strings-per-epoch", dest="strings_per_epoch", type=int)
    p.add_argument(
        "--batch-size",
        dest="batch_size",
        type=int,
        help="words per Adam step (default: strings-per-epoch; 1 = the papers' loop)",
    )
    p.add_argument("--train-length", dest="train_length", help="|w| or LO:HI (uniform per word)")
    p.add_argument("--test-length", dest="test_length", help="|w| or LO:HI")
    p.add_argument("--test-strings", dest="test_strings", type=int)
    p.add_argument("--eval-every", dest="eval_every", type=int, help="epochs between evaluations (0 = last only)")
    p.add_argument("--lr", type=float)
    p.add_argument("--lr-schedule", dest="lr_schedule", choices=("constant", "linear"))
    p.add_argument("--dtype", choices=("float32", "float64"))
    p.add_argument("--d-model", dest="d_model", type=int)
    p.add_argument("--d-mlp", dest="d_mlp", type=int)
    p.add_argument("--ln-eps", dest="ln_eps", type=float)
    p.add_argument("--layer-norm", dest="layer_norm", choices=("full", "scale_only", "none"))
    p.add_argument("--positions", choices=("paper", "first"), help="ONE: the exact solution's i/n or FIRST's I[i=1]")
    p.add_argument("--num-classes", dest="num_classes", type=int, help="majority: number of classes")
    p.add_argument("--threads", type=int, help="torch threads (default: as set)")
    p.set_defaults(func=cmd_train)
    return p

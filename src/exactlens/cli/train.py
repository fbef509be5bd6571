"""`exactlens train NAME --out DIR [options] [--json]`: train a model with a preset, or of any
construction's task in that construction's shape.

Writes DIR/config.json + DIR/weights.pt (load with ExactTransformer.load(DIR); the config records
the task), DIR/history.jsonl (one record per epoch) and DIR/run.json (preset, seed, options,
timing, final metrics). Options not given keep the preset's value (the paper's setting); a
preset's own options without a flag here go through --option KEY=VALUE. With --json, stdout
carries exactly one JSON object (run.json's content); progress goes to stderr.

--seeds 0:9 (or 0,3,7) trains one run per seed together (exactlens.train.train_many;
each run equals its single --seed run) into DIR/seed{s}/; --json then prints one object
{"runs": [run.json of each seed]}.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from exactlens.cli.common import add_device_argument, emit, parse_params, progress
from exactlens.cli.registry import Verb, register_verb
from exactlens.errors import ExactLensError
from exactlens.jsonio import dumps

__all__ = ["parse_length", "parse_seeds", "run"]


def parse_length(text: str) -> int | tuple[int, int]:
    """'100' -> 100; '1:100' -> (1, 100) (inclusive range, drawn uniformly per word)."""
    try:
        if ":" in text:
            lo, hi = text.split(":")
            return int(lo), int(hi)
        return int(text)
    except ValueError:
        raise ExactLensError(f"a length is an integer |w| or an inclusive range LO:HI, got {text!r}") from None


def parse_seeds(text: str) -> list[int] | range:
    """'0:9' -> [0, ..., 9] (inclusive); '0,3,7' -> [0, 3, 7]."""
    try:
        if ":" in text:
            lo, hi = (int(v) for v in text.split(":"))
            seeds = range(lo, hi + 1)  # reliability (issue 31): counted (train_many) before it becomes a list
        else:
            seeds = [int(v) for v in text.split(",")]
    except ValueError:
        raise ExactLensError(f"--seeds takes LO:HI (inclusive) or a comma list of integers, got {text!r}") from None
    if not seeds or (seeds[0] if isinstance(seeds, range) else min(seeds)) < 0:
        raise ExactLensError(f"--seeds must name at least one seed, all >= 0, got {text!r}")
    return seeds


def run(args: argparse.Namespace) -> None:
    from exactlens.train import get_preset, train, train_many

    get_preset(args.task)  # an unknown preset fails before any work
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
        "optimizer",
        "warmup_steps",
        "grad_clip",
    )
    options: dict[str, Any] = parse_params(args.option, "--option")
    options.update({n: getattr(args, n) for n in names if getattr(args, n) is not None})
    for name in ("train_length", "test_length"):
        if getattr(args, name) is not None:
            options[name] = parse_length(getattr(args, name))
    if args.scaled:
        options["scaled"] = True

    if args.seeds is not None:
        runs = train_many(args.task, parse_seeds(args.seeds), out=args.out, progress=progress,
                          overwrite=args.overwrite, device=args.device, **options)
        if args.json:
            sys.stdout.write(dumps({"runs": [r.info for r in runs]}) + "\n")
            return
        for r in runs:
            sys.stdout.write(f"{args.task} seed {r.seed}: {_final_text(r.final)}; checkpoint {r.checkpoint}\n")
        sys.stdout.write(f"{len(runs)} runs trained together in {runs[0].wall_s:.1f} s\n")
        return
    result = train(args.task, out=args.out, seed=args.seed, progress=progress, overwrite=args.overwrite,
                   device=args.device, **options)
    emit(result.info, args.json, f"{args.task} seed {args.seed}: {result.info['steps']} steps in "
         f"{result.wall_s:.1f} s; {_final_text(result.final)}; checkpoint {args.out}")


def _final_text(final: dict[str, Any]) -> str:
    if final.get("test_mse") is not None:
        return f"final test MSE {final['test_mse']:.4g}"
    return (f"final test accuracy {final['test_accuracy']:.4f}, test cross-entropy "
            f"{final['test_loss_bits']:.4f} bits/string")


def arguments(p: argparse.ArgumentParser) -> None:
    from exactlens.train.registry import preset_names

    p.add_argument("task", metavar="NAME", help="a paper preset (" + ", ".join(preset_names()) + ") or any "
                   "construction name: its task, trained in the construction's shape (exactlens list)")
    p.add_argument("--out", required=True, help="checkpoint directory (appears when training is complete)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing --out directory")
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
    p.add_argument("--lr-schedule", dest="lr_schedule", choices=("constant", "linear", "warmup_linear"))
    p.add_argument("--warmup-steps", dest="warmup_steps", type=int)
    p.add_argument("--grad-clip", dest="grad_clip", type=float)
    p.add_argument("--optimizer", choices=("adam", "lbfgs"))
    p.add_argument("--dtype", choices=("float32", "float64"))
    p.add_argument("--d-model", dest="d_model", type=int)
    p.add_argument("--d-mlp", dest="d_mlp", type=int)
    p.add_argument("--ln-eps", dest="ln_eps", type=float)
    p.add_argument("--layer-norm", dest="layer_norm", choices=("full", "scale_only", "none"))
    p.add_argument("--positions", choices=("paper", "first"), help="ONE: the exact solution's i/n or FIRST's I[i=1]")
    p.add_argument("--num-classes", dest="num_classes", type=int, help="majority: number of classes")
    p.add_argument("--threads", type=int, help="torch threads (default: as set)")
    add_device_argument(p, "words and initial weights are drawn on the CPU whatever the device (run.json: device)")
    p.add_argument("--option", action="append", metavar="KEY=VALUE",
                   help="any option of the preset (repeatable; values parsed as JSON where possible)")


register_verb(Verb("train", "train a comparable model: a paper preset or any construction's shape", arguments, run,
                   description=__doc__.split("\n\n")[1], order=40))

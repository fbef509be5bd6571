"""Brody et al. (2023) Tables 1-2 in spirit: unselectable keys in a d = 8 character LM, with and without LN scaling.

Trains the 4-layer, d_model = 8 pre-LN causal character LM of
:mod:`exactlens.papers.brody.lm` on the docstrings of Python's standard library once per
variant (full LN, LN without its scaling, and with --with-none also no LN), then counts on held-out
windows the fraction of unselectable keys per layer (before LN, after LN = the attention input) and
per head, and prints them next to the paper's Tables 1 and 2, then each cell's mean +- std over the
seeds (default 3). It is a measurement, not a timing; the per-step and total wall times are printed.
With --out the result (settings, command, date, loss curves, per-window counts, the per-cell
statistics; not the per-key certificates) is written as JSON, the file the report reads
(src/exactlens/papers/brody/results/tables.json).

Usage: PYTHONPATH=src python benchmarks/brody_tables.py [--quick] [--with-none] [--seeds 0 1 2]
       [--n-ctx 1024] [--steps 1000] [--batch 4] [--sequences 4] [--out FILE] [--overwrite]
Default settings (DEFAULT_SETTINGS): windows of n_ctx = 1024 characters (the paper's 1024 keys per
sequence), batch 4, 1000 steps of Adam lr 1e-2 with 50 warm-up steps then linear decay, float32 training; keys
counted in float64 on 4 validation windows of 1024 characters, tol 1e-9.
"""

from __future__ import annotations

import argparse
import datetime
import os
import shlex
import sys
import time
from dataclasses import replace

import torch

from exactlens.jsonio import dumps
from exactlens.outputs import check_output, write_text
from exactlens.papers.brody.lm import LMSettings, brody_tables, quick_settings, table_cells

DEFAULT_SETTINGS = LMSettings(n_ctx=1024, steps=1000, batch_size=4, lr=1e-2, warmup_steps=50, eval_every=100,
                              eval_windows=4)
"""The measured run of docs/brody.md: the paper's 1024 keys per sequence, 1000 steps (5-7 min) per model."""
DEFAULT_SEQUENCES = 4


def _row(name: str, values: list[float | None]) -> str:
    cells = " ".join("     -" if v is None else f"{v:6.1f}" for v in values)
    return f"  {name:<34s}{cells}"


def format_tables(result: dict) -> str:
    n_layers = result["settings"]["n_layers"]
    head = f"  {'':<34s}" + " ".join(f"{'L' + str(i + 1):>6s}" for i in range(n_layers))
    lines = [
        f"corpus: {result['corpus']['characters']} characters of stdlib docstrings "
        f"(Python {result['corpus']['python_version']}, sha256 {result['corpus']['sha256'][:12]}), "
        f"{result['sequences']} validation windows of {result['positions']} positions, "
        f"tol {result['tolerance']:g}",
        "percent of unselectable keys per layer (mean over windows)",
        head,
    ]
    paper1, paper2 = result["paper"]["table1"], result["paper"]["table2"]
    for run in result["runs"]:
        p, last = run["percent"], run["history"][-1]
        tag = f"{run['variant']} (seed {run['seed']}, val {last['val_bits_per_char']:.2f} bits/char)"
        lines.append(f" {tag}")
        lines.append(_row("before LN (hook_resid_pre)", p["before_ln"]))
        lines.append(_row("after LN (attention input)", p["after_ln"]))
        for h in range(len(p["per_head"][0])):
            lines.append(_row(f"head {h} keys (query space)", [layer[h] for layer in p["per_head"]]))
    lines += [
        " paper (Wikipedia GPT-2-style LM, d = 8, 50K steps, SQuAD sequences):",
        _row("Table 1, w/o scaling (attn input)", paper1["no_scale_attention_input"]),
        _row("Table 1, w/ scaling", paper1["full_attention_input"]),
        _row("Table 2, before LN", paper2["before_ln"]),
        _row("Table 2, after LN", paper2["after_ln"]),
    ]
    return "\n".join(lines)


def format_cells(result: dict) -> str:
    """Mean +- std (over seeds) per layer of each variant's before-LN and attention-input fractions."""
    cells = result["cells"]
    n_layers = result["settings"]["n_layers"]
    lines = [f"percent unselectable, mean +- std over seeds (each: mean over {result['sequences']} windows of "
             f"{result['positions']} keys)",
             "| model | vectors | " + " | ".join(f"L{i + 1}" for i in range(n_layers)) + " | val bits/char |",
             "|---|---|" + "---|" * (n_layers + 1)]
    for variant, entry in cells.items():
        bits = entry["val_bits_per_char"]
        for measure, label in (("before_ln", "before LN"), ("after_ln", "after LN = attention input")):
            if entry[measure][0] is None:
                continue
            row = " | ".join(f"{c['mean']:.1f} +- {c['std']:.1f}" for c in entry[measure])
            lines.append(f"| {variant} ({len(entry['seeds'])} seeds) | {label} | {row} | "
                         f"{bits['mean']:.2f} +- {bits['std']:.2f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny settings for a smoke run (seconds)")
    parser.add_argument("--with-none", action="store_true", help="also train a model without any LN")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--n-ctx", type=int, default=None, help="window = keys per measured sequence")
    parser.add_argument("--steps", type=int, default=None, help="Adam steps per model")
    parser.add_argument("--batch", type=int, default=None, help="windows per step")
    parser.add_argument("--lr", type=float, default=None)
    parser.add_argument("--warmup", type=int, default=None, help="steps of linear warm-up")
    parser.add_argument("--eval-every", type=int, default=None)
    parser.add_argument("--eval-windows", type=int, default=None)
    parser.add_argument("--sequences", type=int, default=None, help="validation windows whose keys are counted")
    parser.add_argument("--out", default=None, help="write the result (without per-key certificates) as JSON")
    parser.add_argument("--overwrite", action="store_true")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    if args.out:
        check_output(args.out, overwrite=args.overwrite, kind="file", what="benchmark output")
    settings = quick_settings() if args.quick else DEFAULT_SETTINGS
    changes = {name: getattr(args, arg) for name, arg in (
        ("n_ctx", "n_ctx"), ("steps", "steps"), ("batch_size", "batch"), ("lr", "lr"), ("warmup_steps", "warmup"),
        ("eval_every", "eval_every"), ("eval_windows", "eval_windows")) if getattr(args, arg) is not None}
    settings = replace(settings, **changes)
    sequences = args.sequences if args.sequences is not None else (4 if args.quick else DEFAULT_SEQUENCES)
    variants = ("full", "no_scale", "none") if args.with_none else ("full", "no_scale")
    given = argv if argv is not None else sys.argv[1:]
    command = "PYTHONPATH=src python benchmarks/brody_tables.py " + shlex.join(given)
    print(f"{command}\nsettings {settings}; load average {os.getloadavg()}", file=sys.stderr, flush=True)
    start = time.perf_counter()

    def progress(variant: str, seed: int, record: dict) -> None:
        print(
            f"{variant} seed {seed}: step {record['step']} train {record['train_bits_per_char']:.3f} "
            f"val {record['val_bits_per_char']:.3f} bits/char ({record['seconds']:.0f} s, "
            f"{record['seconds'] / record['step']:.2f} s/step)",
            file=sys.stderr, flush=True,
        )

    result = brody_tables(variants, seeds=args.seeds, settings=settings, sequences=sequences, progress=progress)
    wall = time.perf_counter() - start
    result["cells"] = table_cells(result)
    print(format_tables(result))
    print(format_cells(result))
    print(f"wall time {wall:.0f} s (train / hull seconds per run: "
          + ", ".join(f"{r['variant']}/{r['seed']} {r['train_seconds']:.0f}/{r['hull_seconds']:.0f}"
                      for r in result["runs"]) + ")")
    if args.out:
        slim = {k: v for k, v in result.items() if k != "runs"}
        slim["runs"] = [{k: v for k, v in run.items() if k != "hull"} for run in result["runs"]]
        slim.update(command=command, date=datetime.date.today().isoformat(), wall_s=wall, torch=torch.__version__,
                    threads=1)
        write_text(args.out, dumps(slim) + "\n", overwrite=args.overwrite)
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Brody et al. (2023) Tables 1-2 in spirit: unselectable keys in a d = 8 character LM, with and without LN scaling.

Trains the 4-layer, d_model = 8 pre-LN causal character LM of
:mod:`exactlens.papers.brody.lm` on the docstrings of Python's standard library once per
variant (full LN, LN without its scaling, and with --with-none also no LN), then counts on held-out
windows the fraction of unselectable keys per layer (before LN, after LN = the attention input) and
per head, and prints them next to the paper's Tables 1 and 2. It is a measurement, not a timing; the
run's wall time is printed. With --out the whole result (loss curves, per-sequence counts) is
written as JSON.

Usage: PYTHONPATH=src python benchmarks/brody_tables.py [--quick] [--with-none] [--seeds 0 1] [--out FILE]
Default settings: n_ctx 128, batch 16, 800 Adam steps (lr 1e-2), float32 training, keys measured in
float64 on 16 validation windows of 128 characters, tol 1e-9 (about 2-3 minutes per model on one
busy core).
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch

from exactlens.papers.brody.lm import LMSettings, brody_tables, quick_settings


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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny settings for a smoke run (seconds)")
    parser.add_argument("--with-none", action="store_true", help="also train a model without any LN")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--steps", type=int, default=None, help="override the number of training steps")
    parser.add_argument("--out", default=None, help="write the full result as JSON to this file")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    settings = quick_settings() if args.quick else LMSettings()
    if args.steps is not None:
        settings = LMSettings(**{**settings.__dict__, "steps": args.steps})
    variants = ("full", "no_scale", "none") if args.with_none else ("full", "no_scale")
    start = time.perf_counter()

    def progress(variant: str, seed: int, record: dict) -> None:
        print(
            f"{variant} seed {seed}: step {record['step']} train {record['train_bits_per_char']:.3f} "
            f"val {record['val_bits_per_char']:.3f} bits/char ({record['seconds']:.0f} s)",
            file=sys.stderr,
        )

    result = brody_tables(
        variants, seeds=args.seeds, settings=settings, sequences=4 if args.quick else 16, progress=progress
    )
    print(format_tables(result))
    print(f"wall time {time.perf_counter() - start:.0f} s")
    if args.out:
        with open(args.out, "w", encoding="utf-8") as fh:
            json.dump(result, fh)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Precision frontiers of Nowak et al.'s PALINDROME and spot checks of palindrome-robust (measured once).

    PYTHONPATH=src python benchmarks/nowak_precision.py [--strings 64] [--robust-strings 16]

The faithful construction: exactlens.analysis.verify.precision to |w| = 200 (every length
<= 32, a 16-per-decade grid above, bisection + scan of the first failing gap; sampled
palindromes / one-flip negatives plus the language's hardest words).
palindrome-robust: precision() over the full grid is too slow at n ~ 10^4 (n x n attention),
so it is checked on sampled words plus every 4th hard word at the listed lengths: around
its float32 limit (n^2 = 2^24, |w| = 4094) and at |w| = 10000 in float64 (about 3 GB of
memory). One line per run on stderr, a JSON summary on stdout.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch

from exactlens import tasks
from exactlens.analysis.verify import evaluate_words, precision
from exactlens.constructions import build


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--faithful-max", type=int, default=200)
    parser.add_argument(
        "--robust-float32-lengths",
        type=int,
        nargs="+",
        default=[1000, 2000, 4000, 4090, 4094, 4095, 4096, 4100, 4200, 5000],
    )
    parser.add_argument("--robust-float64-lengths", type=int, nargs="+", default=[1000, 5000, 10000])
    parser.add_argument("--robust-strings", type=int, default=16)
    parser.add_argument("--strings", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    summary = []
    for dtype in ("float32", "float64"):
        start = time.perf_counter()
        result = precision("palindrome", dtype=dtype, max_length=args.faithful_max, strings=args.strings)
        row = {
            "name": "palindrome",
            "dtype": dtype,
            "max_exact_length": result["max_exact_length"],
            "first_failure_length": result["first_failure_length"],
            "lengths_checked": len(result["checked"]),
            "strings_checked": sum(r["strings"] for r in result["checked"]),
            "seconds": round(time.perf_counter() - start, 1),
        }
        print(
            f"palindrome {dtype}: exact up to |w| = {row['max_exact_length']}, first failure "
            f"{row['first_failure_length']} ({row['seconds']} s)",
            file=sys.stderr,
            flush=True,
        )
        summary.append(row)
    spots = [("float32", length) for length in args.robust_float32_lengths] + [
        ("float64", length) for length in args.robust_float64_lengths
    ]
    models = {}
    lang = tasks.get("palindrome")
    for dtype, length in spots:
        start = time.perf_counter()
        model = models.setdefault(dtype, build("palindrome-robust", dtype=dtype))
        gen = torch.Generator().manual_seed(length)
        ids = torch.cat([lang.sample(length, args.robust_strings, gen), lang.hard_words(length)[::4]])
        row = {"name": "palindrome-robust", "dtype": dtype, "length": length}
        row.update(evaluate_words(tasks.reader(model), model, ids))
        row["margin_1_over_2n"] = 0.5 / (length + 2)
        row["seconds"] = round(time.perf_counter() - start, 1)
        print(
            f"palindrome-robust {dtype} |w| = {length}: {row['errors']} errors in {row['strings']} words, "
            f"min |logit| {row['min_abs_logit']:.3g} ({row['seconds']} s)",
            file=sys.stderr,
            flush=True,
        )
        summary.append(row)
    print(json.dumps({"precision": summary}, indent=2))


if __name__ == "__main__":
    main()

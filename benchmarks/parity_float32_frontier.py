"""Where PARITY stops being exact in float32: the hardest words (1^k 0^(L-k), k spread
over 0..L) at long lengths, with the value that breaks it read off the hooks.

    python benchmarks/parity_float32_frontier.py            # |w| = 8000, 8500 (~5 min)
    python benchmarks/parity_float32_frontier.py --lengths 4000,10000 --names parity,parity-ln
"""

from __future__ import annotations

import argparse
import time

import torch

from exactlens import tasks
from exactlens.analysis.verify import evaluate_words
from exactlens.constructions import get


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", default="8000,8500")
    parser.add_argument("--names", default="parity")
    parser.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"{'construction':14s} {'dtype':8s} {'|w|':>6s} {'errors':>7s} {'words':>6s} {'min |s|':>10s} "
          f"{'closed form |s|':>15s} {'time':>6s}")
    for name in args.names.split(","):
        construction = get(name)
        model = construction.make(dtype=args.dtype)
        for length in (int(x) for x in args.lengths.split(",")):
            start = time.perf_counter()
            row = evaluate_words(tasks.reader(model), model, construction.task_of().hard_words(length))
            n = length + 1
            closed = 2 * torch.tanh(torch.tensor(1.0)).item() / n**2  # §3.2, even n; Appendix A is close for odd n
            print(f"{name:14s} {args.dtype:8s} {length:6d} {row['errors']:7d} {row['strings']:6d} "
                  f"{row['min_abs_logit']:10.3e} {closed:15.3e} {time.perf_counter() - start:5.0f}s", flush=True)


if __name__ == "__main__":
    main()

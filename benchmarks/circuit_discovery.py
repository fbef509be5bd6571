"""Circuit discovery over the catalogue: activation patching, EAP and ACDC-style pruning on every
construction, at head and qkv granularity, scored against each construction's ground-truth circuit
(edge and node AUROC, precision and recall at the method's own threshold, seconds).

Usage: PYTHONPATH=src python benchmarks/circuit_discovery.py [--quick] [--names N ...] [--words 32]
       [--span 4] [--out results.json [--overwrite]]
       (--quick: three small constructions, 16 words, 3 lengths)
"""

from __future__ import annotations

import argparse
import os
import time

import torch

from exactlens.analysis.circuit.evaluate import catalogue
from exactlens.constructions.registry import names as construction_names
from exactlens.jsonio import dumps
from exactlens.outputs import check_output, write_text

QUICK = ("first", "parity", "one")


def _f(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="three small constructions, 16 words, 3 lengths")
    parser.add_argument("--names", nargs="+", default=None, help="constructions (default: every registered one)")
    parser.add_argument("--words", type=int, default=32, help="words per length (all when fewer; default 32)")
    parser.add_argument("--span", type=int, default=4, help="lengths: the shortest and the next span-1 (default 4)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", default=None, help="write the rows as JSON here")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing --out file")
    args = parser.parse_args()
    names = args.names or (list(QUICK) if args.quick else construction_names())
    if args.quick:
        args.words, args.span = 16, 3
    if args.out:
        check_output(args.out, overwrite=args.overwrite, kind="file")
    torch.set_num_threads(args.threads)
    print(f"load average {os.getloadavg()[0]:.2f}; torch threads {args.threads}", flush=True)
    start = time.perf_counter()
    rows = catalogue(names, words=args.words, span=args.span)
    print("| construction | granularity | method | circuit edges (constant) / all | edge AUROC | node AUROC | "
          "precision | recall | s |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['construction']} | {r['granularity']} | {r['method']} | {r['n_positive']} ({r['n_constant']}) / "
              f"{r['n_edges'] + r['n_constant']} | {_f(r['edge_auroc'])} | {_f(r['node_auroc'])} | "
              f"{_f(r['precision'])} | {_f(r['recall'])} | {r['seconds']:.1f} |")
    print(f"total {time.perf_counter() - start:.0f} s")
    if args.out:
        write_text(args.out, dumps({"rows": rows, "words": args.words, "span": args.span}, indent=1) + "\n",
                   overwrite=args.overwrite)


if __name__ == "__main__":
    main()

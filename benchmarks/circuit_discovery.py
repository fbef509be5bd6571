"""Circuit discovery over the catalogue: activation patching, EAP, EAP-IG (inputs, activations),
exact edge patching and ACDC-style pruning on every construction, at head and qkv granularity, scored
against each construction's ground-truth circuit (edge and node AUROC, precision and recall at the
method's own threshold, the F1-best cut of its scores found with the truth, MIB's CPR and CMD beside
the exact circuit's, seconds).

Usage: PYTHONPATH=src python benchmarks/circuit_discovery.py [--quick] [--names N ...] [--words 32]
       [--span 4] [--methods patching eap acdc ...] [--ablation resample|mean|cross-length|zero]
       [--granularities head qkv position]
       [--out results.json [--overwrite]]
       (--quick: three small constructions, 16 words, 3 lengths)
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

from exactlens.analysis.circuit.ablation import ABLATIONS
from exactlens.analysis.circuit.discovery import METHODS
from exactlens.analysis.circuit.evaluate import catalogue
from exactlens.analysis.circuit.graph import EDGE_GRANULARITIES, GRANULARITIES
from exactlens.analysis.circuit.scoring import best_cut_text
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
    parser.add_argument("--methods", nargs="+", choices=METHODS, default=list(METHODS))
    parser.add_argument("--granularities", nargs="+", choices=EDGE_GRANULARITIES, default=list(GRANULARITIES),
                        help="edge granularities (position: one edge per token position, words of the longest "
                             "length only; default head qkv)")
    parser.add_argument("--ablation", choices=ABLATIONS, default="resample",
                        help="what an ablated edge reads (cross-length: a word of another length; default resample)")
    parser.add_argument("--metrics", default="auroc,cpr,cmd", help="auroc,cpr,cmd (cpr/cmd: faithfulness curves)")
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
    rows = catalogue(names, words=args.words, span=args.span, methods=args.methods, ablation=args.ablation,
                     metrics=args.metrics, granularities=args.granularities)
    print("| construction | granularity | method | circuit edges (constant) / all | edge AUROC | node AUROC | "
          "precision | recall | best cut: F1 (P / R) | CPR / CMD | exact CPR / CMD | s (method + curve) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['construction']} | {r['granularity']} | {r['method']} | {r['n_positive']} ({r['n_constant']}) / "
              f"{r['n_edges'] + r['n_constant']} | {_f(r['edge_auroc'])} | {_f(r['node_auroc'])} | "
              f"{_f(r['precision'])} | {_f(r['recall'])} | {best_cut_text(r['best_cut'])} | "
              f"{_f(r.get('cpr'))} / {_f(r.get('cmd'))} | {_f(r.get('exact_cpr'))} / {_f(r.get('exact_cmd'))} | "
              f"{r['seconds']:.1f} + {r.get('faithfulness_seconds', 0.0):.1f} |")
    print(f"total {time.perf_counter() - start:.0f} s\n")
    print_summary(rows)
    if args.out:
        write_text(args.out, dumps({"rows": rows, "words": args.words, "span": args.span, "ablation": args.ablation},
                                   indent=1) + "\n",
                   overwrite=args.overwrite)


def _exact(precision: float | None, recall: float | None) -> bool:
    return precision == 1.0 and recall == 1.0


def print_summary(rows: list[dict]) -> None:
    """Per group (hand-built constructions, compiled RASP programs), granularity and method: median
    (min) edge AUROC, mean precision and recall at the method's cut, exact recoveries at its cut and
    at the best cut (those at a best cut of 0 apart), and the methods' time."""
    print("| programs | granularity | method | median edge AUROC (min) | mean precision | mean recall | "
          "exact recoveries | exact at the best cut (at 0) | median CPR / CMD (exact circuit's) | time, all |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    keys = dict.fromkeys(("tracr" if r["construction"].startswith("tracr-") else "hand-built", r["granularity"],
                          r["method"]) for r in rows)
    for group, granularity, method in keys:
        rs = [r for r in rows if r["granularity"] == granularity and r["method"] == method
              and r["construction"].startswith("tracr-") == (group == "tracr")]
        aurocs = [r["edge_auroc"] for r in rs if r["edge_auroc"] is not None]
        best = [r["best_cut"] for r in rs if r["best_cut"] and r["best_cut"]["f1"] == 1.0]
        at_zero = sum(b["numerically_zero"] for b in best)

        def mean(key: str, rs: list[dict] = rs) -> float:
            return statistics.mean([r[key] for r in rs if r[key] is not None] or [float("nan")])

        median = f"{_f(statistics.median(aurocs))} ({_f(min(aurocs))})" if aurocs else "-"

        def med(key: str, rs: list[dict] = rs) -> str:
            values = [r[key] for r in rs if r.get(key) is not None]
            return _f(statistics.median(values)) if values else "-"

        print(f"| {group} | {granularity} | {method} | {median} | "
              f"{_f(mean('precision'))} | {_f(mean('recall'))} | "
              f"{sum(_exact(r['precision'], r['recall']) for r in rs)} / {len(rs)} | {len(best)} ({at_zero}) | "
              f"{med('cpr')} / {med('cmd')} ({med('exact_cpr')} / {med('exact_cmd')}) | "
              f"{sum(r['seconds'] + r.get('faithfulness_seconds', 0.0) for r in rs):.0f} s |")


if __name__ == "__main__":
    main()

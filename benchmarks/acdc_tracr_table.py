"""The ACDC paper's tracr table reproduced (Conmy et al. 2023): ACDC's edge and node AUCs on tracr's
``reverse`` and ``proportion`` (frac_prevs) programs, with zero and with resample ("random")
ablation, beside the paper's numbers.

The programs are compiled with the settings of the ACDC code's tracr task: ``reverse`` is
``Aggregate(Select(indices, length - indices - 1, EQ), tokens)`` with ``length`` the SelectorWidth of
an all-true selector, vocabulary {1, 2, 3}, max_seq_len 5, compiler BOS "BOS"; ``proportion`` is
tracr's ``make_frac_prevs(tokens == "x")``, vocabulary {w, x, y, z}, max_seq_len 5. Words: the
paper's (``reverse``: the 6 permutations of 1 2 3; ``proportion``: words of length 4) and, as a
second run, every word of lengths 1-5 (up to --words per length). Edges at qkv granularity (the
paper's q/k/v inputs). AUCs two ways: the paper's (ACDC run at every threshold of a sweep, one ROC
point per run, trapezoids; exactlens.analysis.circuit.sweep) and exactlens's (one run at its default
threshold, its edges ranked by the divergence each removal caused).

Usage: PYTHONPATH=src python benchmarks/acdc_tracr_table.py [--quick | --paper-words] [--out results.json [--overwrite]]
"""

from __future__ import annotations

import argparse
import itertools
import time

import torch

from exactlens.analysis.circuit.ablation import make_batch, mark_constant
from exactlens.analysis.circuit.discovery import discover
from exactlens.analysis.circuit.evaluate import word_batches
from exactlens.analysis.circuit.graph import model_graph
from exactlens.analysis.circuit.scoring import score_discovery
from exactlens.analysis.circuit.sweep import runs_at, sweep_points
from exactlens.analysis.circuit.truth import derive_circuit
from exactlens.jsonio import dumps
from exactlens.outputs import check_output, write_text

# The ACDC paper's Table (ACDC rows, edge AUC / node AUC), as the issue quotes them.
PAPER = {("reverse", "zero"): (1.00, 1.00), ("proportion", "zero"): (1.00, 1.00),
         ("reverse", "resample"): (0.20, 0.31), ("proportion", "resample"): (0.60, 0.73)}
THRESHOLDS = (0.0, 1e-6, 3e-6, 1e-5, 3e-5, 1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 0.1, 0.3, 1.0, 3.0, 10.0)
QUICK_THRESHOLDS = (0.0, 1e-4, 1e-2, 1.0)


def _lib():
    from tracr.compiler import lib
    from tracr.rasp import rasp

    return lib, rasp


def make_acdc_reverse():
    """The ACDC code's reverse program (the same RASP as tracr's lib.make_reverse, written in one line)."""
    _, rasp = _lib()
    length = rasp.SelectorWidth(rasp.Select(rasp.tokens, rasp.tokens, rasp.Comparison.TRUE))
    opp_index = length - rasp.indices - 1
    return rasp.Aggregate(rasp.Select(rasp.indices, opp_index, rasp.Comparison.EQ), rasp.tokens)


def make_acdc_proportion():
    lib, rasp = _lib()
    return lib.make_frac_prevs(rasp.tokens == "x")


def register() -> dict[str, str]:
    """Register both programs (once per process) and return task -> construction name."""
    from exactlens.interop.tracr.library import register_program
    from exactlens.interop.tracr.programs import PROGRAMS

    if "acdc-reverse" not in PROGRAMS:
        register_program("acdc-reverse", make_acdc_reverse, (1, 2, 3), 5, compiler_bos="BOS",
                         summary="the ACDC paper's reverse (vocab 1 2 3, max_seq_len 5)")
    if "acdc-proportion" not in PROGRAMS:
        register_program("acdc-proportion", make_acdc_proportion, ("w", "x", "y", "z"), 5, compiler_bos="BOS",
                         summary="the ACDC paper's proportion: make_frac_prevs(tokens == 'x') (vocab w x y z)")
    return {"reverse": "tracr-acdc-reverse", "proportion": "tracr-acdc-proportion"}


def paper_words(task: str, seed: int = 0) -> torch.Tensor:
    """The ACDC code's data as symbol ids: reverse, the 6 permutations of the 3 tokens; proportion,
    50 distinct length-4 words drawn at random (the code draws num_examples of the 256)."""
    if task == "reverse":
        return torch.tensor(list(itertools.permutations(range(3))), dtype=torch.long)
    every = torch.tensor(list(itertools.product(range(4), repeat=4)), dtype=torch.long)
    return every[torch.randperm(len(every), generator=torch.Generator().manual_seed(seed))[:50]]


def run_one(name: str, task: str, ablation: str, data: str, words: int, thresholds) -> dict:
    from exactlens.constructions.registry import build

    model = build(name, dtype="float64")
    graph = model_graph(model, "qkv")
    if data == "paper":
        batches = [make_batch(model, graph, paper_words(task), ablation)]
    else:
        batches = word_batches(model, graph, [1, 2, 3, 4, 5], words, ablation=ablation)
    circuit = mark_constant(derive_circuit(model, "qkv"), batches, model)
    start = time.perf_counter()
    single = score_discovery(discover(model, graph, batches, "acdc"), circuit)
    runs = runs_at(model, graph, batches, thresholds)
    sweep = sweep_points(runs, graph, circuit)
    # the paper's convention: every circuit edge positive, movable by the ablation or not (the same runs)
    counted = sweep_points(runs, graph, circuit, count_constant=True)
    paper = PAPER[(task, ablation)] if ablation in ("zero", "resample") else (None, None)
    return {"task": task, "construction": name, "ablation": ablation, "data": data,
            "n_edges": len(graph.edges), "circuit_edges": len(circuit.edges), "observable": single.n_positive,
            "circuit": sorted(c.edge.name for c in circuit.edges),
            "constant": sorted(c.edge.name for c in circuit.edges if c.constant),
            "sweep_edge_auc": sweep.edge_auc, "sweep_node_auc": sweep.node_auc,
            "single_edge_auroc": single.edge_auroc, "single_node_auroc": single.node_auroc,
            "single_precision": single.precision, "single_recall": single.recall,
            "constant_counted_edge_auc": counted.edge_auc, "constant_counted_node_auc": counted.node_auc,
            "stair_edge_auc": sweep.edge_auc_stair, "stair_node_auc": sweep.node_auc_stair,
            "stair_counted_edge_auc": counted.edge_auc_stair, "stair_counted_node_auc": counted.node_auc_stair,
            "paper_edge_auc": paper[0], "paper_node_auc": paper[1],
            "seconds": round(time.perf_counter() - start, 2), "sweep": sweep.to_dict(),
            "missed_at": {str(r.threshold): sorted(e.name for e in circuit.edge_set - r.selected) for r in runs}}


def _f(x) -> str:
    return "-" if x is None else f"{x:.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="4 thresholds, the paper's words only")
    parser.add_argument("--paper-words", action="store_true", help="every threshold, the paper's words only")
    parser.add_argument("--words", type=int, default=64, help="words per length of the all-words run (default 64)")
    parser.add_argument("--out", default=None)
    parser.add_argument("--overwrite", action="store_true")
    args = parser.parse_args()
    if args.out:
        check_output(args.out, overwrite=args.overwrite, kind="file")
    torch.set_num_threads(1)
    names = register()
    thresholds = QUICK_THRESHOLDS if args.quick else THRESHOLDS
    datas = ("paper",) if args.quick or args.paper_words else ("paper", "all")
    rows = []
    print("| task | ablation | words | edges (circuit, observable) | sweep edge / node AUC | same, constant edges "
          "counted | staircase (the paper's construction), constant counted | paper edge / node AUC | "
          "one-run edge / node AUROC | s |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for task, ablation, data in itertools.product(("reverse", "proportion"), ("zero", "resample", "cross-length"),
                                                  datas):
        if ablation == "cross-length" and data == "paper":
            continue  # the paper's words have one length
        r = run_one(names[task], task, ablation, data, args.words, thresholds)
        rows.append(r)
        print(f"| {task} | {ablation} | {data} | {r['n_edges']} ({r['circuit_edges']}, {r['observable']}) | "
              f"{_f(r['sweep_edge_auc'])} / {_f(r['sweep_node_auc'])} | {_f(r['constant_counted_edge_auc'])} / "
              f"{_f(r['constant_counted_node_auc'])} | {_f(r['stair_counted_edge_auc'])} / "
              f"{_f(r['stair_counted_node_auc'])} | {_f(r['paper_edge_auc'])} / "
              f"{_f(r['paper_node_auc'])} | {_f(r['single_edge_auroc'])} / {_f(r['single_node_auroc'])} | "
              f"{r['seconds']:.1f} |", flush=True)
    if args.out:
        write_text(args.out, dumps({"rows": rows, "thresholds": list(thresholds)}, indent=1) + "\n",
                   overwrite=args.overwrite)


if __name__ == "__main__":
    main()

"""`exactlens discover TARGET --method patching|eap|acdc [--against NAME] [--json]`: circuit discovery.

Runs a discovery method on the edge graph (exactlens.analysis.circuit.discovery): node-level
activation patching, edge attribution patching, or ACDC-style pruning. A construction is scored
against its own ground-truth circuit: ROC curve, AUROC over edges and nodes, and precision and
recall of the edges the method selects at its own threshold. Any model (a checkpoint) is compared
with the circuit of --against (a construction of its task, run on the same words) after mapping its
nodes onto the construction's by layer and head index: edge and node overlap, AUROC, and the overlap
between components (post-LN norm chains joined), so depth, heads and layer norms may differ
(`exactlens diff --parts attention,circuit` matches heads by their attention instead).
"""

from __future__ import annotations

import argparse
from typing import Any

from exactlens.cli.circuit import circuit_arguments
from exactlens.cli.common import emit, progress
from exactlens.cli.registry import Verb, register_verb

__all__ = ["format_discover_text", "run"]


def _f(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


def format_discover_text(result: dict[str, Any]) -> str:
    lines = [f"{result['model']}: {result['method']} at {result['granularity']} granularity, {result['ablation']} "
             f"ablation, threshold "
             f"{result['threshold']:g}, {result['seconds']:.2f} s; selected {len(result['selected'])} of "
             f"{len(result['edges'])} edges"]
    top = sorted(result["edges"], key=lambda e: -e["score"])[:12]
    lines += [f"  {e['edge']:<30}{e['score']:.4g}" + ("  *" if e["selected"] else "") for e in top]
    if "score" in result:
        s = result["score"]
        lines.append(f"against the ground truth ({s['n_positive']} circuit edges, {s['n_constant']} constant ones "
                     f"left out): edge AUROC {_f(s['edge_auroc'])}, node AUROC {_f(s['node_auroc'])}, precision "
                     f"{_f(s['precision'])}, recall {_f(s['recall'])}")
        best = s.get("best_cut")
        if best:
            lines.append(f"best cut the scores allow (oracle, read from the truth): score >= {best['cut']:.4g} selects "
                         f"{best['n_selected']}: F1 {best['f1']:.3f}, precision {best['precision']:.3f}, recall "
                         f"{best['recall']:.3f}")
    if "overlap" in result:
        o = result["overlap"]
        if not o["comparable"]:
            lines.append(f"not comparable: {o['reason']}")
        else:
            e, joined, n = o["edges"], o["edges"]["between_components"], o["nodes"]
            lines.append(f"against the circuit of {o['against']} (nodes mapped by {o['mapping']}; "
                         f"{e['constant_left_out']} constant edges left out):")
            lines.append(f"  edges: jaccard {_f(e['jaccard'])}, precision {_f(e['precision'])}, recall "
                         f"{_f(e['recall'])}, AUROC {_f(e['auroc'])}; {e['truth_with_counterpart']} of {e['truth']} "
                         f"circuit edges have a counterpart")
            lines.append(f"  between components (norm chains joined): jaccard {_f(joined['jaccard'])}, recall "
                         f"{_f(joined['recall'])}, AUROC {_f(joined['auroc'])}; {joined['truth_with_counterpart']} "
                         f"of {joined['truth']} have a counterpart")
            lines.append(f"  nodes: jaccard {_f(n['jaccard'])}, AUROC {_f(n['auroc'])}; missed "
                         f"{', '.join(n['exact_only']) or 'none'}; extra {', '.join(n['trained_only']) or 'none'}")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> None:
    from exactlens.analysis.circuit.evaluate import discover_report

    progress(f"discover: {args.method} on {args.target}")
    result = discover_report(args.target, args.method, granularity=args.granularity, against=args.against,
                             threshold=args.threshold, lengths=args.lengths, words=args.words, seed=args.seed,
                             ablation=args.ablation)
    emit(result, args.json, format_discover_text(result))


def arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("target", metavar="NAME | CHECKPOINT_DIR", help="a construction name or a checkpoint directory")
    p.add_argument("--method", required=True, choices=["patching", "eap", "acdc"], help="the discovery method")
    p.add_argument("--against", default=None, metavar="NAME",
                   help="compare with this construction's circuit (default: the target's own, for a construction)")
    p.add_argument("--threshold", type=float, default=None,
                   help="the method's cut (default: patching/acdc 1e-3 divergence, eap 1e-2 of the top score)")
    circuit_arguments(p)


register_verb(Verb("discover", "circuit discovery (patching, EAP, ACDC) scored against the ground truth",
                   arguments, run, description=__doc__.split("\n\n")[1], order=75))

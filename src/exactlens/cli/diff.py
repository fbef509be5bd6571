"""`exactlens diff CHECKPOINT_DIR --against NAME [--html FILE] [--json]`: a trained model against an
exact construction (:func:`exactlens.analysis.diff.diff`).

The trained side is a checkpoint directory (ExactTransformer.save) or a construction name (e.g.
``first-flawed`` against ``first``). With --json, stdout carries exactly one JSON object; progress
goes to stderr. Bad input raises ExactLensError, which ``exactlens.cli.main`` turns into exit 2.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from exactlens.cli.common import add_device_argument, emit, parse_params, progress
from exactlens.cli.registry import Verb, register_verb

__all__ = ["format_diff_text", "run"]


def _num(value: Any, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def format_diff_text(result: dict[str, Any]) -> str:
    """A short human-readable summary of a diff result."""
    s = result["summary"]
    lines = [f"diff against {result['exact']['name']} on lengths {result['settings']['lengths']}"]
    if "behaviour" in result:
        lines.append(
            f"  accuracy trained {_num(s['trained_accuracy'])}, exact {_num(s['exact_accuracy'])}, "
            f"agreement {_num(s['agreement'])}"
        )
    if "probes" in result:
        lines.append("  feature                  best trained site                    R^2")
        for f in result["probes"]["features"]:
            lines.append(f"  {f['label']:24s} {str(f['best_site']):36s} {_num(f['best_r2'])}")
    if "attention" in result:
        for m in result["attention"]["matching"]:
            lines.append(
                f"  head L{m['trained_layer']}H{m['trained_head']} ~ exact L{m['exact_layer']}"
                f"H{m['exact_head']}: TV distance {_num(m['distance'])}"
            )
    if "weights" in result:
        for p in result["weights"]["pairs"]:
            lines.append(
                f"  weights L{p['trained_layer']}H{p['trained_head']}: QK cosine {_num(p['qk_cosine'])}, "
                f"OV cosine {_num(p['ov_cosine'])}"
            )
    if "interventions" in result:
        for f in result["interventions"]["features"]:
            lines.append(
                f"  intervention {f['label']} at {f['trained_site']}: IIA {_num(f['iia'])}, "
                f"on changed pairs {_num(f['iia_changed'])}"
            )
    if "alignment" in result:  # issue 29: one verdict line per variable (analysis/diff/verdicts.py)
        from exactlens.analysis.diff.verdicts import verdict_lines

        lines += verdict_lines(result)
    c = result.get("circuit")
    if c is not None and not c["available"]:
        lines.append(f"  circuit: not compared ({c['reason']})")
    elif c is not None:
        e, n = c["edges"], c["nodes"]
        lines.append(f"  circuit ({c['method']}, {c['granularity']}, {c.get('ablation', 'resample')} ablation): "
                     f"edges shared {e['shared']} of exact "
                     f"{e['truth']} / found {e['found']} (Jaccard {_num(e['jaccard'])}, AUROC {_num(e['auroc'])}; "
                     f"between components Jaccard {_num(e['between_components']['jaccard'])}); "
                     f"nodes shared {n['shared']} of {n['truth']} / {n['found']}; the method on the exact model: "
                     f"edge AUROC {_num(c['method_check']['edge_auroc'])}")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> None:
    from exactlens.analysis.diff import diff
    from exactlens.analysis.verify import parse_lengths
    from exactlens.viz.diff_page import check_diff_page, write_diff_page

    lengths = parse_lengths(args.lengths) if args.lengths else None
    if args.html:  # before the work: a page that cannot be written is said now, not after minutes
        check_diff_page(args.html, args.overwrite)
    progress(f"diff: {args.target} against {args.against}")
    result = diff(
        args.target,
        args.against,
        params=parse_params(args.param),
        lengths=lengths,
        strings=args.strings,
        seed=args.seed,
        quiet=False,
        parts=_parts(args.parts),
        das_max_dim=args.das_max_dim,
        das_steps=args.das_steps,
        alignment_pairs=args.alignment_pairs,
        untrained_baseline=not args.no_untrained_baseline,
        circuit_method=args.circuit_method,
        circuit_granularity=args.circuit_granularity,
        circuit_ablation=args.circuit_ablation,
        device=args.device,
    )
    emit(result, args.json, format_diff_text(result))  # the result first: a failing page write cannot lose it
    sys.stdout.flush()
    if args.html:
        path = write_diff_page(result, args.html, trained=args.target, overwrite=args.overwrite)
        progress(f"diff: wrote {path}")


def _parts(text: str | None) -> tuple[str, ...]:
    from exactlens.analysis.diff import PARTS

    if text is None:
        return PARTS
    return tuple(part.strip() for part in text.split(",") if part.strip())


def arguments(p: argparse.ArgumentParser) -> None:
    from exactlens.analysis.diff import PARTS

    p.add_argument("target", metavar="CHECKPOINT_DIR", help="a checkpoint directory or a construction name")
    p.add_argument("--against", required=True, metavar="NAME", help="the exact construction (see `exactlens list`)")
    p.add_argument("--param", action="append", metavar="KEY=VALUE", help="parameter of the construction (repeatable)")
    p.add_argument(
        "--lengths", default=None, help="word lengths A:B[:STEP] or a,b,c (default: 1..32, those both models accept)"
    )
    p.add_argument("--strings", type=int, default=64, help="words per length (all words where there are fewer)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--parts", default=None, help=f"comma-separated parts (default: all of {','.join(PARTS)})")
    p.add_argument("--das-max-dim", type=int, default=3, help="largest subspace dimension DAS tries (default 3)")
    p.add_argument("--das-steps", type=int, default=80, help="Adam steps per DAS fit group (default 80)")
    p.add_argument("--alignment-pairs", type=int, default=64, help="DAS (base, source) pairs per length (default 64)")
    p.add_argument("--no-untrained-baseline", action="store_true",
                   help="skip the DAS baseline fitted on an untrained model of the same shape")
    p.add_argument("--circuit-method", default="eap", choices=["patching", "eap", "acdc"],
                   help="discovery method for the trained model's circuit (default eap: one pass per length)")
    p.add_argument("--circuit-granularity", default="head", choices=["head", "qkv"],
                   help="edges between whole heads or into their queries, keys and values (default head)")
    p.add_argument("--circuit-ablation", default="resample", choices=["resample", "mean", "cross-length"],
                   help="what an ablated edge reads: another word of its length, the mean, or a word of another "
                        "length (sees per-length values such as the length itself); default resample")
    p.add_argument(
        "--html",
        default=None,
        metavar="FILE",
        help="also write an HTML page (attention views next to FILE in FILE_stem_files/)",
    )
    p.add_argument("--overwrite", action="store_true", help="replace an existing --html page and its views")
    add_device_argument(p, "both models run there; words and every comparison stay on the CPU")
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout")


register_verb(Verb(
    "diff", "compare a trained model with an exact construction (behaviour, probes, attention, weights, "
    "interventions, DAS alignment, circuit overlap)", arguments, run, description=__doc__.split("\n\n")[0], order=50,
))

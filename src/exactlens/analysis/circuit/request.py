"""The requests of ``exactlens circuit`` and ``exactlens discover``, declared once (exactlens.requests):
their flags, ``el.circuit``/``el.discover``'s keywords and :func:`~.evaluate.discover_report`'s options
all come from these. Light: no torch (the command line reads them for ``--help``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from exactlens.interop.readout import ReadoutKind
from exactlens.requests import Bool, Choice, Float, Int, Lengths, Path_, Text, TextList, option

__all__ = ["ABLATIONS", "CircuitRequest", "DiscoverRequest", "EDGE_GRANULARITIES", "EdgeOptions", "METHODS"]

METHODS = ("patching", "eap", "acdc", "eap-ig-inputs", "eap-ig-activations", "edge-patching")
"""The discovery methods (exactlens.analysis.circuit.discovery.METHODS, checked equal by the tests)."""
ABLATIONS = ("resample", "mean", "cross-length", "zero")
"""What an ablated edge reads (exactlens.analysis.circuit.ablation.ABLATIONS, checked equal by the tests)."""
EDGE_GRANULARITIES = ("head", "qkv", "position")
"""The edge granularities of circuit and discover (exactlens.analysis.circuit.graph.EDGE_GRANULARITIES,
checked equal by the tests)."""


@dataclass(frozen=True)
class EdgeOptions:
    """The options `circuit` and `discover` share (the target first, then each verb's own after these)."""

    target: Any = option(positional=True, metavar="NAME | CHECKPOINT_DIR",
                         help="a construction name, a checkpoint directory (or, in Python, a model)")
    granularity: str = option("head", kind=Choice(EDGE_GRANULARITIES),
                              help="edges into whole heads, into their queries, keys and values separately (qkv), "
                                   "or those split per token position (position: words of one length); default head")
    lengths: list | None = option(None, kind=Lengths(0), nargs="+", metavar="L",
                                  help="word lengths to run (default: the task's shortest and the next five)")
    words: int = option(64, kind=Int(1), help="words per length: all of them when there are at most this many "
                        "(default 64)")
    ablation: str = option("resample", kind=Choice(ABLATIONS),
                           help="an ablated edge reads another word's activation (resample), the mean, or a word of "
                                "another length's at the aligned position (cross-length: sees values that are the "
                                "same for every word of a length, such as the length itself), or zero; default "
                                "resample")
    seed: int = option(0, kind=Int(0), help="seed of the sampled words, the resample order and the cross-length "
                       "pairing")
    task: str | None = option(None, kind=Text(), metavar="NAME",
                              help="the task of a model that records none (a TransformerLens or Hugging Face model; "
                                   "see `exactlens task NAME`)")
    readout: Any = option(None, kind=ReadoutKind(), metavar="POSITION[/OUTPUTS]",
                          help="where such a model answers and which outputs (cls, last, every or a position, "
                               "optionally /K, /A-B, /A:B; default: the task's)")


@dataclass(frozen=True)
class CircuitRequest(EdgeOptions):
    check: bool = option(True, kind=Bool(), flag="--no-check", negate=True,
                         help="skip the ablation check (circuit and constants only)")
    out: str | None = option(None, kind=Path_(), metavar="FILE.json",
                             help="also write the circuit in MIB's circuit file format (docs/circuits.md)")
    overwrite: bool = option(False, kind=Bool(), help="replace an existing --out file")


@dataclass(frozen=True)
class DiscoverRequest(EdgeOptions):
    method: str = option("acdc", kind=Choice(METHODS),
                         api_positional=True, help="the discovery method (default acdc; ignored with --score-file)")
    against: str | None = option(None, kind=Text(), metavar="NAME",
                                 help="compare with this construction's circuit (default: the target's own, for a "
                                      "construction)")
    threshold: float | None = option(None, kind=Float(0.0), help="the method's cut (default: patching/acdc/"
                                     "edge-patching 1e-3 divergence, eap and EAP-IG 1e-2 of the top score)")
    metrics: tuple = option(("auroc", "cpr", "cmd"), kind=TextList(("auroc", "cpr", "cmd")), metavar="M[,M]",
                            help="auroc (against the exact circuit), cpr and cmd (MIB's faithfulness curve of the "
                                 "method's ranking; default all three)")
    ig_steps: int = option(5, kind=Int(1, 1000), help="EAP-IG's interpolation steps (1: EAP; default 5)")
    score_file: str | None = option(None, kind=Path_(), metavar="FILE.json",
                                    help="score the circuit in this MIB circuit file instead of running a method")
    out: str | None = option(None, kind=Path_(), metavar="FILE.json",
                             help="write the method's circuit (selected edges, scores) in MIB's circuit file format")
    overwrite: bool = option(False, kind=Bool(), help="replace an existing --out file")

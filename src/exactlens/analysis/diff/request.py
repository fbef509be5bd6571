"""The diff's options, declared once (exactlens.requests): ``exactlens diff``'s flags, ``el.diff``'s and
``exactlens.analysis.diff.diff``'s keyword arguments and their checks all come from :class:`DiffRequest`.

Light at import (no torch): the command line builds its parser from it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from exactlens.analysis.circuit.request import ABLATIONS, METHODS
from exactlens.analysis.diff.parts import PARTS, part_names
from exactlens.interop.readout import ReadoutKind
from exactlens.requests import (
    Any_,
    Bool,
    Choice,
    Device,
    DType,
    Float,
    Int,
    Lengths,
    Pairs,
    Path_,
    Text,
    TextList,
    option,
)

__all__ = ["CIRCUIT_ABLATIONS", "CIRCUIT_GRANULARITIES", "CIRCUIT_METHODS", "DiffOptions", "DiffRequest", "ECHOED",
           "NOT_ECHOED"]

# The circuit package's names (analysis.circuit: METHODS, GRANULARITIES, ABLATIONS; a test keeps them equal),
# here without importing torch.
CIRCUIT_METHODS = METHODS  # the circuit package's (light: its request module)
CIRCUIT_GRANULARITIES = ("head", "qkv")
CIRCUIT_ABLATIONS = ABLATIONS
PAIR_DESIGNS = ("designed", "random")  # alignment.fit.PAIR_DESIGNS, here without torch (a test keeps them equal)


@dataclass(frozen=True)
class _Params(Pairs):
    """The construction's parameters; None (as ``params=None`` in Python) is none."""

    def check(self, name: str, value: Any) -> Any:
        return {} if value is None else super().check(name, value)


@dataclass(frozen=True)
class _ModelDevice(Device):
    """A device, or None in Python: where the trained model already is (the default of
    exactlens.analysis.diff.diff; ``el.diff`` and the command line default to auto)."""

    def check(self, name: str, value: Any) -> Any:
        return None if value is None else super().check(name, value)


@dataclass(frozen=True)
class DiffOptions:
    """The options of a comparison with an exact construction, declared once: ``exactlens diff`` has them
    (:class:`DiffRequest`) and the timeline inherits them (exactlens.analysis.timeline.request.TimelineRequest),
    so a new option is one field here. ``settings`` records those in ``ECHOED``: every field except ``NOT_ECHOED``."""

    target: Any = option(positional=True, kind=Any_(), metavar="CHECKPOINT_DIR", api_name="trained",
                         help="a checkpoint directory or a construction name (in Python also a model, or a train "
                              "result)")
    against: str = option(kind=Text(), metavar="NAME", api_positional=True,
                          help="the exact construction (see `exactlens list`)")
    readout: Any = option(None, kind=ReadoutKind(), metavar="POSITION[/OUTPUTS]",
                          help="where the trained model answers and which outputs: cls, last, every or a position, "
                               "optionally /K, /A-B (a two-logit head: /1-0) or /A:B (default: the task's, see "
                               "`exactlens task NAME`; in Python also a callable(logits, n_positions))")
    param: dict = option({}, kind=_Params(), flag="--param", api_name="params",
                         help="parameter of the construction (repeatable; in Python params={...})")
    lengths: list | None = option(None, kind=Lengths(0),
                                  help="word lengths A:B[:STEP] or a,b,c (default: 1..32, those both models accept)")
    strings: int = option(64, kind=Int(2), help="words per length (all words where there are fewer)")
    seed: int = option(0, kind=Int(0), help="seed of the words, probe splits, pairs and fits")
    # Python only (cli=False)
    exact_dtype: str = option("float64", kind=DType(), cli=False, help="dtype of the exact model (default float64)")
    test_fraction: float = option(0.3, kind=Float(0.0, 1.0, open_lo=True, open_hi=True), cli=False,
                                  help="share of the words the probes are scored on (default 0.3)")
    intervention_pairs: int = option(64, kind=Int(1), cli=False,
                                     help="interchange pairs per length of the interventions part (default 64)")
    parts: tuple = option(PARTS, kind=TextList(choices=part_names), metavar="PART,...",
                          help=f"comma-separated parts (default: all of {','.join(PARTS)}; a plug-in's part by its "
                               "name)")
    das_max_dim: int = option(3, kind=Int(1), help="DAS tries subspace dimensions 1..N (default 3) and a variable's "
                                     "own dimension where it needs more (classes - 1, a count vector)")
    das_steps: int = option(80, kind=Int(1), help="Adam steps per DAS fit group (default 80)")
    das_unsolved_steps: Any = option(None, kind=Int(1), metavar="N",
                                     help="Adam steps per DAS fit group where the trained model does not solve the "
                                          "task: every verdict is then 'model does not solve the task' whatever the "
                                          "fits find (default: --das-steps; a timeline fits no such model at all)")
    alignment_pairs: int = option(64, kind=Int(5), help="DAS pairs: with designed pairs, the changed test pairs "
                                  "wanted per variable (training and validation pairs in proportion); with random "
                                  "pairs, pairs per length (default 64)")
    pairs: str = option("designed", kind=Choice(PAIR_DESIGNS), metavar="{designed,random}",
                        help="DAS (base, source) pairs: designed from the exact circuit (the pairs on which swapping "
                             "the variable alone changes the exact output; default) or drawn at random")
    untrained_baseline: bool = option(True, kind=Bool(), flag="--no-untrained-baseline", negate=True,
                                      help="skip the DAS baseline fitted on an untrained model of the same shape")
    circuit_method: str = option("eap", kind=Choice(CIRCUIT_METHODS),
                                 help="discovery method for the trained model's circuit (default eap: one pass per "
                                      "length)")
    circuit_granularity: str = option("head", kind=Choice(CIRCUIT_GRANULARITIES),
                                      help="edges between whole heads or into their queries, keys and values "
                                           "(default head)")
    circuit_ablation: str = option("resample", kind=Choice(CIRCUIT_ABLATIONS),
                                   help="what an ablated edge reads: another word of its length, the mean, or a word "
                                        "of another length (sees per-length values such as the length itself); "
                                        "default resample")
    device: Any = option("auto", kind=_ModelDevice(), metavar="{cpu,cuda,mps,auto}",
                         help="where models run: cpu, cuda (or cuda:N), mps, or auto (default: CUDA if present, else "
                              "MPS, else the CPU); both models run there; words and every comparison stay on the CPU")
    quiet: bool = option(True, kind=Bool(), cli=False,
                         help="False: progress messages on stderr (the command line always shows them)")


@dataclass(frozen=True)
class DiffRequest(DiffOptions):
    """``exactlens diff CHECKPOINT_DIR --against NAME ...`` / ``el.diff(trained, against, ...)``: the comparison's
    options (:class:`DiffOptions`) and the diff's page."""

    html: Any = option(None, kind=Path_(), metavar="FILE",
                       help="also write an HTML page (attention views next to FILE in FILE_stem_files/)")
    overwrite: bool = option(False, kind=Bool(), help="replace an existing --html page and its views")


NOT_ECHOED = ("target", "against", "readout", "param", "lengths", "parts", "device", "quiet")
"""Options ``settings`` does not record as they are (the result records lengths, skipped lengths, parts and device
itself)."""
ECHOED = tuple(f.name for f in dataclasses.fields(DiffOptions) if f.name not in NOT_ECHOED)
"""The request's fields the result's ``settings`` records (beside lengths, skipped lengths, parts, device)."""

"""The options ``exactlens pairlogic`` and the training configuration share, declared once: their defaults,
help and kinds (exactlens.requests). ``PairlogicRequest`` (the verb, exactlens.papers.shin_matzinger.cli) and
``PairTrainConfig`` (exactlens.papers.shin_matzinger.training) both extend :class:`PairOptions`. Light: no torch."""

from __future__ import annotations

from dataclasses import dataclass

from exactlens.requests import Choice, DType, Int, option, options_of

__all__ = ["FLAVOURS", "NORMALIZATIONS", "PairOptions", "SYSTEMS", "WEIGHTINGS"]

SYSTEMS = ("solution1", "solution2", "solution3", "combined")
FLAVOURS = ("solution1", "solution2", "solution3", "unconstrained")
NORMALIZATIONS = ("post", "none")
WEIGHTINGS = ("none", "softmax")


@dataclass(frozen=True)
class PairOptions:
    categories: int = option(10, kind=Int(1), help="N, number of categories (default 10)")
    positions: int = option(50, kind=Int(1), help="M, sequence length (default 50)")
    seed: int = option(0, kind=Int(0), help="first training seed (default 0)")
    iterations: int = option(50, kind=Int(1), help="LBFGS iterations (paper: 50)")
    batch: int = option(1000, kind=Int(1), help="sequences per batch (paper: 1000)")
    system: str = option("combined", kind=Choice(SYSTEMS), help="which system is trained")
    flavour: str = option("unconstrained", kind=Choice(FLAVOURS),
                          help="the weights' constraint (only for system combined)")
    q: str = option("normal", kind=Choice(("normal", "code")), help="q_true: standard normal or eq. 2.15")
    q_seed: int = option(0, kind=Int(0), help="seed of q_true")
    dtype: str = option("float32", kind=DType(), help="float32 or float64")

    def shared(self) -> dict:
        """The values of the shared options (e.g. a request's, to build a PairTrainConfig)."""
        return {f.name: getattr(self, f.name) for f, _ in options_of(PairOptions)}

    def check_kinds(self) -> None:
        """Every field checked (and normalised: a torch dtype becomes its name) by its kind; None stays where it is
        the default."""
        for f, opt in options_of(type(self)):
            value = getattr(self, f.name)
            if opt.kind is None or (value is None and f.default is None):
                continue
            object.__setattr__(self, f.name, opt.kind.check(f.name, value))

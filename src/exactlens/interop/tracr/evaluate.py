"""A RASP evaluator with interventions: the values of every SOp of a program on one word, where
some SOps may be *set* to given values (Geiger et al.'s interchange interventions on the program's
own causal model).

Without overrides it computes what tracr's evaluator (``tracr.rasp.rasp.evaluate``) computes,
written separately (tests compare the two on every word of every registered program):

* tokens, indices, length: the word, 0..n-1, n at every position;
* Map f(x) and SequenceMap f(x, y): None where an argument is None;
* Select: the matrix [query][key] of predicate(key, query);
* SelectorWidth: the number of selected keys per query;
* Aggregate: the mean of the selected values; one value: that value; none: the default;
  several non-numeric values are an error (RASP's aggregate averages numbers only), or None (undefined)
  where SOps are set (an intervention may select what no word does), as are several different values of a
  categorical aggregate there.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from exactlens.errors import ExactLensError
from exactlens.interop.tracr import deps
from exactlens.interop.tracr.program import child_fields


def _mean(selected: list[Any], default: Any, where: str, intervened: bool = False, categorical: bool = False) -> Any:
    """Several non-numeric values: an error on a word, None (undefined) under an intervention, which may
    select what no word does. Under an intervention a categorical aggregate that selects several different values
    is None too, numbers or not: tracr compiles it to the mean of their one-hot codes, which is no value (RASP's
    evaluator would average the numbers: tracr-max_element's tokens 1 and 3 selected give 2.0, a class the compiled
    model never outputs there)."""
    if not selected:
        return default
    if len(selected) == 1:
        return selected[0]
    if intervened and categorical and len(set(selected)) > 1:
        return None
    if all(isinstance(v, (bool, int, float)) for v in selected):
        return sum(selected) / len(selected)
    if intervened:
        return None
    raise ExactLensError(f"{where}: an aggregate selects several non-numeric values {selected}; RASP averages "
                         "numbers only (the word is outside the program's domain)")


class Evaluation:
    """The values of a program's expressions on one word, computed on demand (each once)."""

    def __init__(self, word: Sequence[Any], overrides: Mapping[str, Sequence[Any]] | None = None):
        self.word = list(word)
        self.overrides = dict(overrides or {})
        for label, values in self.overrides.items():
            if len(values) != len(self.word):
                raise ExactLensError(f"values for {label!r} must have one entry per position ({len(self.word)}), "
                                     f"got {len(values)}")
        self.values: dict[str, Any] = {}
        self.rasp = deps.rasp()

    def __call__(self, expr: Any) -> Any:
        label = expr.label
        if label not in self.values:
            if label in self.overrides:
                self.values[label] = list(self.overrides[label])
            else:
                self.values[label] = self._compute(expr)
        return self.values[label]

    def _compute(self, expr: Any) -> Any:
        r, n = self.rasp, len(self.word)
        child_fields(expr)  # a supported expression, or a clear error
        if isinstance(expr, r.TokensType):
            return list(self.word)
        if isinstance(expr, r.IndicesType):
            return list(range(n))
        if isinstance(expr, r.LengthType):
            return [n] * n
        if isinstance(expr, r.Full):
            return [expr.fill] * n
        if isinstance(expr, r.ConstantSOp):
            return list(expr.value)
        if isinstance(expr, r.ConstantSelector):
            return [list(row) for row in expr.value]
        if isinstance(expr, r.Map):
            return [None if x is None else expr.f(x) for x in self(expr.inner)]
        if isinstance(expr, r.SequenceMap):
            return [None if x is None or y is None else expr.f(x, y)
                    for x, y in zip(self(expr.fst), self(expr.snd), strict=True)]
        if isinstance(expr, r.Select):
            keys, queries = self(expr.keys), self(expr.queries)
            return [[bool(expr.predicate(k, q)) for k in keys] for q in queries]
        if isinstance(expr, r.SelectorAnd):
            a, b = self(expr.fst), self(expr.snd)
            return [[x and y for x, y in zip(ra, rb, strict=True)] for ra, rb in zip(a, b, strict=True)]
        if isinstance(expr, r.SelectorOr):
            a, b = self(expr.fst), self(expr.snd)
            return [[x or y for x, y in zip(ra, rb, strict=True)] for ra, rb in zip(a, b, strict=True)]
        if isinstance(expr, r.SelectorNot):
            return [[not x for x in row] for row in self(expr.inner)]
        if isinstance(expr, r.SelectorWidth):
            return [sum(row) for row in self(expr.selector)]
        if isinstance(expr, r.Aggregate):
            matrix, values = self(expr.selector), self(expr.sop)
            categorical = bool(self.rasp.is_categorical(expr))
            return [_mean([v for s, v in zip(row, values, strict=True) if s], expr.default, expr.label,
                          bool(self.overrides), categorical) for row in matrix]
        raise ExactLensError(f"cannot evaluate {type(expr).__name__} {expr.label}")


def evaluate(program: Any, word: Sequence[Any], overrides: Mapping[str, Sequence[Any]] | None = None) -> list[Any]:
    """The program's values on the word, with the SOps named in ``overrides`` (labels) set to the
    values given (one per position)."""
    return list(Evaluation(word, overrides)(program))

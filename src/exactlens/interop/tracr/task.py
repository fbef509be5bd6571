"""The task a registered RASP program answers (:class:`TracrTask`, registered as ``tracr-<name>``).

Words are sequences of the program's input tokens (named by str(), in tracr's token order); the
tokenizer puts tracr's BOS token first, as the compiled model expects. The target at each symbol
position is the program's output there, from the program's own RASP evaluation: a class (the
output's value set, kind "prediction") for a categorical program, the value (kind "regression")
for a numerical one; where the program's output is None (undefined), wherever that is, the position
has no target (``UNDEFINED`` or NaN in ``targets``, left out by ``target_mask`` given the targets).
``target(word)`` uses tracr's evaluator, ``targets(ids)`` this package's
(:mod:`.evaluate`); tests check they agree.

The causal variables are the program's SOps other than tokens and indices, named by their labels
(the residual labels of the compiled model start with them), with one value per position: a
categorical SOp's index in its value set (tracr's order; -1 for None), a numerical SOp's value
(NaN for None). Setting a variable re-evaluates the program with that SOp's values overridden.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from exactlens.errors import ExactLensError
from exactlens.interop.tracr import deps
from exactlens.interop.tracr.compile import check_max_seq_len
from exactlens.interop.tracr.evaluate import Evaluation
from exactlens.interop.tracr.program import is_primitive, sops
from exactlens.tasks.base import UNDEFINED, Task
from exactlens.tasks.variables import CausalVariable

SAMPLE_ROUNDS = 200  # rejection sampling of a program's domain: rounds before giving up
TARGET_CACHE_LIMIT = 100_000  # words whose targets a task keeps (training draws the short ones again and again)


def token_order(vocab: Any, bos: str, pad: str) -> list[Any]:
    """The input values in tracr's token order (the sorted basis of its token space, BOS and PAD dropped)."""
    bases = deps.craft().bases
    space = bases.VectorSpaceWithBasis.from_values("tokens", set(vocab) | {bos, pad})
    return [d.value for d in space.basis if d.value not in (bos, pad)]


class TracrTask(Task):
    """The task of the registered program ``program`` for words of up to ``max_seq_len`` tokens."""

    use_cls = True
    use_eos = False
    min_length = 1

    def __init__(self, program: str, max_seq_len: int | None = None):
        from exactlens.interop.tracr import programs as library

        spec = library.program_spec(program)
        self.program_name = program
        self.max_seq_len = check_max_seq_len(spec.max_seq_len if max_seq_len is None else max_seq_len)
        self.name = f"tracr-{program}"
        self.max_length = self.max_seq_len
        self.cls_token = spec.compiler_bos
        self.first_target = spec.first_target
        self.domain = spec.domain
        self.domain_doc = spec.domain_doc
        self.program = library.program(program, self.max_seq_len)
        rasp = deps.rasp()
        self.kind = "prediction" if rasp.is_categorical(self.program) else "regression"
        self.values = token_order(spec.vocab, spec.compiler_bos, spec.compiler_pad)
        self.alphabet = tuple(str(v) for v in self.values)
        self._value_of = dict(zip(self.alphabet, self.values, strict=True))
        self._graph_cache: Any = None
        self._targets_cache: dict[tuple[int, ...], list[Any]] = {}
        # a designed-pair search evaluates the same word with the same SOp set, and the same SOp on the same
        # word, again and again (the program in Python each time): both kept, as the targets are
        self._override_cache: dict[tuple[Any, ...], list[Any]] = {}
        self._sop_cache: dict[tuple[Any, ...], list[Any]] = {}

    @property
    def params(self) -> dict[str, Any]:
        return {"max_seq_len": self.max_seq_len}

    # ---- what tracr's basis inference says -------------------------------------------------

    @property
    def _graph(self) -> Any:
        if self._graph_cache is None:
            from exactlens.interop.tracr import programs as library

            self._graph_cache = library.analysis(self.program_name, self.max_seq_len)
        return self._graph_cache

    def value_set(self, sop: Any) -> list[Any]:
        """A categorical SOp's values in tracr's order (its residual labels' order)."""
        nodes = deps.compiler().nodes
        return [d.value for d in self._graph.nodes[sop.label][nodes.OUTPUT_BASIS]]

    @property
    def output_values(self) -> list[Any]:
        return self.value_set(self.program)

    @property
    def classes(self) -> tuple[str, ...]:
        if self.kind == "regression":
            return ("value",)
        names = tuple(str(v) for v in self.output_values)
        if len(set(names)) != len(names):
            raise ExactLensError(f"{self.name}: the output values {self.output_values} do not have distinct names")
        return names

    # ---- words -----------------------------------------------------------------------------

    def word_values(self, word: Any) -> list[Any]:
        """A word (string or sequence of symbols) -> the program's input values."""
        symbols = self.symbols_of(word)
        self.check_length(len(symbols))
        return [self._value_of[s] for s in symbols]

    def in_domain(self, values: list[Any]) -> bool:
        return self.domain is None or bool(self.domain(values))

    def sample(self, length: int, count: int, generator: torch.Generator) -> torch.Tensor:
        """Uniform words of the length; for a program with a domain (e.g. distinct tokens), uniform
        words of the domain (rejection sampling)."""
        words = super().sample(length, count, generator)
        if self.domain is None or count == 0:
            return words
        kept = [w for w in words if self._ids_in_domain(w)]
        for _ in range(SAMPLE_ROUNDS):
            if len(kept) >= count:
                break
            more = super().sample(length, max(count, 64), generator)
            kept += [w for w in more if self._ids_in_domain(w)]
        if len(kept) < count:
            raise ExactLensError(f"{self.name}: found {len(kept)} of {count} words of length {length} in the "
                                 f"program's domain ({self.domain_doc}); use another length")
        return torch.stack(kept[:count])

    def all_words(self, length: int) -> torch.Tensor:
        """Every word of the length in the program's domain."""
        words = super().all_words(length)
        if self.domain is None:
            return words
        keep = torch.tensor([self._ids_in_domain(w) for w in words], dtype=torch.bool)
        if not keep.any():
            raise ExactLensError(f"{self.name}: no word of length {length} is in the program's domain "
                                 f"({self.domain_doc}); use a shorter length")
        return words[keep]

    def _ids_in_domain(self, row: torch.Tensor) -> bool:
        return self.in_domain([self.values[int(i)] for i in row])

    # ---- targets ---------------------------------------------------------------------------

    def _encode_outputs(self, outputs: list[Any], where: str, intervened: bool = False) -> list[Any]:
        """Program outputs at each position -> targets (None where the output is undefined, RASP's
        None, wherever it is, and before first_target: no target there). Under an intervention, a value
        outside the output space (an aggregate averaging different classes, e.g. max_element with its
        counts set) is no class either: undefined."""
        encoded: list[Any] = []
        if self.kind == "prediction":
            index = {v: i for i, v in enumerate(self.output_values)}
        for position, value in enumerate(outputs):
            outside = value is not None and self.kind == "prediction" and value not in index
            if position < self.first_target or value is None or (outside and intervened):
                encoded.append(None)
                continue
            if outside:
                raise ExactLensError(
                    f"{self.name}: the program's output at position {position} of {where} is {value!r}, not a "
                    "value of its output space" + (f"; the program is defined on {self.domain_doc}"
                                                    if self.domain_doc else ""))
            encoded.append(index[value] if self.kind == "prediction" else float(value))
        return encoded

    def target(self, word: Any) -> list[Any]:
        """The program's output at each position by tracr's own evaluator (``rasp.evaluate``)."""
        values = self.word_values(word)
        if not self.in_domain(values):
            raise ExactLensError(f"{self.name}: the word {values} is outside the program's domain ({self.domain_doc})")
        return self._encode_outputs(list(deps.rasp().evaluate(self.program, values)), repr(values))

    def _row_targets(self, row: tuple[int, ...], overrides: dict[str, list[Any]] | None = None) -> list[Any]:
        values = [self.values[i] for i in row]
        if overrides is None and row in self._targets_cache:
            return self._targets_cache[row]
        if not self.in_domain(values):
            raise ExactLensError(f"{self.name}: the word {values} is outside the program's domain ({self.domain_doc})")
        key = None if not overrides else (row, *((label, *((type(v).__name__, v) for v in given))
                                                  for label, given in sorted(overrides.items())))
        if key is not None and key in self._override_cache:
            return self._override_cache[key]
        where = repr(values) + (f" with {sorted(overrides)} set" if overrides else "")
        encoded = self._encode_outputs(Evaluation(values, overrides)(self.program), where, bool(overrides))
        cache, at = (self._targets_cache, row) if key is None else (self._override_cache, key)
        if (overrides is None or key is not None) and len(cache) < TARGET_CACHE_LIMIT:
            cache[at] = encoded
        return encoded

    def _as_tensor(self, rows: list[list[Any]], length: int) -> torch.Tensor:
        dtype = torch.long if self.kind == "prediction" else torch.float64
        fill = UNDEFINED if self.kind == "prediction" else math.nan
        data = [[fill if v is None else v for v in row] for row in rows]
        return torch.tensor(data, dtype=dtype).reshape(len(rows), length)

    def targets(self, symbol_ids: torch.Tensor) -> torch.Tensor:
        """Targets [B, L] by this package's evaluator (class indices, or float64 values); where the
        output is undefined they hold UNDEFINED (classes) or NaN (values), which ``target_mask`` given
        the targets leaves out, wherever they are."""
        rows = [tuple(int(i) for i in row) for row in symbol_ids]
        if rows:
            self.check_length(len(rows[0]))
        return self._as_tensor([self._row_targets(r) for r in rows], symbol_ids.shape[1])

    # ---- causal variables --------------------------------------------------------------------

    def variables(self) -> list[CausalVariable]:
        rasp = deps.rasp()
        out = []
        for sop in sops(self.program):
            if is_primitive(sop):
                continue
            categorical = rasp.is_categorical(sop)
            values = self.value_set(sop) if categorical else None
            kind = "index in its value set" if categorical else "value"
            out.append(CausalVariable(
                sop.label, "position",
                lambda ids, sop=sop, values=values: self._sop_values(ids, sop, values),
                lambda base, setting, sop=sop, values=values: self._set_sop(base, setting, sop, values),
                f"{sop.name} ({type(sop).__name__}, {'categorical' if categorical else 'numerical'}) at each "
                f"position: its {kind}",
            ))
        return out

    def _sop_values(self, ids: torch.Tensor, sop: Any, values: list[Any] | None) -> torch.Tensor:
        index = {v: i for i, v in enumerate(values)} if values is not None else None
        rows = []
        for row in ids:
            word = [self.values[int(i)] for i in row]
            key = (tuple(int(i) for i in row), sop.label)
            evaluated = self._sop_cache.get(key)
            if evaluated is None:
                evaluated = list(Evaluation(word)(sop))
                if len(self._sop_cache) < TARGET_CACHE_LIMIT:
                    self._sop_cache[key] = evaluated
            if index is None:
                rows.append([math.nan if v is None else float(v) for v in evaluated])
                continue
            missing = [v for v in evaluated if v is not None and v not in index]
            if missing:
                raise ExactLensError(f"{self.name}: {sop.label} takes the values {missing} on {word}, outside its "
                                     f"value set {values}")
            rows.append([-1 if v is None else index[v] for v in evaluated])
        dtype = torch.float64 if index is None else torch.long
        return torch.tensor(rows, dtype=dtype).reshape(ids.shape[0], ids.shape[1])

    def _set_sop(self, base: torch.Tensor, setting: torch.Tensor, sop: Any, values: list[Any] | None) -> torch.Tensor:
        if setting.shape != base.shape:
            raise ExactLensError(f"values for {sop.label} must have the shape of the words {tuple(base.shape)}, "
                                 f"got {tuple(setting.shape)}")
        rows = []
        for row, given in zip(base, setting, strict=True):
            if values is None:
                decoded = [None if math.isnan(float(v)) else float(v) for v in given]
            else:
                bad = sorted({int(v) for v in given if not -1 <= int(v) < len(values)})
                if bad:
                    raise ExactLensError(f"{sop.label} is an index in its {len(values)} values (or -1 for None), "
                                         f"got {bad}")
                decoded = [None if int(v) == -1 else values[int(v)] for v in given]
            rows.append(self._row_targets(tuple(int(i) for i in row), {sop.label: decoded}))
        return self._as_tensor(rows, base.shape[1])

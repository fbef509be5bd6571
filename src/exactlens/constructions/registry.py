"""The registry: construction names -> builders, each naming the task it solves.

A construction is registered with :func:`register` (exactlens's papers do it from their
plug-ins, a user's package the same way). ``make`` builds the model and records in its config
what it answers: ``cfg.task`` (the task with the parameters the model was built for) and
``cfg.decision_rule`` (how its outputs are read, when not the task kind's standard way), and
checks that the model's vocabulary is the task's.

Registering costs no import when ``build`` is a "package.module:function" string and ``parameters``
declares the builder's keyword parameters with their defaults (dtype left out): ``exactlens list``
then describes the construction without importing the builder (or torch). The builder is imported
when a model is first built, and its signature must match the declared parameters exactly.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from exactlens import tasks
from exactlens.errors import ExactLensError
from exactlens.plugins import Registry, import_target

if TYPE_CHECKING:
    import torch

    from exactlens.model import ExactTransformer
    from exactlens.tasks.decisions import Reader


def _signature_defaults(function: Callable[..., Any]) -> dict[str, Any]:
    return {k: p.default for k, p in inspect.signature(function).parameters.items() if k != "dtype"}


def longest_length(model: ExactTransformer) -> int | None:
    """The longest |w| a model answers by itself (None: any): its task's limit, a limit it was built
    for (metadata["max_length"], e.g. a nonuniform construction's N) and its learned position
    table's (n_ctx less the task's special tokens)."""
    task = tasks.of_model(model)
    highs = [task.max_length, model.cfg.metadata.get("max_length")]
    if model.cfg.learned_positions:
        highs.append(model.cfg.n_ctx - task.n_specials)
    known = [h for h in highs if h is not None]
    return min(known) if known else None


@dataclass
class Construction:
    name: str
    task: str  # the task's registered name (exactlens.tasks)
    build: Callable[..., ExactTransformer] | str  # the builder, or "package.module:function" (imported when used)
    paper: str
    summary: str
    max_length: int | None = None  # longest |w| the construction claims (None: any)
    min_length: int = 0  # shortest |w| it is defined for
    task_params: Callable[[dict[str, Any]], dict[str, Any]] | None = None  # builder params -> task params
    decision_rule: str | None = None  # a registered rule (exactlens.tasks.decisions); None: the kind's
    tags: tuple[str, ...] = field(default_factory=tuple)
    parameters: dict[str, Any] | None = None  # the builder's parameters and defaults (dtype excluded), declared
    # the builder parameter that sets the longest |w| (tracr's max_seq_len): the limit of each built model
    # (its metadata "max_length"); ``list`` shows its default as max_length
    max_length_param: str | None = None
    # the builder parameter that sets the shortest |w| (majority-per-position's min_margin: a shorter word
    # cannot lead by the margin); ``list`` shows its default as min_length
    min_length_param: str | None = None
    # the options ``exactlens train NAME --siit`` uses for a model shaped like this construction
    # (exactlens.train.shaped): the settings measured to meet SIIT's targets, as a paper preset's ``siit_defaults``
    # (docs/siit.md "Per-task SIIT defaults"); the user's options still win. Checked against the training options
    # when that preset is made.
    siit_defaults: dict[str, Any] = field(default_factory=dict)
    _builder: Callable[..., ExactTransformer] | None = field(default=None, init=False, repr=False, compare=False)

    @property
    def language(self) -> str:
        """The task's name (the field's name before tasks had kinds)."""
        return self.task

    @property
    def builder(self) -> Callable[..., ExactTransformer]:
        """The builder function (imported from its "module:function" string the first time), checked
        against the declared ``parameters``."""
        if self._builder is None:
            function = import_target(self.build) if isinstance(self.build, str) else self.build
            if not callable(function):
                raise ExactLensError(f"construction {self.name!r}: its builder {self.build!r} is not callable")
            if self.parameters is not None and _signature_defaults(function) != self.parameters:
                raise ExactLensError(
                    f"construction {self.name!r} declares the parameters {self.parameters}, but its builder "
                    f"{getattr(function, '__qualname__', function)} takes {_signature_defaults(function)}"
                )
            self._builder = function
        return self._builder

    def defaults(self) -> dict[str, Any]:
        """Builder parameters and their defaults (dtype excluded): the declared ones (no import), else
        the builder's signature."""
        if self.parameters is not None:
            return dict(self.parameters)
        return _signature_defaults(self.builder)

    def resolve(self, params: dict[str, Any]) -> dict[str, Any]:
        unknown = sorted(set(params) - set(self.defaults()))
        if unknown:
            raise ExactLensError(f"{self.name} has no parameters {unknown}; it takes {sorted(self.defaults())}")
        return {**self.defaults(), **params}

    def task_of(self, **params: Any) -> tasks.Task:
        """The task a model built with these parameters answers."""
        resolved = self.resolve(params)
        return tasks.get(self.task, **(self.task_params(resolved) if self.task_params else {}))

    def make(self, dtype: str = "float32", device: Any = None, **params: Any) -> ExactTransformer:
        """The model, built on the CPU and moved to ``device`` (exactlens.devices; None: stays on the CPU);
        ``dtype``: "float32", "float64" or the torch dtype."""
        from exactlens.devices import resolve_device
        from exactlens.dtypes import dtype_name

        dtype = dtype_name(dtype)
        target = resolve_device(device, dtype) if device is not None else None  # a bad device fails first
        task = self.task_of(**params)
        model = self.builder(dtype=dtype, **params)
        cfg = model.cfg
        cfg.model_name = self.name  # the registry name (parameters live in cfg.metadata)
        cfg.task = task.spec()
        cfg.decision_rule = self.decision_rule
        if cfg.vocab is not None and tuple(cfg.vocab) != task.vocab:
            raise ExactLensError(
                f"{self.name}: the model's vocabulary {list(cfg.vocab)} differs from its task's {list(task.vocab)} "
                f"({task!r}); a construction must read the tokens its task writes"
            )
        if cfg.vocab is None:
            cfg.vocab = task.vocab
        model.eval()
        return model if target is None else model.to(target)

    def reader(self, **params: Any) -> Reader:
        """How this construction's outputs are read (its task and decision rule)."""
        from exactlens.tasks.decisions import Reader

        rule = tasks.decision_rule(self.decision_rule) if self.decision_rule else None
        return Reader(self.task_of(**params), rule)

    def decide(self, outputs: torch.Tensor, n_positions: torch.Tensor, **params: Any) -> torch.Tensor:
        return self.reader(**params).decide(outputs, n_positions)

    def lang(self, **params: Any) -> tasks.Task:
        """The task (with default parameters unless given); the name from before tasks had kinds."""
        return self.task_of(**params)

    def length_range(self, model: ExactTransformer | None = None) -> tuple[int, int | None]:
        """(shortest, longest |w|) a model of this construction answers: the construction's, its
        task's, a limit the model was built for (metadata["max_length"]) and its learned position
        table's (n_ctx); None = no upper limit."""
        task = tasks.of_model(model) if model is not None else self.task_of()
        highs = [self.max_length, task.max_length if model is None else longest_length(model)]
        known = [h for h in highs if h is not None]
        return max(self.min_length, task.min_length), (min(known) if known else None)

    def default_lengths(self, model: ExactTransformer | None = None, longest: int = 12) -> list[int]:
        """What verify checks when no lengths are given: 1..longest within the length range."""
        low, high = self.length_range(model)
        return [n for n in range(max(1, low), longest + 1) if high is None or n <= high] or [low]

    def default_max_length(self, model: ExactTransformer | None = None, longest: int = 1000) -> int:
        """What precision scans up to when no maximum is given: longest, or the construction's longest."""
        high = self.length_range(model)[1]
        return longest if high is None else min(longest, high)

    def check_length(self, length: int, model: ExactTransformer | None = None) -> None:
        """The task's length limits, the construction's, and a limit the model was built for
        (metadata["max_length"], e.g. a nonuniform construction's N)."""
        if not isinstance(length, int) or isinstance(length, bool):
            raise ExactLensError(f"{self.name}: length must be an integer, got {length!r}")
        if length < self.min_length:
            raise ExactLensError(
                f"{self.name} is defined for |w| >= {self.min_length}; length {length} is below its limit"
            )
        if self.max_length is not None and length > self.max_length:
            raise ExactLensError(
                f"{self.name} is stated for |w| <= {self.max_length}; length {length} is beyond its limit"
            )
        if model is not None:
            limit = model.cfg.metadata.get("max_length")
            if limit is not None and length > limit:
                raise ExactLensError(f"{self.name} was built for |w| <= {limit}; length {length} is beyond it")
            task = tasks.of_model(model)
            task.check_length(length)
            if model.cfg.learned_positions and length + task.n_specials > model.cfg.n_ctx:
                raise ExactLensError(
                    f"{self.name}: |w| = {length} needs {length + task.n_specials} positions, beyond its learned "
                    f"position table (n_ctx={model.cfg.n_ctx})"
                )

    def stated_max_length(self) -> int | None:
        """The longest |w| of the construction with its default parameters (None: any)."""
        if self.max_length is not None or self.max_length_param is None:
            return self.max_length
        return self.defaults().get(self.max_length_param)

    def describe(self) -> dict[str, Any]:
        """What ``exactlens list --json`` shows. The task is described by the facts it was registered
        with where it declared them (its default instance's kind and min_length; exactlens.tasks.register),
        so listing imports nothing."""
        facts = tasks.info(self.task)
        task_name, kind, task_min = self.task, facts["kind"], facts["min_length"]
        return {
            "name": self.name,
            "language": self.task,
            "task": {"name": task_name, "kind": kind},
            "paper": self.paper,
            "summary": self.summary,
            "parameters": self.defaults(),
            "min_length": max(self.min_length, task_min, self.defaults()[self.min_length_param]
                              if self.min_length_param else 0),
            "max_length": self.stated_max_length(),
            "decision_rule": self.decision_rule,
        }


REGISTRY: dict[str, Construction] = Registry("constructions")


def register(construction: Construction) -> Construction:
    if not isinstance(construction, Construction):
        raise ExactLensError(f"register takes a Construction, got {type(construction).__name__}")
    if REGISTRY.peek(construction.name) not in (None, construction):
        raise ExactLensError(f"construction {construction.name!r} is already registered")
    REGISTRY[construction.name] = construction
    return construction


def get(name: str) -> Construction:
    from exactlens.plugins import load_plugins

    if not isinstance(name, str):
        raise ExactLensError(f"a construction is named by a string (exactlens list shows them), got "
                             f"{type(name).__name__} {name!r:.80}")
    load_plugins()
    if name not in REGISTRY:
        raise ExactLensError(f"unknown construction {name!r}; known: {', '.join(sorted(REGISTRY))}")
    return REGISTRY[name]


def get_target(target: object) -> Construction:
    """The construction named ``target``, for commands that take a checkpoint directory or a
    construction name (the caller has found no directory of that name)."""
    try:
        return get(str(target))
    except ExactLensError as err:
        raise ExactLensError(f"{target!r} is neither a checkpoint directory nor a construction name: {err}") from err


def names() -> list[str]:
    from exactlens.plugins import load_plugins

    load_plugins()
    return sorted(REGISTRY)


def build(name: str, dtype: str = "float32", device: Any = None, **params: Any) -> ExactTransformer:
    """Build a registered construction: ``build("parity", dtype="float64", c=2.0)`` (``device``: see
    exactlens.devices)."""
    return get(name).make(dtype=dtype, device=device, **params)

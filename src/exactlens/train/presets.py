"""Training presets: a task, an architecture and training settings under one name.

A preset is a set of option defaults, the task it trains (name and parameters, which may
depend on the options), a function options -> ExactConfig, and optional hooks: extra options
with their meaning, evaluation metrics (exactlens.train.metrics), a ``prepare`` step after the
initialization (e.g. fixed one-hot inputs), gradient masks and a penalty (e.g. a constrained
system). Papers register theirs through their plug-ins (``register_preset``); the loop knows
none of them by name.

Every preset accepts the generic options, declared once in exactlens.train.options.TrainOptions
(their meaning: OPTION_DOCS); ``defaults`` overrides their defaults, and a preset adds its own options
in ``options`` (name -> meaning) with their values in ``defaults``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from exactlens import tasks
from exactlens.constructions import registry as constructions
from exactlens.errors import ExactLensError
from exactlens.model import ExactConfig, ExactTransformer
from exactlens.train import shaped
from exactlens.train.metrics import Metric
from exactlens.train.options import (  # noqa: F401 (their old home)
    EVERY_LAYER,
    GENERIC_DEFAULTS,
    LAYER_NORM_CHOICES,
    LR_SCHEDULES,
    OPTIMIZERS,
    OPTION_DOCS,
    PRESET_SETS,
    SHARED_OPTIONS,
    check_options,
)
from exactlens.train.registry import PRESETS, preset_names, register_preset  # noqa: F401 (their home: no torch)

Options = dict[str, Any]
LossShortcut = Callable[..., "tuple[torch.Tensor, torch.Tensor] | None"]
"""A preset's ``losses(spec, params, tokens, n_positions, targets)``: the per-run mean training loss
[R] and the number of words decided right [R] for stacked parameters (name -> [R, ...]) and a
stacked batch, the same values as the loop's default path (the model's readout under the task's
loss) computed another way, e.g. from token counts; None where it does not apply (the loop then
takes the default path). Its tests must show the equality."""


@dataclass(frozen=True)
class Preset:
    name: str
    task: str  # registered task name
    paper: str
    summary: str
    config: Callable[[tasks.Task, Options], ExactConfig]  # the architecture for resolved options
    defaults: Options = field(default_factory=dict)  # values of generic and own options
    options: dict[str, str] = field(default_factory=dict)  # the preset's own options: name -> meaning
    task_params: Callable[[Options], dict[str, Any]] | None = None
    validate: Callable[[Options], None] | None = None  # checks of the preset's own options
    metrics: tuple[Metric, ...] = ()
    prepare: Callable[[ExactTransformer, Options], None] | None = None  # after initialization
    masks: Callable[[ExactTransformer, Options], dict[str, torch.Tensor | bool]] | None = None
    penalty: Callable[[dict[str, torch.Tensor], Options], torch.Tensor] | None = None  # per run [R]
    null_fields: tuple[str, ...] = ()  # history fields always null (kept for readers of older records)
    losses: LossShortcut | None = None  # the training loss computed another way (exact; see LossShortcut)
    complete: Callable[[Options], None] | None = None  # fills derived defaults before validation
    # defaults that replace ``defaults`` when the run trains with SIIT (siit=True): the settings measured to meet
    # SIIT's targets for this task (docs/siit.md "Per-task SIIT defaults"); the user's options still win
    siit_defaults: Options = field(default_factory=dict)

    def __post_init__(self) -> None:
        unknown = sorted((set(self.defaults) | set(self.siit_defaults)) - set(OPTION_DOCS) - set(self.options))
        if unknown:
            raise ExactLensError(f"preset {self.name!r}: defaults for {unknown}, which are neither training options "
                                 "(exactlens.train.options.TrainOptions) nor the preset's own (options)")

    def task_of(self, options: Options) -> tasks.Task:
        return tasks.get(self.task, **(self.task_params(options) if self.task_params else {}))

    def resolve(self, options: Options) -> Options:
        """TrainOptions' defaults overridden by the preset's, then by ``options``; unknown names and bad
        values raise (every generic option checked by its kind: exactlens.train.options)."""
        allowed = set(OPTION_DOCS) | set(self.options)
        unknown = sorted(set(options) - allowed)
        if unknown:
            raise ExactLensError(
                f"unknown training options {unknown} for {self.name!r}; allowed: {', '.join(sorted(allowed))}"
            )
        siit = self.siit_defaults if options.get("siit", self.defaults.get("siit")) else {}
        resolved = {**GENERIC_DEFAULTS, **SHARED_OPTIONS, **self.defaults, **siit, **options}
        for key, value in SHARED_OPTIONS.items():
            if key not in self.options and resolved[key] != value:
                raise ExactLensError(
                    f"preset {self.name!r} has no option {key!r} (it accepts only {value!r}); its own options: "
                    f"{', '.join(sorted(self.options)) or 'none'}"
                )
        missing = sorted(n for n in PRESET_SETS if n not in resolved)
        if missing:
            raise ExactLensError(f"preset {self.name!r} sets no default for {missing}; give them as options")
        if self.complete is not None:
            self.complete(resolved)
        validate_generic(resolved)
        if self.validate is not None:
            self.validate(resolved)
        return resolved

    def spec(self, options: Options) -> TrainSpec:
        opts = self.resolve(options)
        task = self.task_of(opts)
        for key in ("train_length", "test_length"):
            lo, _ = opts[key]
            task.check_length(lo)
        config = self.config(task, opts)
        config.metadata.setdefault("preset", self.name)
        config.metadata.setdefault("paper", self.paper)
        config.task = task.spec()
        spec = TrainSpec(self, task, config, opts)
        if opts["siit"]:  # SIIT's losses join the preset's penalty (exactlens.train.siit)
            from exactlens.train.siit import with_siit

            spec = with_siit(spec)
        elif opts["siit_map"] is not None:
            raise ExactLensError("siit_map applies with siit (--siit)")
        return spec


@dataclass(frozen=True)
class TrainSpec:
    """Everything the loop needs: the preset (its name, paper and hooks), its resolved options, the task and
    the architecture."""

    preset: Preset
    task: tasks.Task
    config: ExactConfig
    options: Options

    name = property(lambda self: self.preset.name)
    paper = property(lambda self: self.preset.paper)
    metrics = property(lambda self: self.preset.metrics)
    prepare = property(lambda self: self.preset.prepare)
    masks = property(lambda self: self.preset.masks)
    penalty = property(lambda self: self.preset.penalty)
    null_fields = property(lambda self: self.preset.null_fields)
    losses = property(lambda self: self.preset.losses)


def construction_names() -> list[str]:
    """Construction names that train in their construction's shape (those without a paper preset)."""
    return [n for n in constructions.names() if n not in PRESETS]


def get_preset(name: str) -> Preset:
    """A registered preset, or else the preset of a construction's task in its shape
    (exactlens.train.shaped)."""
    from exactlens.plugins import load_plugins

    load_plugins()
    if name in PRESETS:
        return PRESETS[name]
    if name in constructions.names():
        return Preset(**shaped.shaped_preset_fields(name))
    raise ExactLensError(
        f"unknown training task {name!r}; paper presets: {', '.join(sorted(PRESETS))}; or any construction "
        f"(trained in its shape): {', '.join(construction_names())}"
    )


resolve_options = Preset.resolve  # older name: resolve_options(preset, options)


# ---- validation of the generic options -------------------------------------------------


MAX_COUNT = 10**9  # epochs, words, widths: beyond it a run would never finish (and indices overflow)


def positive_int(name: str, value: Any, minimum: int = 1) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or not minimum <= value <= MAX_COUNT:
        raise ExactLensError(f"{name} must be an integer in [{minimum}, {MAX_COUNT:.0e}], got {value!r:.80}")


def choice(name: str, value: Any, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ExactLensError(f"{name}={value!r} is not allowed; choose one of {', '.join(allowed)}")


def validate_generic(o: Options) -> None:
    """Every generic option by its kind (exactlens.train.options.check_options), then the rules between them."""
    check_options(o)
    if o["batch_size"] is None:
        o["batch_size"] = o["strings_per_epoch"]
    if o["strings_per_epoch"] % o["batch_size"]:
        raise ExactLensError(
            f"batch_size={o['batch_size']} must divide strings_per_epoch={o['strings_per_epoch']} "
            "(an epoch is a whole number of steps)"
        )
    if o["optimizer"] == "lbfgs" and o["batch_size"] != o["strings_per_epoch"]:
        raise ExactLensError("lbfgs trains on one full batch: leave batch_size at strings_per_epoch")


# ---- comparable models: the architecture of an exact solution, widened ----------------------

ARCHITECTURE_OPTIONS: dict[str, str] = {name: OPTION_DOCS[name] for name in ("scaled", "layer_norm")}
"""The options a comparable model's preset uses (list them in ``Preset.options``)."""
LAYER_NORMS = tuple(c for c in LAYER_NORM_CHOICES if c not in EVERY_LAYER)
"""The ``layer_norm`` choices of a comparable model's preset (exactlens.train.options.LAYER_NORM_CHOICES)."""


def check_architecture_options(o: Options) -> None:
    if not isinstance(o["scaled"], bool):
        raise ExactLensError(f"scaled must be true or false, got {o['scaled']!r}")
    choice("layer_norm", o["layer_norm"], LAYER_NORMS)


def comparable_config(
    task: tasks.Task,
    o: Options,
    *,
    name: str,
    n_layers: int,
    n_heads: int,
    positional_features: tuple[str, ...],
    normalization: str = "post",
    attn_bias: bool = True,
    attention_mask: str = "none",
) -> ExactConfig:
    """A trainable softmax model of the task with a standard readout for its kind, the given
    shape, widths from the options (d_model, d_mlp), layer norm per ``layer_norm`` (at
    ``normalization``) and log-n scaling per ``scaled``."""
    layer_norm = o["layer_norm"]
    return ExactConfig(
        d_model=o["d_model"],
        n_layers=n_layers,
        n_heads=n_heads,
        d_mlp=o["d_mlp"],
        d_vocab=len(task.vocab),
        vocab=task.vocab,
        d_vocab_out=task.n_outputs,
        positional_features=positional_features,
        attention_mask=attention_mask,
        attention_weighting="softmax",
        attn_length_scale="log_n" if o["scaled"] else "none",
        normalization="none" if layer_norm == "none" else normalization,
        ln_eps=o["ln_eps"],
        ln_center=layer_norm != "scale_only",
        act_fn="relu",
        attn_bias=attn_bias,
        readout=task.readout,
        readout_position=0,
        dtype=o["dtype"],
        model_name=f"trained-{name}",
    )

"""Training presets: a task, an architecture and training settings under one name.

A preset is a set of option defaults, the task it trains (name and parameters, which may
depend on the options), a function options -> ExactConfig, and optional hooks: extra options
with their meaning, evaluation metrics (exactlens.train.metrics), a ``prepare`` step after the
initialization (e.g. fixed one-hot inputs), gradient masks and a penalty (e.g. a constrained
system). Papers register theirs through their plug-ins (``register_preset``); the loop knows
none of them by name.

Every preset accepts the generic options of OPTION_DOCS; a preset adds its own in
``options`` (name -> meaning).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from exactlens import tasks
from exactlens.constructions import registry as constructions
from exactlens.errors import ExactLensError
from exactlens.model import ExactConfig, ExactTransformer
from exactlens.train import shaped
from exactlens.train.data import check_lengths
from exactlens.train.metrics import Metric
from exactlens.train.registry import PRESETS, preset_names, register_preset  # noqa: F401 (their home: no torch)

OPTIMIZERS = ("adam", "lbfgs")
LR_SCHEDULES = ("constant", "linear", "warmup_linear")

OPTION_DOCS: dict[str, str] = {
    "epochs": "number of epochs; one epoch = strings_per_epoch fresh random words "
    "(lbfgs: iterations on one fixed batch)",
    "strings_per_epoch": "fresh training words drawn each epoch (lbfgs: the size of the one training batch)",
    "batch_size": "words per optimizer step (None = strings_per_epoch: one step per epoch; 1 = the papers' loop)",
    "train_length": "|w| of training words: an integer, or an inclusive range [lo, hi] drawn uniformly per word",
    "test_length": "|w| of test words: an integer or an inclusive range [lo, hi]",
    "test_strings": "fresh test words per evaluation",
    "eval_every": "evaluate on the test words every this many epochs (and after the last epoch); 0 = last only",
    "optimizer": "'adam' (the default) or 'lbfgs' (full batch, strong Wolfe line search; one run at a time)",
    "lr": "learning rate",
    "lr_schedule": "'constant', 'linear' (decays linearly to 0 over all steps) or 'warmup_linear' "
    "(linear warm-up over warmup_steps, then linear decay to 0)",
    "warmup_steps": "steps of linear warm-up (lr_schedule 'warmup_linear')",
    "grad_clip": "clip the gradient norm of each run to this (None = no clipping)",
    "dtype": "'float32' or 'float64'",
    "d_model": "residual width",
    "d_mlp": "FFN hidden width",
    "ln_eps": "layer-norm epsilon",
    "threads": "torch threads during training (None = leave as is)",
    "scaled": "attention scores times log n in every layer (the length-dependent scaling of Chiang & Cholak eq. 2)",
    "layer_norm": "'full' (layer norm where the preset puts it), 'scale_only' (no centering: ln_center=False) "
    "or 'none'",
    "positions": "positional features: 'paper' (the preset's own) or an alternative the preset offers",
    "num_classes": "number of classes of a classification preset (None: the task's default)",
}

# Options every preset accepted before presets had their own (older scripts pass them): a preset that
# does not use one accepts only this value, and run.json lists them all.
SHARED_OPTIONS: dict[str, Any] = {"scaled": False, "layer_norm": "full", "positions": "paper", "num_classes": None}

GENERIC_DEFAULTS: dict[str, Any] = {
    "batch_size": None,
    "eval_every": 10,
    "optimizer": "adam",
    "lr_schedule": "constant",
    "warmup_steps": 0,
    "grad_clip": None,
    "dtype": "float32",
    "ln_eps": 1e-5,
    "threads": None,
}

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

    def task_of(self, options: Options) -> tasks.Task:
        return tasks.get(self.task, **(self.task_params(options) if self.task_params else {}))

    def resolve(self, options: Options) -> Options:
        """Defaults overridden by options; unknown names and bad values raise."""
        allowed = set(OPTION_DOCS) | set(self.options)
        unknown = sorted(set(options) - allowed)
        if unknown:
            raise ExactLensError(
                f"unknown training options {unknown} for {self.name!r}; allowed: {', '.join(sorted(allowed))}"
            )
        resolved = {**GENERIC_DEFAULTS, **SHARED_OPTIONS, **self.defaults, **options}
        for key, value in SHARED_OPTIONS.items():
            if key not in self.options and resolved[key] != value:
                raise ExactLensError(
                    f"preset {self.name!r} has no option {key!r} (it accepts only {value!r}); its own options: "
                    f"{', '.join(sorted(self.options)) or 'none'}"
                )
        missing = sorted(n for n in ("epochs", "strings_per_epoch", "test_strings", "lr", "d_model", "d_mlp",
                                     "train_length", "test_length") if n not in resolved)
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
        return TrainSpec(self.name, self.paper, task, config, opts, self.metrics, self.prepare, self.masks,
                         self.penalty, self.null_fields, self.losses)


@dataclass(frozen=True)
class TrainSpec:
    """Everything the loop needs: resolved options, the task, the architecture and the hooks."""

    name: str
    paper: str | None
    task: tasks.Task
    config: ExactConfig
    options: Options
    metrics: tuple[Metric, ...] = ()
    prepare: Callable[[ExactTransformer, Options], None] | None = None
    masks: Callable[[ExactTransformer, Options], dict[str, torch.Tensor | bool]] | None = None
    penalty: Callable[[dict[str, torch.Tensor], Options], torch.Tensor] | None = None
    null_fields: tuple[str, ...] = ()
    losses: LossShortcut | None = None


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


def resolve_options(preset: Preset, options: Options) -> Options:
    return preset.resolve(options)


# ---- validation of the generic options -------------------------------------------------


MAX_COUNT = 10**9  # epochs, words, widths: beyond it a run would never finish (and indices overflow)


def positive_int(name: str, value: Any, minimum: int = 1) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or not minimum <= value <= MAX_COUNT:
        raise ExactLensError(f"{name} must be an integer in [{minimum}, {MAX_COUNT:.0e}], got {value!r:.80}")


def choice(name: str, value: Any, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ExactLensError(f"{name}={value!r} is not allowed; choose one of {', '.join(allowed)}")


def number(name: str, value: Any, minimum: float = 0.0, strict: bool = True) -> float:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or value < minimum or (strict and value == minimum):
        bound = f"> {minimum}" if strict else f">= {minimum}"
        raise ExactLensError(f"{name} must be a finite number {bound}, got {value!r}")
    return float(value)


def validate_generic(o: Options) -> None:
    for name in ("epochs", "strings_per_epoch", "test_strings", "d_model"):
        positive_int(name, o[name])
    for name in ("d_mlp", "eval_every", "warmup_steps"):
        positive_int(name, o[name], minimum=0)
    if o["batch_size"] is None:
        o["batch_size"] = o["strings_per_epoch"]
    positive_int("batch_size", o["batch_size"])
    if o["strings_per_epoch"] % o["batch_size"]:
        raise ExactLensError(
            f"batch_size={o['batch_size']} must divide strings_per_epoch={o['strings_per_epoch']} "
            "(an epoch is a whole number of steps)"
        )
    o["train_length"] = check_lengths(o["train_length"], "train_length")
    o["test_length"] = check_lengths(o["test_length"], "test_length")
    o["lr"] = number("lr", o["lr"])
    choice("optimizer", o["optimizer"], OPTIMIZERS)
    choice("lr_schedule", o["lr_schedule"], LR_SCHEDULES)
    if o["optimizer"] == "lbfgs" and o["batch_size"] != o["strings_per_epoch"]:
        raise ExactLensError("lbfgs trains on one full batch: leave batch_size at strings_per_epoch")
    if o["grad_clip"] is not None:
        o["grad_clip"] = number("grad_clip", o["grad_clip"])
    o["ln_eps"] = number("ln_eps", o["ln_eps"], strict=False)
    choice("dtype", o["dtype"], ("float32", "float64"))
    if o["threads"] is not None:
        positive_int("threads", o["threads"])


# ---- comparable models: the architecture of an exact solution, widened ----------------------

ARCHITECTURE_OPTIONS: dict[str, str] = {
    "scaled": "attention scores times log n in every layer (the length-dependent scaling of Chiang & Cholak eq. 2)",
    "layer_norm": "'full' (layer norm where the preset puts it), 'scale_only' (no centering: ln_center=False) "
    "or 'none'",
}
LAYER_NORMS = ("full", "scale_only", "none")


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

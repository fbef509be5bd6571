"""The generic training options, declared once: :class:`TrainOptions`.

Each field is an exactlens.requests option: its meaning (``help``), what it may be (``kind``: type, range,
choices) and its default. From it come ``exactlens train``'s flags (exactlens.verbs.train), the checks of
every training call (:func:`check_options`, run by ``Preset.resolve``) and the tables older code reads
(:data:`OPTION_DOCS`, :data:`GENERIC_DEFAULTS`, :data:`SHARED_OPTIONS`). A preset overrides the defaults
(``Preset.defaults``) and adds its own options; a field without a default is one every preset sets.

Light at import (no torch): the command line loads it to build its flags.
"""

from __future__ import annotations

import dataclasses
from dataclasses import MISSING, dataclass
from typing import Any

from exactlens.errors import ExactLensError
from exactlens.requests import Any_, Bool, Choice, DType, Float, Int, Kind, option
from exactlens.train.checkpoints import Schedule

__all__ = [
    "GENERIC_DEFAULTS", "LR_SCHEDULES", "OPTIMIZERS", "OPTION_DOCS", "PRESET_SETS", "SHARED_OPTIONS", "LengthRange",
    "OneOf", "TrainOptions", "check_options", "train_option_fields",
]

OPTIMIZERS = ("adam", "lbfgs")
LR_SCHEDULES = ("constant", "linear", "warmup_linear")
LAYER_NORM_CHOICES = ("full", "scale_only", "none", "post", "pre")
"""Every ``layer_norm`` choice, declared once; ``EVERY_LAYER`` of them only for models shaped like a construction
(exactlens.train.shaped), the rest for every preset (exactlens.train.presets.LAYER_NORMS)."""
EVERY_LAYER = ("post", "pre")  # that layer norm in every layer


@dataclass(frozen=True)
class LengthRange(Kind):
    """|w| of words: an integer, or an inclusive range (lo, hi) drawn uniformly per word (a 2-tuple or list
    in Python, 'LO:HI' on the command line); kept as (lo, hi)."""

    what: str = "an integer |w| >= 0 or an inclusive range (lo, hi) with 0 <= lo <= hi ('LO:HI' on the command line)"

    def check(self, name: str, value: Any) -> Any:
        if _is_count(value):
            value = (value, value)
        if not isinstance(value, (tuple, list)) or len(value) != 2 or not all(_is_count(v) for v in value):
            raise self.refuse(name, value)
        lo, hi = (int(v) for v in value)
        if lo < 0 or hi < lo:
            raise self.refuse(name, value)
        return lo, hi

    def cli_text(self, value: Any) -> str:
        lo, hi = value
        return str(lo) if lo == hi else f"{lo}:{hi}"

    def parse(self, name: str, text: str) -> Any:
        try:
            return self.check(name, tuple(int(v) for v in text.split(":")) if ":" in text else int(text))
        except ValueError:
            raise self.refuse(name, text) from None


@dataclass(frozen=True)
class OneOf(Choice):
    """A :class:`~exactlens.requests.Choice` whose refusal reads ``name='value' is not allowed; choose one of ...``
    (the message training options have always given)."""

    def refuse(self, name: str, value: Any, extra: str = "") -> ExactLensError:
        return ExactLensError(f"{name}={value!r} is not allowed; choose one of {', '.join(self.allowed())}")


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


PRESET_DECLARES = "preset_declares"


def _declared(default: Any, **how: Any) -> Any:
    """An option a preset uses only where it lists it among its own options (``Preset.options``); any other
    preset accepts only the default (older scripts pass these to every preset)."""
    f = option(default, **how)
    f.metadata = type(f.metadata)({**f.metadata, PRESET_DECLARES: True})
    return f


@dataclass(frozen=True, kw_only=True)
class TrainOptions:
    """Every preset's training options. Fields without a default: each preset sets them (``Preset.defaults``)."""

    epochs: int = option(kind=Int(1), help="number of epochs; one epoch = strings_per_epoch fresh random words "
                         "(lbfgs: iterations on one fixed batch)")
    strings_per_epoch: int = option(kind=Int(1), help="fresh training words drawn each epoch (lbfgs: the size of the "
                                    "one training batch)")
    batch_size: int | None = option(None, kind=Int(1), help="words per optimizer step (None = strings_per_epoch: one "
                                    "step per epoch; 1 = the papers' loop)")
    train_length: tuple = option(kind=LengthRange(), help="|w| of training words: an "
                                 "integer, or an inclusive range [lo, hi] drawn uniformly per word (LO:HI on the "
                                 "command line)")
    test_length: tuple = option(kind=LengthRange(), help="|w| of test words: an integer or "
                                "an inclusive range [lo, hi]")
    test_strings: int = option(kind=Int(1), help="fresh test words per evaluation")
    eval_every: int = option(10, kind=Int(0), help="evaluate on the test words every this many epochs (and after the "
                             "last epoch); 0 = last only")
    optimizer: str = option("adam", kind=OneOf(OPTIMIZERS), help="'adam' (the default) or 'lbfgs' (full batch, strong "
                            "Wolfe line search; one run at a time)")
    lr: float = option(kind=Float(0, open_lo=True), help="learning rate")
    lr_schedule: str = option("constant", kind=OneOf(LR_SCHEDULES), help="'constant', 'linear' (decays linearly to 0 "
                              "over all steps) or 'warmup_linear' (linear warm-up over warmup_steps, then linear "
                              "decay to 0)")
    warmup_steps: int = option(0, kind=Int(0), help="steps of linear warm-up (lr_schedule 'warmup_linear')")
    grad_clip: float | None = option(None, kind=Float(0, open_lo=True), help="clip the gradient norm of each run to "
                                     "this (None = no clipping)")
    dtype: str = option("float32", kind=DType(), help="'float32' or 'float64'")
    d_model: int = option(kind=Int(1), help="residual width")
    d_mlp: int = option(kind=Int(0), help="FFN hidden width")
    ln_eps: float = option(1e-5, kind=Float(0), help="layer-norm epsilon")
    threads: int | None = option(None, kind=Int(1), help="torch threads during training (None = leave as is)")
    checkpoint_every: int | None = option(None, kind=Int(1), metavar="K", help="keep the weights every K optimizer "
                                          "steps, step 0 and the last included, in OUT/checkpoints/ (exactlens "
                                          "timeline reads them; the disk they take is said before training)")
    checkpoints: str | None = option(None, kind=Schedule(), metavar="SCHEDULE", help="which steps to keep: 'log:N' "
                                     "(N steps evenly spaced in log step), 'every:K' or a comma list of steps; step 0 "
                                     "and the last always kept")
    siit: bool = option(False, kind=Bool(), help="strict interchange intervention training against the exact "
                        "construction the model is shaped like (docs/siit.md): IIT and strictness losses on top of the "
                        "task loss; run.json records the mapping and the held-out measurements")
    siit_map: Any = option(None, kind=Any_(), metavar="FILE", help="with --siit: a JSON file (Python: also a dict) "
                           "variable -> {\"hook\": blocks.L.hook_attn_out|hook_mlp_out, \"positions\": all|readout, "
                           "\"dims\": [...]}, replacing the mapping derived from the exact circuit")
    siit_iit_weight: float = option(1.0, kind=Float(0), help="with --siit: weight of the IIT loss (the task loss has "
                                    "weight 1)")
    siit_strict_weight: float = option(1.0, kind=Float(0), help="with --siit: weight of the strictness loss "
                                       "(resampled unmapped components must keep the base answer)")
    siit_iit_variables: int = option(1, kind=Int(0), help="with --siit: how many mapped variables the IIT loss "
                                     "swaps per step, each on its share of the step's pairs (0: all of them; "
                                     "docs/siit.md)")
    siit_pairs: int = option(64, kind=Int(1), help="with --siit: (base, source) pairs per step for each SIIT loss")
    siit_effective: float = option(0.0, kind=Float(0, 1), help="with --siit: the share of each variable's IIT pairs "
                                   "drawn from its effective ones (the exact model's answer changes under the swap; "
                                   "docs/siit.md); 0: pairs drawn at random")
    scaled: bool = _declared(False, kind=Bool(), help="attention scores times log n in every layer (the "
                             "length-dependent scaling of Chiang & Cholak eq. 2)")
    layer_norm: str = _declared("full", kind=OneOf(LAYER_NORM_CHOICES), help="'full' (layer norm where the preset "
                                "puts it), 'scale_only' (no centering: ln_center=False) or 'none'; a model shaped like "
                                "a construction also 'post' or 'pre' (that layer norm in every layer)")
    positions: str = _declared("paper", kind=OneOf(("paper", "first")), help="positional features: 'paper' (the "
                               "preset's own) or an alternative the preset offers")
    num_classes: int | None = _declared(None, kind=Int(2), help="number of classes of a classification preset (None: "
                                        "the task's default)")


def train_option_fields() -> list[dataclasses.Field]:
    """The fields of :class:`TrainOptions`, in declaration order."""
    return list(dataclasses.fields(TrainOptions))


def _has_default(f: dataclasses.Field) -> bool:
    return f.default is not MISSING


OPTION_DOCS: dict[str, str] = {f.name: f.metadata["option"].help for f in train_option_fields()}
"""Every generic option and its meaning."""

SHARED_OPTIONS: dict[str, Any] = {f.name: f.default for f in train_option_fields() if f.metadata.get(PRESET_DECLARES)}
"""Options every preset accepted before presets had their own (older scripts pass them): a preset that does not
list one among its own options accepts only this value, and run.json lists them all."""

GENERIC_DEFAULTS: dict[str, Any] = {
    f.name: f.default for f in train_option_fields() if _has_default(f) and f.name not in SHARED_OPTIONS
}
"""The defaults of the other options a preset may leave out."""

PRESET_SETS: tuple[str, ...] = tuple(f.name for f in train_option_fields() if not _has_default(f))
"""Options without a generic default: every preset sets them."""


def check_options(options: dict[str, Any]) -> None:
    """Check every generic option of resolved ``options`` by its kind, in place (lengths become (lo, hi),
    numbers float or int, a torch dtype its name); None only where the option's default is None."""
    for f in train_option_fields():
        value = options[f.name]
        if value is None and _has_default(f) and f.default is None:
            continue
        options[f.name] = f.metadata["option"].kind.check(f.name, value)

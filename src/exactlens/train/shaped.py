"""Train any construction's task in the construction's shape: ``exactlens train NAME`` for every name
of ``exactlens list`` that is not a paper preset.

The architecture is read off the built construction: layers, heads, attention masks, layer-norm
placement (per layer, with the final and selective norms), positional features (a learned table
keeps its n_ctx), length scaling of the scores, the FFN's residual wiring and biases, and the
readout position. What a construction sets by hand becomes trainable at a width of the user's
choice, and two things change because gradient descent needs them:

* hard attention (``average_hard``, ``unique_hard_left/right``) becomes softmax (hard argmax has no
  gradient); softmax-free attention (``none``, Shin & Matzinger) stays, it trains as it is;
* the FFN activation is ReLU in every layer (a construction's identity FFNs are linear maps it
  composes by hand; a trained model gets the standard nonlinearity);
* the readout is the task kind's standard one (a sigmoid logit for membership, logits for classes,
  per position for prediction and regression), read where the construction reads (e.g. the last
  position of a future-masked Dyck model, where [CLS] sees nothing else); a construction's own
  decision rule (e.g. Dyck's external check) is not carried over.

Every change is recorded in the config's metadata and in run.json (``shape``).

Widths (documented defaults): d_model = max(16, the construction's d_model), rounded up to a
multiple of the number of heads; d_mlp = 4 d_model where the construction has an FFN, else 0.
Training settings (and a task's own d_model, where one is registered) come from the task's
registered training defaults (papers and plug-ins register
them with :func:`exactlens.train.presets.register_task_defaults`), else GENERIC_TASK_DEFAULTS; with
``siit`` the construction's own ``siit_defaults`` (exactlens.constructions.registry.Construction) replace them,
as a paper preset's do.
"""

from __future__ import annotations

import math
from typing import Any

from exactlens import tasks
from exactlens.constructions import registry as constructions
from exactlens.errors import ExactLensError
from exactlens.model import ExactConfig
from exactlens.train.options import EVERY_LAYER, LAYER_NORM_CHOICES
from exactlens.train.registry import TASK_DEFAULTS, register_task_defaults  # noqa: F401 (re-exported)

HARD_WEIGHTINGS = ("average_hard", "unique_hard_left", "unique_hard_right")
MIN_WIDTH = 16
MLP_RATIO = 4

GENERIC_TASK_DEFAULTS: dict[str, Any] = {
    "epochs": 300,
    "strings_per_epoch": 512,
    "batch_size": 128,
    "test_strings": 1000,
    "lr": 3e-3,
    "lr_schedule": "warmup_linear",
    "warmup_steps": 50,
    "eval_every": 25,
    "grad_clip": 1.0,
    "train_length": (1, 16),
    "test_length": (1, 16),
}
"""Training settings of a task nobody registered defaults for (1200 Adam steps of 128 words)."""

SHAPED_OPTIONS: dict[str, str] = {
    "layer_norm": "'full' (the construction's layer norms: post, pre or none per layer), 'scale_only' (the same "
    "places without centering), 'none' (no layer norm), 'post' or 'pre' (that layer norm in every layer)",
    "params": "the construction's builder parameters, as a JSON object (e.g. {\"k\": 2, \"D\": 3} for dyck-k-D); "
    "they fix the task's parameters as they do for the construction",
}

def task_defaults(task: str) -> dict[str, Any]:
    """The registered training settings of a task over GENERIC_TASK_DEFAULTS."""
    return {**GENERIC_TASK_DEFAULTS, **TASK_DEFAULTS.get(task, {})}


def width_rule(exact: ExactConfig) -> tuple[int, int]:
    """Default (d_model, d_mlp) of a model shaped like a construction (module docstring)."""
    d_model = max(MIN_WIDTH, exact.d_model)
    d_model = math.ceil(d_model / exact.n_heads) * exact.n_heads
    return d_model, (MLP_RATIO * d_model if exact.d_mlp else 0)


def shaped_config(construction: constructions.Construction, task: tasks.Task, o: dict[str, Any]) -> ExactConfig:
    """The trainable config of a model of ``construction``'s task in its shape (module docstring)."""
    exact = construction.make(**o["params"]).cfg
    layers = exact.n_layers
    weighting = tuple("softmax" if w in HARD_WEIGHTINGS else w for w in exact.per_layer("attention_weighting"))
    if o["d_model"] % exact.n_heads:
        raise ExactLensError(
            f"{construction.name}: d_model={o['d_model']} must be a multiple of its {exact.n_heads} heads"
        )
    norms = exact.per_layer("normalization")
    if o["layer_norm"] in EVERY_LAYER:
        norms = (o["layer_norm"],) * layers
    elif o["layer_norm"] == "none":
        norms = ("none",) * layers
    replaced = {}
    if weighting != exact.per_layer("attention_weighting"):
        replaced["attention_weighting"] = {"construction": list(exact.per_layer("attention_weighting")),
                                           "trained": list(weighting)}
    if set(exact.per_layer("act_fn")) != {"relu"} and exact.d_mlp:
        replaced["act_fn"] = {"construction": list(exact.per_layer("act_fn")), "trained": ["relu"] * layers}
    if exact.readout != task.readout or exact.d_vocab_out != task.n_outputs or construction.decision_rule:
        replaced["readout"] = {
            "construction": {"readout": exact.readout, "d_vocab_out": exact.d_vocab_out,
                             "decision_rule": construction.decision_rule},
            "trained": {"readout": task.readout, "d_vocab_out": task.n_outputs, "decision_rule": None},
        }
    learned = exact.positional_features == ("learned",)
    config = ExactConfig(
        d_model=o["d_model"],
        n_layers=layers,
        n_heads=exact.n_heads,
        d_mlp=o["d_mlp"],
        d_vocab=len(task.vocab),
        vocab=task.vocab,
        d_vocab_out=task.n_outputs,
        attention_mask=_collapse(exact.per_layer("attention_mask")),
        attention_weighting=_collapse(weighting),
        attn_length_scale=exact.attn_length_scale,
        normalization=_collapse(tuple("none" if n == "none" else n for n in norms)),
        ln_final=exact.ln_final if o["layer_norm"] in ("full", "scale_only") else None,
        ln_select=exact.ln_select and "post" not in norms,
        ln_eps=o["ln_eps"],
        ln_center=o["layer_norm"] != "scale_only",
        act_fn="relu",
        mlp_bias=exact.mlp_bias,
        attn_bias=exact.attn_bias,
        mlp_residual=exact.mlp_residual,
        positional_features=exact.positional_features,
        n_ctx=exact.n_ctx if learned else None,
        readout=task.readout,
        readout_position=exact.readout_position,
        dtype=o["dtype"],
        model_name=f"trained-{construction.name}",
    )
    config.metadata["shape"] = {
        "construction": construction.name,
        "construction_params": dict(o["params"]),
        "construction_d_model": exact.d_model,
        "construction_d_mlp": exact.d_mlp,
        "replaced": replaced,
    }
    limit = exact.metadata.get("max_length")
    if limit is not None:
        config.metadata["max_length"] = limit
    return config


def _collapse(values: tuple[str, ...]) -> str | tuple[str, ...]:
    return values[0] if len(set(values)) == 1 else values


def shaped_preset_fields(name: str) -> dict[str, Any]:
    """The fields of the training preset (exactlens.train.presets.Preset) of construction ``name``'s
    task in its shape (module docstring)."""
    construction = constructions.get(name)
    exact = construction.make().cfg
    d_model, d_mlp = width_rule(exact)
    task = construction.task_of()
    # a task's registered settings may set d_model (then d_mlp follows the rule from it)
    defaults = {"d_model": d_model, **task_defaults(task.name), "d_mlp": d_mlp, "layer_norm": "full", "params": {}}
    _fit_lengths(construction, exact, defaults)

    def complete(o: dict[str, Any]) -> None:
        if not isinstance(o["params"], dict):
            raise ExactLensError(f"{name}: params must be a JSON object of builder parameters, got {o['params']!r}")
        construction.resolve(o["params"])  # unknown builder parameters fail here, naming the allowed ones
        if o["d_mlp"] == "auto":
            o["d_mlp"] = MLP_RATIO * o["d_model"] if exact.d_mlp and isinstance(o["d_model"], int) else 0

    def validate(o: dict[str, Any]) -> None:
        if o["layer_norm"] not in LAYER_NORM_CHOICES:
            raise ExactLensError(
                f"layer_norm={o['layer_norm']!r} is not allowed; choose one of {', '.join(LAYER_NORM_CHOICES)}"
            )
        built = construction.make(**o["params"])  # its limits: the construction's, the task's, a learned table's
        for key in ("train_length", "test_length"):
            for length in sorted(set(o[key])):
                construction.check_length(length, built)

    return dict(
        name=name,
        task=task.name,
        paper=f"shaped like {name} ({construction.paper})",
        summary=f"{task.name} ({task.kind}) in the shape of {name}: {exact.n_layers} layers x {exact.n_heads} "
        f"heads, softmax for hard attention",
        config=lambda t, o: shaped_config(construction, t, o),
        defaults={**defaults, "d_mlp": "auto" if d_mlp else 0},
        options=SHAPED_OPTIONS,
        task_params=lambda o: construction.task_params(construction.resolve(o.get("params", {})))
        if construction.task_params else {},
        validate=validate,
        complete=complete,
        siit_defaults=dict(construction.siit_defaults),
    )


def _fit_lengths(construction: constructions.Construction, exact: ExactConfig, defaults: dict[str, Any]) -> None:
    """Clip the default length ranges to what the construction is defined for (its own limits and
    a learned position table's), so that the default run is always valid."""
    lo_limit, hi_limit = construction.length_range()
    if exact.positional_features == ("learned",) and exact.n_ctx is not None:
        hi = exact.n_ctx - construction.task_of().n_specials
        hi_limit = hi if hi_limit is None else min(hi_limit, hi)
    for key in ("train_length", "test_length"):
        value = defaults[key]
        lo, hi = (value, value) if isinstance(value, int) else value
        lo = max(lo, lo_limit)
        hi = hi if hi_limit is None else min(hi, hi_limit)
        defaults[key] = (lo, max(lo, hi))

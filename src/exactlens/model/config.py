"""ExactConfig: every architectural switch of the one hooked model class.

The same dataclass describes a hand-built construction (post-LN with eps = 0,
length-dependent positions, log-n scaled or hard attention) and a trainable
model. It also carries the attribute names that TransformerLens utilities
(ActivationCache, patching) read from ``model.cfg``.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from typing import Any

import torch

from exactlens.dtypes import dtype_name
from exactlens.errors import ExactLensError
from exactlens.resources import check_memory

MASKS = ("none", "causal", "strict_causal", "past", "strict_past")
"""Attention masks: which key positions j a query at position i may see.

none: all j (encoder); causal: j <= i (future-masked); strict_causal: j < i;
past: j >= i (past-masked, Transformer Cookbook §2); strict_past: j > i.
A query that sees no key (position 0 under strict_causal) gets a zero output.
"""

WEIGHTINGS = ("softmax", "none", "average_hard", "unique_hard_left", "unique_hard_right")
"""How scores become weights. none: the scores themselves (Shin & Matzinger's
softmax-free bilinear attention); average_hard: uniform over the argmax set;
unique_hard_left/right: all weight on the leftmost/rightmost maximum."""

LENGTH_SCALES = ("none", "log_n", "log_visible")
"""Extra factor on the scores: log n with n the number of (unpadded) positions
(Chiang & Cholak eq. 2), or log of the number of keys the query can see."""

NORMALIZATIONS = ("none", "post", "pre")
ACTIVATIONS = ("relu", "gelu", "identity")
READOUTS = ("sigmoid", "per_position", "logits")
DTYPES = {"float32": torch.float32, "float64": torch.float64}


PER_LAYER_SWITCHES = ("attention_mask", "attention_weighting", "attn_length_scale", "act_fn", "normalization")
"""Switches that take one value for every layer or a tuple with one value per layer
(composed constructions mix, e.g., a future-masked uniform layer with a hard one, or a
pre-LN layer that computes a layer-norm hash with LN-free layers, Cookbook §5.3.3)."""


def _check_choice(name: str, value: Any, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ExactLensError(f"{name}={value!r} is not allowed; choose one of {', '.join(allowed)}")


def _check_per_layer(name: str, value: Any, allowed: tuple[str, ...], n_layers: int) -> Any:
    """A per-layer switch: one string, or a tuple of n_layers strings (a list is
    accepted and stored as a tuple; a tuple whose values agree stays a tuple)."""
    if isinstance(value, str):
        _check_choice(name, value, allowed)
        return value
    if not isinstance(value, (tuple, list)) or len(value) != n_layers:
        raise ExactLensError(
            f"{name} must be one of {', '.join(allowed)} or a tuple with one of them per layer "
            f"(n_layers={n_layers}), got {value!r}"
        )
    for layer, item in enumerate(value):
        _check_choice(f"{name}[{layer}]", item, allowed)
    return tuple(value)


@dataclass
class ExactConfig:
    """Switches of :class:`exactlens.model.ExactTransformer`.

    Positions are numbered from 0 and include the special tokens (CLS, EOS);
    ``n`` in positional features and in ``log_n`` is the number of positions
    of the (unpadded) sequence.
    """

    d_model: int
    n_layers: int
    d_vocab: int
    n_heads: int = 1
    d_head: int | None = None  # None -> d_model // n_heads
    d_mlp: int = 0  # 0 = no FFN sublayer
    d_vocab_out: int = 1  # readout size (1 for a sigmoid classifier)

    # attention_mask, attention_weighting, attn_length_scale and act_fn: one value
    # for all layers or a tuple with one per layer (read them with per_layer()).
    attention_mask: str | tuple[str, ...] = "none"
    attention_weighting: str | tuple[str, ...] = "softmax"
    attn_scale: float | None = None  # scores are divided by this; None -> sqrt(d_head)
    attn_length_scale: str | tuple[str, ...] = "none"
    hard_tie_tolerance: float = 0.0  # scores within this of the max count as tied

    # normalization: per layer too. ln_final: a layer norm before the unembedding; None = the
    # standard choice, present iff every layer is "pre" (read it as cfg.final_ln).
    normalization: str | tuple[str, ...] = "none"
    ln_final: bool | None = None
    # ln_select: every LN reads a linear map of its input, LN(x @ W_select) (Cookbook §5.3.3's
    # selective layer norm, pre-LN only; W_select starts as the identity).
    ln_select: bool = False
    ln_eps: float = 1e-5  # may be exactly 0 (Chiang & Cholak §4.2)
    ln_affine: bool = True  # learnable gain/bias (set to 1 and 0 by constructions)
    ln_center: bool = True  # False: scaling only, no projection (Brody et al.)
    ln_scale: bool = True  # False: projection (centering) only, no scaling (Brody et al. Table 2)

    act_fn: str | tuple[str, ...] = "relu"
    mlp_bias: bool = True
    attn_bias: bool = True
    # False: the FFN output replaces the stream, a = FFN(c), with no residual add and so
    # no post-LN after it (Shin & Matzinger §4: the prediction is the second linear layer's output).
    mlp_residual: bool = True

    # Positional encoding: either named features of (i, n), each mapped into the
    # residual stream by the rows of pos_embed.W_feat, or a learned table
    # pos_embed.W_pos of n_ctx rows (positional_features == ("learned",)).
    positional_features: tuple[str, ...] = ()
    n_ctx: int | None = None  # maximum positions; required for a learned table

    readout: str = "logits"
    readout_position: int = 0  # position read by the sigmoid readout (0 = CLS, -1 = last)

    residual_labels: tuple[str, ...] | None = None
    vocab: tuple[str, ...] | None = None  # token names, index = token id
    # The task the model answers ({"name", "kind", "params"}: exactlens.tasks.from_spec rebuilds it) and
    # the decision rule that reads its outputs (a registered name; None = the task kind's standard rule).
    task: dict[str, Any] | None = None
    decision_rule: str | None = None
    dtype: str = "float32"
    use_attn_result: bool = False  # compute per-head outputs for hook_result
    model_name: str = "exactlens"
    metadata: dict[str, Any] = field(default_factory=dict)  # construction parameters etc.

    def __post_init__(self) -> None:
        if isinstance(self.positional_features, list):
            self.positional_features = tuple(self.positional_features)
        if isinstance(self.residual_labels, list):
            self.residual_labels = tuple(self.residual_labels)
        if isinstance(self.vocab, list):
            self.vocab = tuple(self.vocab)
        for name in ("d_model", "n_layers", "d_vocab", "n_heads", "d_vocab_out"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ExactLensError(f"{name} must be a positive integer, got {value!r}")
        if self.d_head is None:
            if self.d_model % self.n_heads:
                raise ExactLensError(
                    f"d_head not given and d_model={self.d_model} is not divisible by n_heads={self.n_heads}"
                )
            self.d_head = self.d_model // self.n_heads
        if not isinstance(self.d_head, int) or self.d_head < 1:
            raise ExactLensError(f"d_head must be a positive integer, got {self.d_head!r}")
        if not isinstance(self.d_mlp, int) or isinstance(self.d_mlp, bool) or self.d_mlp < 0:
            raise ExactLensError(f"d_mlp must be an integer >= 0 (0 = no FFN), got {self.d_mlp!r}")
        if self.n_ctx is not None and (not isinstance(self.n_ctx, int) or isinstance(self.n_ctx, bool)):
            raise ExactLensError(f"n_ctx must be an integer or None, got {self.n_ctx!r}")
        self.dtype = dtype_name(self.dtype)  # a torch dtype is stored by its name
        # the sizes, before anything per layer (a tuple of n_layers switches) is built
        check_memory(model_bytes(self), f"a model with d_model={self.d_model}, d_mlp={self.d_mlp}, "
                     f"n_layers={self.n_layers}, n_heads={self.n_heads}, d_head={self.d_head}, "
                     f"d_vocab={self.d_vocab}, d_vocab_out={self.d_vocab_out} ({self.dtype})",
                     "lower the widths, layers or vocabulary in the config")
        allowed = {
            "attention_mask": MASKS,
            "attention_weighting": WEIGHTINGS,
            "attn_length_scale": LENGTH_SCALES,
            "act_fn": ACTIVATIONS,
            "normalization": NORMALIZATIONS,
        }
        for name in PER_LAYER_SWITCHES:
            setattr(self, name, _check_per_layer(name, getattr(self, name), allowed[name], self.n_layers))
        norms = set(self.per_layer("normalization"))
        if not (self.ln_center or self.ln_scale) and norms != {"none"}:
            raise ExactLensError(
                "ln_center=False and ln_scale=False leave nothing of layer norm; use normalization='none'"
            )
        if self.ln_final is not None and not isinstance(self.ln_final, bool):
            raise ExactLensError(f"ln_final must be True, False or None (auto), got {self.ln_final!r}")
        if self.ln_final and not (self.ln_center or self.ln_scale):
            raise ExactLensError("ln_final=True with ln_center=False and ln_scale=False leaves nothing of layer norm")
        if not isinstance(self.ln_select, bool):
            raise ExactLensError(f"ln_select must be True or False, got {self.ln_select!r}")
        if self.ln_select and "post" in norms:
            raise ExactLensError(
                "ln_select=True (LN(x @ W_select), Cookbook §5.3.3) is defined for pre-LN: a selector inside "
                "post-LN would rewrite the residual stream itself; allowed: normalization 'pre' or 'none' per layer"
            )
        _check_choice("readout", self.readout, READOUTS)
        if self.attn_scale is not None and not (self.attn_scale > 0 and math.isfinite(self.attn_scale)):
            raise ExactLensError(f"attn_scale must be a finite positive divisor or None, got {self.attn_scale!r}")
        if not isinstance(self.mlp_residual, bool):
            raise ExactLensError(f"mlp_residual must be True or False, got {self.mlp_residual!r}")
        for name in ("ln_eps", "hard_tie_tolerance"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
                    and value >= 0):
                raise ExactLensError(f"{name} must be a finite number >= 0, got {value!r}")
        if self.readout == "sigmoid" and self.d_vocab_out != 1:
            raise ExactLensError(f"a sigmoid readout has d_vocab_out=1, got {self.d_vocab_out}")
        if self.positional_features == ("learned",):
            if self.n_ctx is None or self.n_ctx < 1:
                raise ExactLensError("a learned positional table needs n_ctx >= 1")
        elif "learned" in self.positional_features:
            raise ExactLensError("'learned' cannot be combined with other positional features")
        else:
            from exactlens.model.positional import check_feature_names

            check_feature_names(self.positional_features)
        if self.residual_labels is not None and len(self.residual_labels) != self.d_model:
            raise ExactLensError(f"residual_labels has {len(self.residual_labels)} names but d_model={self.d_model}")
        if self.vocab is not None and len(self.vocab) != self.d_vocab:
            raise ExactLensError(f"vocab has {len(self.vocab)} tokens but d_vocab={self.d_vocab}")
        if self.task is not None:
            if not isinstance(self.task, dict) or not isinstance(self.task.get("name"), str):
                raise ExactLensError(
                    f"task must be None or a dict with a 'name' (exactlens task spec), got {self.task!r}"
                )
            unknown = sorted(set(self.task) - {"name", "kind", "params"})
            if unknown or not isinstance(self.task.get("params", {}), dict):
                raise ExactLensError(f"a task spec has the keys name, kind, params (a dict); got {self.task!r}")
        if self.decision_rule is not None and not isinstance(self.decision_rule, str):
            raise ExactLensError(f"decision_rule must be None or a registered rule name, got {self.decision_rule!r}")

    # ---- derived quantities -------------------------------------------------

    def per_layer(self, name: str) -> tuple[str, ...]:
        """A per-layer switch as a tuple with one value per layer."""
        if name not in PER_LAYER_SWITCHES:
            raise ExactLensError(f"{name!r} is not a per-layer switch; those are {', '.join(PER_LAYER_SWITCHES)}")
        value = getattr(self, name)
        return (value,) * self.n_layers if isinstance(value, str) else value

    def uniform(self, name: str) -> str | None:
        """The value shared by every layer, or None when layers differ."""
        values = set(self.per_layer(name))
        return values.pop() if len(values) == 1 else None

    @property
    def final_ln(self) -> bool:
        """A layer norm before the unembedding: ln_final, or (None) iff every layer is pre-LN."""
        return self.ln_final if self.ln_final is not None else self.uniform("normalization") == "pre"

    @property
    def standard_final_ln(self) -> bool:
        """The final LN is where a standard model has it (present iff every layer is pre-LN)."""
        return self.final_ln == (self.uniform("normalization") == "pre")

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    @property
    def learned_positions(self) -> bool:
        return self.positional_features == ("learned",)

    @property
    def scale_divisor(self) -> float:
        return float(self.attn_scale) if self.attn_scale is not None else math.sqrt(self.d_head)

    # ---- fields that TransformerLens utilities read from model.cfg ----------

    @property
    def normalization_type(self) -> str | None:
        """TransformerLens's name for the normalization.

        Post-LN reports None: TL's residual decompositions (decompose_resid,
        apply_ln_to_stack, logit attributions) assume that each block *adds*
        to an un-normalized stream, which is false when LN sits on the stream.
        """
        if self.uniform("normalization") == "pre" and self.ln_scale and self.standard_final_ln:
            return "LN" if self.ln_center else "RMS"
        return None

    @property
    def eps(self) -> float:
        return self.ln_eps

    @property
    def attn_only(self) -> bool:
        return self.d_mlp == 0

    @property
    def device(self) -> torch.device:
        return torch.device("cpu")

    @property
    def positional_embedding_type(self) -> str:
        return "standard"

    @property
    def original_architecture(self) -> str:
        return "exactlens"

    @property
    def default_prepend_bos(self) -> bool:
        return False

    @property
    def use_hook_mlp_in(self) -> bool:
        return False

    @property
    def use_split_qkv_input(self) -> bool:
        return False

    @property
    def use_attn_in(self) -> bool:
        return False

    @property
    def n_key_value_heads(self) -> None:
        return None

    @property
    def d_type(self) -> torch.dtype:
        return self.torch_dtype

    # ---- serialization -------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        for key in ("positional_features", "residual_labels", "vocab"):
            if data[key] is not None:
                data[key] = list(data[key])
        return data

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True, allow_nan=False)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ExactConfig:
        if not isinstance(data, dict):
            raise ExactLensError(f"a config must be a JSON object (dict) of fields, got {type(data).__name__}")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ExactLensError(f"unknown config fields {unknown}; known fields are {sorted(known)}")
        required = [
            f.name
            for f in dataclasses.fields(cls)
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        ]
        missing = [name for name in required if name not in data]
        if missing:
            raise ExactLensError(f"config is missing the required fields {missing}")
        return cls(**data)

    def replace(self, **changes: Any) -> ExactConfig:
        return dataclasses.replace(self, **changes)


# Python objects of one layer's modules (measured: ~45 kB of Python objects per Block, ~90 kB resident
# with its smallest tensors): a config with 10^8 tiny layers must be refused, not built.
LAYER_OVERHEAD_BYTES = 64 * 2**10


def model_bytes(cfg: ExactConfig) -> int:
    """Memory a model of ``cfg`` takes to build: its weights twice (built, then set) and the modules of
    every layer."""
    return 2 * parameter_bytes(cfg) + cfg.n_layers * LAYER_OVERHEAD_BYTES


def parameter_bytes(cfg: ExactConfig) -> int:
    """Bytes of the weights a config implies (checked before anything is allocated)."""
    m, h, d = cfg.d_model, cfg.n_heads, cfg.d_head
    positions = (cfg.n_ctx or 0) * m if cfg.learned_positions else 0
    per_layer = 4 * h * m * d + 3 * h * d + m + 2 * m * cfg.d_mlp + cfg.d_mlp + m + 4 * m
    count = cfg.d_vocab * m + positions + cfg.n_layers * per_layer + m * cfg.d_vocab_out + cfg.d_vocab_out + 2 * m
    return count * (torch.finfo(cfg.torch_dtype).bits // 8)

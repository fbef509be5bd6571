"""Paper presets: the architecture and training settings each paper states.

Every preset is a set of option defaults plus a function options -> ExactConfig. The
architecture of a "comparable" model is the exact solution's number of layers, heads
and fixed positional features, widened to the paper's training sizes.

- Chiang & Cholak 2022 §5.1: d_model 16, d_FFNN 64, post-LN with eps 1e-5, PyTorch's
  default initialization, Adam lr 3e-4, no dropout; Fig. 4: 100 fresh training strings
  per epoch, 100 test strings of length 1000, 1000 epochs. ``scaled``: attention
  logits times log n (§5.3, eq. 2), in every layer.
- Nowak et al. 2022 §4.2: the same sizes, LN eps 1e-1 (as the paper states), ONE's
  exact-solution positions (i/n, §3.1.1) or FIRST's (I[i=1]), fixed or variable lengths.
- Brody et al. 2023 §4.1 / App. E.1: MAJORITY, one layer, d = 8, 20 classes, |w| = 50,
  Adam lr 1e-3 with a linear schedule, batch 6000; layer norm full, scaling only (no
  projection: ln_center=False) or none. The paper's 584 parameters at d = 8 fit one
  attention layer without biases, no FFN and no positional encoding (20*8 embeddings +
  4*64 attention + 8*20 output + 8 LN); we keep that shape with pre-LN (LN before
  attention, where its projection acts on keys and queries), a [CLS] readout and LN
  gain and bias, so our count differs by a few parameters.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from exactlens.errors import ExactLensError
from exactlens.languages import get as get_language
from exactlens.model import ExactConfig

LAYER_NORMS = ("full", "scale_only", "none")

# Options every preset accepts, with their meaning (defaults come from the preset).
OPTION_DOCS: dict[str, str] = {
    "epochs": "number of epochs; one epoch = strings_per_epoch fresh random words",
    "strings_per_epoch": "fresh training words drawn each epoch",
    "batch_size": "words per optimizer step (None = strings_per_epoch: one Adam step per epoch; 1 = the papers' loop)",
    "train_length": "|w| of training words: an integer, or an inclusive range [lo, hi] drawn uniformly per word",
    "test_length": "|w| of test words: an integer or an inclusive range [lo, hi]",
    "test_strings": "fresh test words per evaluation",
    "eval_every": "evaluate on the test words every this many epochs (and after the last epoch); 0 = last only",
    "lr": "Adam learning rate",
    "lr_schedule": "'constant' or 'linear' (decays linearly to 0 over all steps)",
    "scaled": "attention logits times log n in every layer (Chiang & Cholak §5.3, eq. 2)",
    "dtype": "'float32' or 'float64'",
    "d_model": "residual width",
    "d_mlp": "FFN hidden width",
    "ln_eps": "layer-norm epsilon",
    "layer_norm": "'full' (post-LN), 'scale_only' (no projection: ln_center=False) or 'none'",
    "positions": "positional features: 'paper' (the exact solution's; none for MAJORITY) or, for ONE, 'first' "
    "(FIRST's I[i=1])",
    "num_classes": "MAJORITY: number of classes",
    "threads": "torch threads during training (None = leave as is)",
}


@dataclass(frozen=True)
class Preset:
    name: str
    language: str
    paper: str
    summary: str
    n_layers: int
    n_heads: int
    positions: dict[str, tuple[str, ...]]  # option value -> positional features
    defaults: dict[str, Any] = field(default_factory=dict)
    readout: str = "sigmoid"
    normalization: str = "post"  # where layer norm sits when layer_norm != "none"
    attn_bias: bool = True

    def language_of(self, options: dict[str, Any]):
        if self.language == "majority":
            from exactlens.languages.majority import Majority

            return Majority(num_classes=options["num_classes"])
        return get_language(self.language)

    def config(self, options: dict[str, Any]) -> ExactConfig:
        lang = self.language_of(options)
        if options["positions"] not in self.positions:
            raise ExactLensError(
                f"{self.name}: positions={options['positions']!r} is not allowed; choose one of "
                f"{', '.join(self.positions)}"
            )
        layer_norm = options["layer_norm"]
        if layer_norm not in LAYER_NORMS:
            raise ExactLensError(f"layer_norm={layer_norm!r} is not allowed; choose one of {', '.join(LAYER_NORMS)}")
        d_out = options["num_classes"] if self.readout == "logits" else 1
        return ExactConfig(
            d_model=options["d_model"],
            n_layers=self.n_layers,
            n_heads=self.n_heads,
            d_mlp=options["d_mlp"],
            d_vocab=len(lang.vocab),
            vocab=lang.vocab,
            d_vocab_out=d_out,
            positional_features=self.positions[options["positions"]],
            attention_mask="none",
            attention_weighting="softmax",
            attn_length_scale="log_n" if options["scaled"] else "none",
            normalization="none" if layer_norm == "none" else self.normalization,
            ln_eps=options["ln_eps"],
            ln_center=layer_norm != "scale_only",
            act_fn="relu",
            attn_bias=self.attn_bias,
            readout=self.readout,
            readout_position=0,
            dtype=options["dtype"],
            model_name=f"trained-{self.name}",
            metadata={"preset": self.name, "paper": self.paper},
        )


_COMMON = dict(
    batch_size=None,
    eval_every=10,
    lr_schedule="constant",
    scaled=False,
    dtype="float32",
    layer_norm="full",
    positions="paper",
    num_classes=None,
    threads=None,
)

# Chiang & Cholak §5.1 sizes and optimizer; Fig. 4 data.
_CHIANG = dict(
    _COMMON,
    epochs=1000,
    strings_per_epoch=100,
    test_strings=100,
    lr=3e-4,
    d_model=16,
    d_mlp=64,
    ln_eps=1e-5,
)

PRESETS: dict[str, Preset] = {
    "first": Preset(
        name="first",
        language="first",
        paper="Chiang & Cholak 2022, §5.1/§5.3, Fig. 4",
        summary="FIRST: 2 layers x 1 head, position feature I[i=1] (as the §3.3 solution)",
        n_layers=2,
        n_heads=1,
        positions={"paper": ("I[i=1]",)},
        defaults=dict(_CHIANG, train_length=100, test_length=1000),
    ),
    "parity": Preset(
        name="parity",
        language="parity",
        paper="Chiang & Cholak 2022, §5.1",
        summary="PARITY: 2 layers x 2 heads, position features i/n, cos(i*pi) (as the §3.2 solution)",
        n_layers=2,
        n_heads=2,
        positions={"paper": ("i/n", "cos(i*pi)")},
        defaults=dict(_CHIANG, train_length=100, test_length=100),
    ),
    "one": Preset(
        name="one",
        language="one",
        paper="Nowak et al. 2022, §4.2, Fig. 5",
        summary="ONE: 1 layer x 1 head, position feature i/n (§3.1.1) or FIRST's I[i=1]; fixed or variable lengths",
        n_layers=1,
        n_heads=1,
        positions={"paper": ("i/n",), "first": ("I[i=1]",)},
        defaults=dict(_CHIANG, ln_eps=1e-1, train_length=100, test_length=1000),
    ),
    "majority": Preset(
        name="majority",
        language="majority",
        paper="Brody et al. 2023, §4.1, App. E.1",
        summary="MAJORITY: 1 layer, d = 8, 20 classes, |w| = 50, logits at CLS; layer norm full / scale_only / none",
        n_layers=1,
        n_heads=1,
        positions={"paper": ()},  # majority ignores order: no positional encoding
        readout="logits",
        normalization="pre",  # LN before attention (Brody: LN's projection acts on the keys)
        attn_bias=False,
        defaults=dict(
            _COMMON,
            epochs=1000,
            strings_per_epoch=6000,
            test_strings=2000,
            lr=1e-3,
            lr_schedule="linear",
            d_model=8,
            d_mlp=0,
            ln_eps=1e-5,
            num_classes=20,
            train_length=50,
            test_length=50,
        ),
    ),
}


def get_preset(name: str) -> Preset:
    if name not in PRESETS:
        raise ExactLensError(f"unknown training task {name!r}; known: {', '.join(sorted(PRESETS))}")
    return PRESETS[name]


def resolve_options(preset: Preset, options: dict[str, Any]) -> dict[str, Any]:
    """Preset defaults overridden by options; unknown names and bad values raise."""
    unknown = sorted(set(options) - set(OPTION_DOCS))
    if unknown:
        raise ExactLensError(f"unknown training options {unknown}; allowed: {', '.join(sorted(OPTION_DOCS))}")
    resolved = dict(preset.defaults)
    resolved.update({k: v for k, v in options.items()})
    _validate(preset, resolved)
    return resolved


def _positive_int(name: str, value: Any, minimum: int = 1) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ExactLensError(f"{name} must be an integer >= {minimum}, got {value!r}")


def _validate(preset: Preset, o: dict[str, Any]) -> None:
    from exactlens.train.data import check_lengths

    for name in ("epochs", "strings_per_epoch", "test_strings", "d_model", "d_mlp"):
        _positive_int(name, o[name], minimum=0 if name == "d_mlp" else 1)
    _positive_int("eval_every", o["eval_every"], minimum=0)
    if o["batch_size"] is None:
        o["batch_size"] = o["strings_per_epoch"]
    _positive_int("batch_size", o["batch_size"])
    if o["strings_per_epoch"] % o["batch_size"]:
        raise ExactLensError(
            f"batch_size={o['batch_size']} must divide strings_per_epoch={o['strings_per_epoch']} "
            "(an epoch is a whole number of steps)"
        )
    o["train_length"] = check_lengths(o["train_length"], "train_length")
    o["test_length"] = check_lengths(o["test_length"], "test_length")
    if not (isinstance(o["lr"], (int, float)) and not isinstance(o["lr"], bool) and o["lr"] > 0):
        raise ExactLensError(f"lr must be a number > 0, got {o['lr']!r}")
    o["lr"] = float(o["lr"])
    if o["lr_schedule"] not in ("constant", "linear"):
        raise ExactLensError(f"lr_schedule={o['lr_schedule']!r} is not allowed; choose constant or linear")
    if not isinstance(o["scaled"], bool):
        raise ExactLensError(f"scaled must be true or false, got {o['scaled']!r}")
    if not (isinstance(o["ln_eps"], (int, float)) and o["ln_eps"] >= 0):
        raise ExactLensError(f"ln_eps must be a number >= 0, got {o['ln_eps']!r}")
    if o["threads"] is not None:
        _positive_int("threads", o["threads"])
    if preset.readout == "logits":
        _positive_int("num_classes", o["num_classes"], minimum=2)
    elif o["num_classes"] is not None:
        raise ExactLensError(f"num_classes applies to the majority task only, not {preset.name!r}")
    if preset.language == "majority" or preset.readout == "logits":
        if o["train_length"][0] < 1 or o["test_length"][0] < 1:
            raise ExactLensError("majority words need |w| >= 1 (the empty word has no majority)")

"""Chiang & Cholak (2022): exact transformers for PARITY and FIRST.

Notation: n = |w| + 1 is the number of positions (CLS at position 0), k the
number of 1s, c > 0 the attention constant. Every model reads its sigmoid
logit at CLS. Residual dimensions carry the paper's meanings as labels.
"""

from __future__ import annotations

import math

from exactlens.constructions.builder import LabelledModel, labelled_config
from exactlens.constructions.cookbook.layer_norm import append_confidence_layer, double_for_post_ln
from exactlens.errors import ExactLensError
from exactlens.model import ExactConfig, ExactTransformer
from exactlens.tasks import Parity

PARITY_LABELS = ("I[w_i=0]", "I[w_i=1]", "I[w_i=CLS]", "i/n", "cos(i*pi)", "k/n", "1/n", "I[i=k]/n", "s")
FIRST_LABELS = ("I[w_i=0]", "I[w_i=1]", "I[w_i=CLS]", "I[i=1]", "I[w_i=1 & i=1]", "s")
FLAWED_FIRST_LABELS = ("I[w_i=0]", "I[w_i=1]", "I[w_i=CLS]", "I[i=1]", "s")


def _check_c(c: float) -> float:
    if not (isinstance(c, (int, float)) and not isinstance(c, bool) and c > 0 and math.isfinite(c)):
        raise ExactLensError(f"the attention constant c must be a finite number > 0, got {c!r}")
    return float(c)


def _config(name: str, labels: tuple[str, ...], *, layers: int, heads: int, d_mlp: int, positions: tuple[str, ...],
            dtype: str, log_scaled: bool, params: dict) -> ExactConfig:
    return labelled_config(
        name, labels, Parity().vocab,  # ("0", "1", "[CLS]") for both languages
        layers=layers, heads=heads, d_mlp=d_mlp, positions=positions, dtype=dtype,
        metadata=dict(params, paper="Chiang & Cholak 2022"), attn_length_scale="log_n" if log_scaled else "none",
    )


def _word_embeddings(b: LabelledModel) -> None:
    b.embed_one_hot_tokens()


def parity(c: float = 1.0, dtype: str = "float32", log_scaled: bool = False) -> ExactTransformer:
    """§3.2, Prop. 1: two layers, two heads, d = 9, no layer norm.

    s = (-1)^(k+1) 2 tanh(c) / n^2 for even n (Appendix A gives odd n).
    """
    c = _check_c(c)
    d = len(PARITY_LABELS)
    b = LabelledModel(_config("parity", PARITY_LABELS, layers=2, heads=2, d_mlp=3,
                              positions=("i/n", "cos(i*pi)"), dtype=dtype, log_scaled=log_scaled, params={"c": c}))
    _word_embeddings(b)
    b.position("i/n", {"i/n": 1})
    b.position("cos(i*pi)", {"cos(i*pi)": 1})
    # Layer 1, head 1: uniform attention (W^Q = W^K = 0) averages I[w=1] -> k/n and I[CLS] -> 1/n.
    b.value(0, 0, {("k/n", "I[w_i=1]"): 1, ("1/n", "I[w_i=CLS]"): 1})
    b.value(0, 1, {})  # head 2 does nothing
    # FFN 1: h = relu(k/n - i/n + {-1, 0, +1}/n); 1, -2, 1 gives I[i=k]/n (Fig. 1).
    b.ffn(0, [{"i/n": -1, "k/n": 1, "1/n": -1}, {"i/n": -1, "k/n": 1}, {"i/n": -1, "k/n": 1, "1/n": 1}],
          {"I[i=k]/n": [1, -2, 1]})
    # Layer 2: CLS attends more to odd (head 1) / even (head 2) positions; both average I[i=k]/n.
    q = {"I[w_i=CLS]": c * math.sqrt(d)}
    b.query_key(1, 0, q, {"cos(i*pi)": -1})
    b.value(1, 0, {("s", "I[i=k]/n"): 1})
    b.query_key(1, 1, q, {"cos(i*pi)": 1})
    b.value(1, 1, {("s", "I[i=k]/n"): -1})
    b.readout({"s": 1})
    return b.model


def first(c: float = 1.0, dtype: str = "float32", log_scaled: bool = False) -> ExactTransformer:
    """§3.3: two layers, one head, d = 6. s = e^c/(e^c + n - 1) (I[w_1=1] - 1/2) (eq. 1)."""
    c = _check_c(c)
    d = len(FIRST_LABELS)
    b = LabelledModel(_config("first", FIRST_LABELS, layers=2, heads=1, d_mlp=1, positions=("I[i=1]",),
                              dtype=dtype, log_scaled=log_scaled, params={"c": c}))
    _word_embeddings(b)
    b.position("I[i=1]", {"I[i=1]": 1})
    b.value(0, 0, {})  # layer 1 attention does nothing
    # FFN 1 (bias-free, for §4): relu(-I[w=0] - I[CLS] + I[i=1]) = I[w_i=1 & i=1].
    b.ffn(0, [{"I[w_i=0]": -1, "I[w_i=CLS]": -1, "I[i=1]": 1}], {"I[w_i=1 & i=1]": [1]})
    b.query_key(1, 0, {"I[w_i=CLS]": c * math.sqrt(d)}, {"I[i=1]": 1})
    b.value(1, 0, {("s", "I[i=1]"): -0.5, ("s", "I[w_i=1 & i=1]"): 1})
    b.readout({"s": 1})
    return b.model


def first_flawed(c: float = 1.0, dtype: str = "float32") -> ExactTransformer:
    """§5.2: one layer; non-first values are not zeroed, so
    s = (e^c - 1)/(e^c + n - 1) (I[w_1=1] - 1/2) + (k - n/2)/(e^c + n - 1),
    correct on every string of length |w| = n - 1 iff c > log(n - 1)."""
    c = _check_c(c)
    d = len(FLAWED_FIRST_LABELS)
    b = LabelledModel(_config("first-flawed", FLAWED_FIRST_LABELS, layers=1, heads=1, d_mlp=1,
                              positions=("I[i=1]",), dtype=dtype, log_scaled=False, params={"c": c}))
    _word_embeddings(b)
    b.position("I[i=1]", {"I[i=1]": 1})
    b.query_key(0, 0, {"I[w_i=CLS]": c * math.sqrt(d)}, {"I[i=1]": 1})
    b.value(0, 0, {("s", "I[w_i=0]"): -0.5, ("s", "I[w_i=1]"): 0.5, ("s", "I[w_i=CLS]"): -0.5})
    b.readout({"s": 1})
    return b.model


def with_layer_norm(model: ExactTransformer, eps: float, name: str) -> ExactTransformer:
    """§4.1: [x; -x] residual with post-LN (gamma = 1, beta = 0)."""
    if not (isinstance(eps, (int, float)) and not isinstance(eps, bool) and eps >= 0 and math.isfinite(eps)):
        raise ExactLensError(f"layer-norm eps must be a finite number >= 0, got {eps!r}")
    out = double_for_post_ln(model, eps)
    out.cfg.model_name = name
    return out


def parity_ln(c: float = 1.0, eps: float = 0.0, dtype: str = "float32") -> ExactTransformer:
    return with_layer_norm(parity(c, dtype), eps, "parity-ln")


def first_ln(c: float = 1.0, eps: float = 0.0, dtype: str = "float32") -> ExactTransformer:
    return with_layer_norm(first(c, dtype), eps, "first-ln")


def parity_ln_eta(eta: float = 0.01, c: float = 1.0, dtype: str = "float32") -> ExactTransformer:
    """Prop. 2 on parity-ln (eps = 0): cross-entropy exactly eta bits per string."""
    out = append_confidence_layer(parity_ln(c, 0.0, dtype), eta)
    out.cfg.model_name = "parity-ln-eta"
    return out


def first_ln_eta(eta: float = 0.01, c: float = 1.0, dtype: str = "float32") -> ExactTransformer:
    out = append_confidence_layer(first_ln(c, 0.0, dtype), eta)
    out.cfg.model_name = "first-ln-eta"
    return out


def first_log(c: float = 1.0, dtype: str = "float32") -> ExactTransformer:
    """§5.3 / Prop. 3: the §3.3 model with eq. (2) attention (logits times log n);
    with c = 1, s = n/(2n - 1) (I[w_1=1] - 1/2), so 1/4 < |s| <= 1/2."""
    out = first(c, dtype, log_scaled=True)
    out.cfg.model_name = "first-log"
    return out


def first_log_ln(c: float = 1.0, eps: float = 1e-5, dtype: str = "float32") -> ExactTransformer:
    """Prop. 3 with layer norm: first-log with the §4.1 modification."""
    return with_layer_norm(first(c, dtype, log_scaled=True), eps, "first-log-ln")


def parity_closed_form(n: int, k: int, c: float) -> float:
    """The paper's logit s for PARITY (§3.2 for even n, Appendix A for odd n)."""
    if n % 2 == 0:
        return (-1) ** (k + 1) * 2 * math.tanh(c) / n**2
    z1 = (n - 1) / 2 * math.exp(c) + (n + 1) / 2 * math.exp(-c)
    z2 = (n + 1) / 2 * math.exp(c) + (n - 1) / 2 * math.exp(-c)
    return (math.exp((-1) ** (k + 1) * c) * z2 - math.exp((-1) ** k * c) * z1) / (n * z1 * z2)


def first_closed_form(n: int, first_is_one: bool, c: float) -> float:
    """Eq. (1)."""
    return math.exp(c) / (math.exp(c) + n - 1) * (float(first_is_one) - 0.5)


def first_flawed_closed_form(n: int, first_is_one: bool, k: int, c: float) -> float:
    """§5.2."""
    z = math.exp(c) + n - 1
    return (math.exp(c) - 1) / z * (float(first_is_one) - 0.5) + (k - n / 2) / z


def first_log_closed_form(n: int, first_is_one: bool, c: float = 1.0) -> float:
    """§5.3 with general c: CLS gives weight n^c/(n^c + n - 1) to position 1 (c = 1: n/(2n-1))."""
    weight = n**c / (n**c + n - 1)
    return weight * (float(first_is_one) - 0.5)

"""Layer-norm recipes (Transformer Cookbook §6).

§6.3 circumventing LN: ``pair_for_layer_norm`` compiles-then-doubles a model so every
quantity x travels as [x, -x] (label "-(x)"): the mean is 0, so post-LN only divides each
position by one scale s = rms. It reuses exactlens.constructions.layer_norm.double_for_post_ln
(Chiang & Cholak §4.1), which keeps cookbook programs' attn_scale = 1.

§6.4 amplification: with eps = 0, LN maps any nonzero vector to norm sqrt(d), so after
clipping every component to [-delta, delta] (an FFN, §4.1) a difference as small as delta
becomes +-1. ``amplify`` is that FFN as a layer of a post-LN program.
"""

from __future__ import annotations

from collections.abc import Sequence

from exactlens.constructions.cookbook import ffn
from exactlens.constructions.cookbook.program import Layer
from exactlens.constructions.layer_norm import double_for_post_ln
from exactlens.errors import ExactLensError
from exactlens.model import ExactTransformer


def negated_label(label: str) -> str:
    """The label of the negated copy, as double_for_post_ln names it."""
    return f"-({label})"


def pair_for_layer_norm(model: ExactTransformer, eps: float = 0.0) -> ExactTransformer:
    """§6.3: the model with residual [x; -x] and post-LN (gain 1, bias 0, given eps)."""
    if not eps >= 0:
        raise ExactLensError(f"eps must be >= 0, got {eps!r}")
    return double_for_post_ln(model, eps)


def amplify(labels: Sequence[str], delta: float) -> Layer:
    """§6.4: a layer whose FFN replaces every listed label by clip(x, -delta, delta). In a
    post-LN program with ln_eps = 0 whose residual is exactly ``labels`` in +- pairs (mean
    0), the next LN maps each component with |x| >= delta (after the attention LN) to
    +-sqrt(d / m), m = the number of nonzero components: differences are amplified."""
    if not labels:
        raise ExactLensError("amplify needs the labels of the whole residual stream")
    return Layer(ffns=(ffn.clip(labels, delta, name="amplify-clip"),))

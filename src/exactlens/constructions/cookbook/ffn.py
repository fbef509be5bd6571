"""Feed-forward recipes (Transformer Cookbook §4), each an FFN piece over caller-named labels.

Every piece *adds* to its output labels (the residual connection is always on); write to
a fresh label (zero before the layer) to get the function's value there, or combine with
``cancel_residual`` to overwrite a label in place (§4.2). Formulas are re-derived here
(the cookbook's displays were lost in our copy); the tests check them numerically.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Callable, Mapping, Sequence

import torch

from exactlens.constructions.cookbook.pieces import FFN
from exactlens.errors import ExactLensError


def _check_positive(name: str, value: float) -> float:
    if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
        raise ExactLensError(f"{name} must be a finite number > 0, got {value!r}")
    return float(value)


def join(*pieces: FFN, name: str = "ffn") -> FFN:
    """Several FFN pieces as one (hidden units side by side, outputs summed) — the
    parallel composition of §8.3 inside one sublayer."""
    if not pieces:
        raise ExactLensError("join needs at least one FFN piece")
    act = {p.activation for p in pieces} - {"identity"} or {"identity"}
    if len(act) > 1:
        raise ExactLensError(f"join: pieces use different activations {sorted(act)}")
    (activation,) = act
    pieces = tuple(p.with_activation(activation) for p in pieces)
    inputs: list[str] = []
    outputs: list[str] = []
    for p in pieces:
        inputs += [x for x in p.inputs if x not in inputs]
        outputs += [x for x in p.outputs if x not in outputs]
    hidden = sum(p.d_hidden for p in pieces)
    W_in = torch.zeros(len(inputs), hidden, dtype=torch.float64)
    W_out = torch.zeros(hidden, len(outputs), dtype=torch.float64)
    b_out = torch.zeros(len(outputs), dtype=torch.float64)
    start = 0
    for p in pieces:
        end = start + p.d_hidden
        W_in[[inputs.index(x) for x in p.inputs], start:end] = p.W_in
        W_out[start:end, [outputs.index(x) for x in p.outputs]] = p.W_out
        b_out[[outputs.index(x) for x in p.outputs]] += p.b_out
        start = end
    b_in = torch.cat([p.b_in for p in pieces])
    return FFN(tuple(inputs), W_in, b_in, tuple(outputs), W_out, b_out, activation, name)


# ----------------------------------------------------------------------------- §4.1-4.5


def cpwl(
    x: str,
    out: str,
    knots: Sequence[float],
    values: Sequence[float],
    left_slope: float,
    right_slope: float,
    name: str = "cpwl",
) -> FFN:
    """§4.1: the continuous piecewise-linear f with f(knots[k]) = values[k], slope
    left_slope before the first knot and right_slope after the last, in k+1 ReLUs:

        f(x) = f(t_1) - m_0 relu(t_1 - x) + m_1 relu(x - t_1) + sum_{k>=2} (m_k - m_{k-1}) relu(x - t_k)

    with m_k the slope of the piece right of knot t_k (m_0 = left_slope).
    """
    t = [float(v) for v in knots]
    f = [float(v) for v in values]
    if not t or len(t) != len(f):
        raise ExactLensError(f"cpwl needs >= 1 knot and one value per knot, got {len(t)} knots, {len(f)} values")
    if any(b <= a for a, b in zip(t, t[1:], strict=False)):
        raise ExactLensError(f"cpwl knots must increase strictly, got {t}")
    slopes = [float(left_slope)] + [(f[k + 1] - f[k]) / (t[k + 1] - t[k]) for k in range(len(t) - 1)]
    slopes.append(float(right_slope))
    hidden = [{x: -1.0}] + [{x: 1.0} for _ in t]
    b_in = [t[0]] + [-tk for tk in t]
    weights = [-slopes[0], slopes[1]] + [slopes[k + 1] - slopes[k] for k in range(1, len(t))]
    return FFN.build(hidden, {out: weights}, b_in=b_in, b_out={out: f[0]}, name=name)


def cancel_residual(labels: Sequence[str], name: str = "cancel") -> FFN:
    """§4.2: adds -x to each label (relu(x) - relu(-x) = x, written with weight -1), so
    joined with another piece f writing those labels, x + FFN(x) = f(x)."""
    hidden = [{label: s} for label in labels for s in (1.0, -1.0)]
    out = {label: [0.0] * len(hidden) for label in labels}
    for k, label in enumerate(labels):
        out[label][2 * k], out[label][2 * k + 1] = -1.0, 1.0
    return FFN.build(hidden, out, name=name)


def without_residual(piece: FFN) -> FFN:
    """§4.2: ``piece`` joined with the cancellation of its outputs: the sublayer then
    leaves f(x) in the outputs whatever they held before."""
    return join(piece, cancel_residual(piece.outputs), name=f"{piece.name}-no-residual")


def zero(name: str = "zero") -> FFN:
    """§4.3 with a residual connection: the FFN with no hidden units."""
    return FFN((), torch.zeros(0, 0), torch.zeros(0), (), torch.zeros(0, 0), torch.zeros(0), "relu", name)


def linear(weights: Mapping[str, float], out: str, bias: float = 0.0, name: str = "linear") -> FFN:
    """§4.3/§4.5: out += sum_l weights[l] x_l + bias with two ReLUs, u = relu(s) - relu(-s).
    identity = linear({"x": 1}, "y"); subtraction = linear({"x": 1, "y": -1}, "d")."""
    if not weights:
        raise ExactLensError("linear needs at least one input label")
    pos = dict(weights)
    neg = {k: -float(v) for k, v in weights.items()}
    return FFN.build([pos, neg], {out: [1.0, -1.0]}, b_in=[bias, -bias], name=name)


def identity(labels: Sequence[str], outputs: Sequence[str] | None = None, name: str = "identity") -> FFN:
    """§4.3 without a residual: copies each label to its output (eq. 22: stacked copies of eq. 21)."""
    outputs = list(outputs) if outputs is not None else list(labels)
    if len(outputs) != len(labels):
        raise ExactLensError(f"identity: {len(labels)} inputs but {len(outputs)} outputs")
    return join(*(linear({x: 1.0}, y) for x, y in zip(labels, outputs, strict=False)), name=name)


def minimum(x: str, y: str, out: str, name: str = "min") -> FFN:
    """§4.4: min(x, y) = x - relu(x - y) = relu(x) - relu(-x) - relu(x - y)."""
    return FFN.build([{x: 1.0}, {x: -1.0}, {x: 1.0, y: -1.0}], {out: [1.0, -1.0, -1.0]}, name=name)


def maximum(x: str, y: str, out: str, name: str = "max") -> FFN:
    """§4.4: max(x, y) = x + relu(y - x)."""
    return FFN.build([{x: 1.0}, {x: -1.0}, {y: 1.0, x: -1.0}], {out: [1.0, -1.0, 1.0]}, name=name)


# ----------------------------------------------------------------------------- §4.6 multiplication


INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)


def multiply(x: str, y: str, out: str, scale: float = 0.01, name: str = "multiply") -> FFN:
    """§4.6: xy from GELU's second-order Taylor term. g(t) = GELU(t) + GELU(-t) =
    t erf(t/sqrt 2) = sqrt(2/pi) t^2 (1 - t^2/6 + ...), so with s = x + y, d = x - y,

        xy ~ sqrt(pi/2) / (4 eps^2) * (g(eps s) - g(eps d))     (4 GELU units)

    exact as eps -> 0; see ``multiply_error_bounds`` for the error."""
    eps = _check_positive("scale", scale)
    c = math.sqrt(math.pi / 2.0) / (4.0 * eps * eps)
    hidden = [{x: eps, y: eps}, {x: -eps, y: -eps}, {x: eps, y: -eps}, {x: -eps, y: eps}]
    return FFN.build(hidden, {out: [c, c, -c, -c]}, activation="gelu", name=name)


@functools.cache
def _gelu_derivative_max(order: int) -> float:
    """max_x |GELU^(order)(x)| for order 3, 4 (closed forms, maximized on a fine grid)."""
    xs = torch.linspace(-12, 12, 480001, dtype=torch.float64)
    phi = torch.exp(-xs * xs / 2) * INV_SQRT_2PI
    if order == 3:  # GELU''' = phi(x) (x^3 - 4x)
        vals = phi * (xs**3 - 4 * xs)
    elif order == 4:  # GELU'''' = phi(x) (-x^4 + 7x^2 - 4)
        vals = phi * (-(xs**4) + 7 * xs**2 - 4)
    else:
        raise ExactLensError("order must be 3 or 4")
    return float(vals.abs().max())


def multiply_error_bounds(x: float, y: float, scale: float) -> dict[str, float]:
    """Bounds on |multiply(x, y) - xy| (exact arithmetic).

    lagrange3: the cookbook's route, GELU(t) = t/2 + t^2/sqrt(2 pi) + GELU'''(xi) t^3 / 6
      on each of the 4 units: sqrt(pi/2) M3 eps (|s|^3 + |d|^3) / 12.
    lagrange4: g = GELU(t) + GELU(-t) is even, so its remainder is g''''(xi) t^4 / 24 with
      |g''''| <= 2 M4: sqrt(pi/2) M4 eps^2 (s^4 + d^4) / 48.
    leading: the first neglected Taylor term, |eps^2 xy (x^2 + y^2) / 3| (not a bound).
    """
    eps = _check_positive("scale", scale)
    s, d = abs(x + y), abs(x - y)
    k = math.sqrt(math.pi / 2.0)
    return {
        "lagrange3": k * _gelu_derivative_max(3) * eps * (s**3 + d**3) / 12.0,
        "lagrange4": k * _gelu_derivative_max(4) * eps**2 * (s**4 + d**4) / 48.0,
        "leading": abs(eps**2 * x * y * (x * x + y * y) / 3.0),
    }


# ----------------------------------------------------------------------------- §4.7 comparisons


def greater_than(x: str, out: str, tolerance: float, name: str = "gt") -> FFN:
    """§4.7, fixed tolerance: [x > 0], exact for x <= 0 (-> 0) and x >= tolerance (-> 1);
    (relu(x) - relu(x - tol)) / tol. The gray region is 0 < x < tol."""
    tol = _check_positive("tolerance", tolerance)
    return FFN.build([{x: 1.0}, {x: 1.0}], {out: [1 / tol, -1 / tol]}, b_in=[0.0, -tol], name=name)


def greater_equal(x: str, out: str, tolerance: float, name: str = "ge") -> FFN:
    """§4.7: [x >= 0], exact for x >= 0 (-> 1) and x <= -tol (-> 0); gray -tol < x < 0."""
    tol = _check_positive("tolerance", tolerance)
    return FFN.build([{x: 1.0}, {x: 1.0}], {out: [1 / tol, -1 / tol]}, b_in=[tol, 0.0], name=name)


def equal_zero(x: str, out: str, tolerance: float, name: str = "eq") -> FFN:
    """§4.7: [x = 0], exact at x = 0 (-> 1) and |x| >= tol (-> 0): the hat
    (relu(x + tol) - 2 relu(x) + relu(x - tol)) / tol; gray 0 < |x| < tol."""
    tol = _check_positive("tolerance", tolerance)
    return FFN.build(
        [{x: 1.0}, {x: 1.0}, {x: 1.0}], {out: [1 / tol, -2 / tol, 1 / tol]}, b_in=[tol, 0.0, -tol], name=name
    )


def greater_than_by(x: str, tol: str, out: str, name: str = "gt-by") -> FFN:
    """§4.7, input-dependent tolerance held in label ``tol`` (e.g. 1/n): relu(x) - relu(x - tol)
    is tol for x >= tol and 0 for x <= 0 — "true" is the value tol, not 1."""
    return FFN.build([{x: 1.0}, {x: 1.0, tol: -1.0}], {out: [1.0, -1.0]}, name=name)


def greater_equal_by(x: str, tol: str, out: str, name: str = "ge-by") -> FFN:
    """relu(x + tol) - relu(x): tol for x >= 0, 0 for x <= -tol."""
    return FFN.build([{x: 1.0, tol: 1.0}, {x: 1.0}], {out: [1.0, -1.0]}, name=name)


def equal_zero_by(x: str, tol: str, out: str, name: str = "eq-by") -> FFN:
    """relu(x + tol) - 2 relu(x) + relu(x - tol): tol at x = 0, 0 for |x| >= tol."""
    return FFN.build([{x: 1.0, tol: 1.0}, {x: 1.0}, {x: 1.0, tol: -1.0}], {out: [1.0, -2.0, 1.0]}, name=name)


# ----------------------------------------------------------------------------- §4.8, §4.9


def boolean(
    fn: Callable[..., bool],
    inputs: Sequence[str],
    out: str,
    inputs_encoding: str = "pm1",
    output_encoding: str = "01",
    name: str = "boolean",
) -> FFN:
    """§4.8: any Boolean function of k bits in one FFN, one ReLU per satisfying assignment.
    For assignment a in {-1, 1}^k with fn(a) true, relu(a . x - (k - 1)) is 1 iff x = a (else
    a . x <= k - 2); the output sums them. inputs_encoding "pm1" (false=-1, true=1) or "01"
    (x = (b + 1)/2, folded into the weights); output_encoding "01" or "pm1" (2 sum - 1)."""
    k = len(inputs)
    if k == 0 or len(set(inputs)) != k:
        raise ExactLensError(f"boolean needs distinct input labels, got {list(inputs)}")
    if inputs_encoding not in ("pm1", "01") or output_encoding not in ("pm1", "01"):
        raise ExactLensError("encodings must be 'pm1' or '01'")
    hidden, b_in = [], []
    for bits in itertools.product((False, True), repeat=k):
        if not fn(*bits):
            continue
        a = [1.0 if b else -1.0 for b in bits]
        if inputs_encoding == "pm1":
            hidden.append(dict(zip(inputs, a, strict=False)))
            b_in.append(-(k - 1.0))
        else:  # a . (2x - 1) - (k - 1)
            hidden.append({label: 2 * ai for label, ai in zip(inputs, a, strict=False)})
            b_in.append(-sum(a) - (k - 1.0))
    scale, bias = (1.0, 0.0) if output_encoding == "01" else (2.0, -1.0)
    if not hidden:  # constant false
        return FFN.build([{label: 0.0 for label in inputs}], {out: [0.0]}, b_out={out: bias}, name=name)
    return FFN.build(hidden, {out: [scale] * len(hidden)}, b_in=b_in, b_out={out: bias}, name=name)


def conditional(cond: str, then: str, other: str, out: str, bound: float = 1.0, name: str = "if") -> FFN:
    """§4.9: out += (then if cond == 1 else other) for cond in {0, 1} and |then|, |other| <= B:
    relu(then - B + 2B cond) + relu(other + B - 2B cond) - B (two ReLUs)."""
    B = _check_positive("bound", bound)
    return FFN.build(
        [{then: 1.0, cond: 2 * B}, {other: 1.0, cond: -2 * B}],
        {out: [1.0, 1.0]},
        b_in=[-B, B],
        b_out={out: -B},
        name=name,
    )


def clip(labels: Sequence[str], bound: float, name: str = "clip") -> FFN:
    """Each label replaced by clip(x, -bound, bound) (cpwl + residual cancelled), for §6.4."""
    b = _check_positive("bound", bound)
    pieces = [cpwl(x, x, [-b, b], [-b, b], 0.0, 0.0, name=f"clip-{x}") for x in labels]
    return join(*pieces, cancel_residual(labels), name=name)

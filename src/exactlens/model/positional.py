"""Positional features: named scalar functions of (position i, length n).

Positions i = 0..n-1 count every token, CLS/EOS included; n is the number of
positions of the (unpadded) sequence. The positional encoding of a model is
``features(i, n) @ pos_embed.W_feat``: each named feature is one row of W_feat,
so a construction states, e.g., that feature "i/n" goes to residual dimension 4
(Chiang & Cholak §3.2) by setting that row to a unit vector.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import torch

from exactlens.errors import ExactLensError

FeatureFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
"""(i [1, pos], n [batch, 1]) -> values [batch, pos], both in the model dtype."""

_FEATURES: dict[str, FeatureFn] = {
    "1": lambda i, n: torch.ones_like(i * n),
    "i": lambda i, n: i + 0 * n,
    "n": lambda i, n: n + 0 * i,
    "i/n": lambda i, n: i / n,
    "1/n": lambda i, n: 1 / n + 0 * i,
    "i/(n-1)": lambda i, n: i / torch.clamp(n - 1, min=1),
    "n-1-i": lambda i, n: n - 1 - i,
    "(n-1-i)/n": lambda i, n: (n - 1 - i) / n,
    "i^2": lambda i, n: i * i + 0 * n,
    "(i/n)^2": lambda i, n: (i / n) ** 2,
    "1/(i+1)": lambda i, n: 1 / (i + 1) + 0 * n,
    "1/(i+1)^2": lambda i, n: 1 / (i + 1) ** 2 + 0 * n,
    "cos(i*pi)": lambda i, n: (1 - 2 * torch.remainder(i, 2)) + 0 * n,  # exact (-1)^i
    "I[i=0]": lambda i, n: (i == 0).to(i.dtype) + 0 * n,
    "I[i=1]": lambda i, n: (i == 1).to(i.dtype) + 0 * n,
    "I[i=n-1]": lambda i, n: (i == n - 1).to(i.dtype),
    "I[i<n/2]": lambda i, n: (2 * i < n).to(i.dtype),
    "I[i>=n/2]": lambda i, n: (2 * i >= n).to(i.dtype),
    # Nowak et al. §3.2.1: markers of the left and right halves; both hold at the centre of odd n.
    "I[i<=(n-1)/2]": lambda i, n: (2 * i <= n - 1).to(i.dtype),
    "I[i>=(n-1)/2]": lambda i, n: (2 * i >= n - 1).to(i.dtype),
}

_SINUSOID = re.compile(r"^(sin|cos)\[(\d+)/(\d+)\]$")
"""sin[j/D], cos[j/D]: Vaswani et al.'s sinusoid of pair j in a D-dim encoding,
sin(i / 10000^(2j/D)) (resp. cos)."""


def sinusoidal_features(d: int) -> tuple[str, ...]:
    """Names of the standard d-dimensional sinusoidal encoding, in the usual order."""
    if d < 2 or d % 2:
        raise ExactLensError(f"a sinusoidal encoding needs an even dimension >= 2, got {d}")
    names: list[str] = []
    for j in range(d // 2):
        names += [f"sin[{j}/{d}]", f"cos[{j}/{d}]"]
    return tuple(names)


def register_position_feature(name: str, fn: FeatureFn) -> None:
    """Add a named feature (i [1, pos], n [batch, 1]) -> [batch, pos].

    A model whose config names it can only be loaded after it is registered again.
    """
    if name in _FEATURES or _SINUSOID.match(name):
        raise ExactLensError(f"positional feature {name!r} already exists")
    _FEATURES[name] = fn


def known_features() -> tuple[str, ...]:
    return tuple(_FEATURES) + ("sin[j/D]", "cos[j/D]", "learned")


def _lookup(name: str) -> FeatureFn:
    if name in _FEATURES:
        return _FEATURES[name]
    match = _SINUSOID.match(name)
    if match:
        kind, j, d = match.group(1), int(match.group(2)), int(match.group(3))
        if d < 2 or 2 * j >= d:
            raise ExactLensError(f"sinusoid {name!r} needs 0 <= 2j < D")
        trig = torch.sin if kind == "sin" else torch.cos
        rate = 1.0 / (10000.0 ** (2 * j / d))
        return lambda i, n: trig(i * rate) + 0 * n
    raise ExactLensError(
        f"unknown positional feature {name!r}; known: {', '.join(known_features())} "
        "(or register one with exactlens.model.positional.register_position_feature)"
    )


def check_feature_names(names: tuple[str, ...]) -> None:
    if len(set(names)) != len(names):
        raise ExactLensError(f"positional features repeat a name: {list(names)}")
    for name in names:
        _lookup(name)


def evaluate_features(
    names: tuple[str, ...], n_pos: int, n_positions: torch.Tensor, dtype: torch.dtype
) -> torch.Tensor:
    """Features [batch, pos, n_features] for sequences padded to n_pos positions.

    n_positions [batch]: the number of real positions of each sequence (the n of
    its features). Padded positions get whatever the formula gives; attention
    never reads them and outputs there are meaningless.
    """
    i = torch.arange(n_pos, dtype=dtype, device=n_positions.device).unsqueeze(0)
    n = n_positions.to(dtype).unsqueeze(1)
    columns = [_lookup(name)(i, n).expand(n_positions.shape[0], n_pos) for name in names]
    if not columns:
        return torch.zeros(n_positions.shape[0], n_pos, 0, dtype=dtype, device=n_positions.device)
    return torch.stack(columns, dim=-1)

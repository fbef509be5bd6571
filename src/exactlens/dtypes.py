"""The floating-point types exactlens computes in, named as its JSON and CLI name them.

Every ``dtype=`` argument takes the name ("float32", "float64") or the torch dtype (torch.float32,
torch.float64; ``torch.float`` and ``torch.double`` are the same objects), as TransformerLens does;
:func:`dtype_name` turns either into the name. Light: torch is not imported here (a torch dtype can
only be passed once torch is imported).
"""

from __future__ import annotations

import sys
from typing import Any

from exactlens.errors import ExactLensError

DTYPE_NAMES = ("float32", "float64")


def dtype_name(value: Any, what: str = "dtype") -> str:
    """``"float32"`` or ``"float64"`` for the name or the torch dtype; anything else is an
    ExactLensError naming what is allowed (``what``: the argument's name in the message)."""
    if isinstance(value, str):
        if value in DTYPE_NAMES:
            return value
    else:
        torch = sys.modules.get("torch")
        if torch is not None and isinstance(value, torch.dtype):
            name = str(value).removeprefix("torch.")
            if name in DTYPE_NAMES:
                return name
    raise ExactLensError(f"{what}={value!r} is not allowed; choose one of float32, float64 "
                         "(the name or torch.float32, torch.float64)")

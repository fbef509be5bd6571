"""Strict JSON: every result exactlens writes or prints goes through here (no NaN, no infinity)."""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
import torch


def jsonable(obj: Any) -> Any:
    """NaN and infinities -> None, numpy and torch values -> Python numbers and lists, tuples -> lists,
    dict keys -> strings; other objects -> their str()."""
    if isinstance(obj, bool) or obj is None or isinstance(obj, str):
        return obj
    if isinstance(obj, (float, np.floating)):
        return float(obj) if math.isfinite(obj) else None
    if isinstance(obj, (int, np.integer)):
        return int(obj)
    if isinstance(obj, np.bool_):
        return bool(obj)
    if isinstance(obj, dict):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    if isinstance(obj, (torch.Tensor, np.ndarray)):
        return jsonable(obj.tolist())
    return str(obj)


def dumps(obj: Any, **kwargs: Any) -> str:
    """json.dumps of jsonable(obj), refusing anything that is not strict JSON."""
    return json.dumps(jsonable(obj), allow_nan=False, **kwargs)

"""Strict JSON: every result exactlens writes or prints goes through here (no NaN, no infinity)."""

from __future__ import annotations

import json
import math
import sys
from typing import Any


def _array_types() -> tuple[tuple[type, ...], tuple[type, ...], tuple[type, ...], tuple[type, ...]]:
    """(float, int, bool, array) types of numpy and torch, of those already imported: a value can only be
    a numpy or torch object once its module is loaded, so this module never imports them itself (the
    command line answers ``list`` without them)."""
    np, torch = sys.modules.get("numpy"), sys.modules.get("torch")
    floats, ints, bools, arrays = (), (), (), ()
    if np is not None:
        floats, ints, bools, arrays = (np.floating,), (np.integer,), (np.bool_,), (np.ndarray,)
    if torch is not None:
        arrays += (torch.Tensor,)
    return floats, ints, bools, arrays


def jsonable(obj: Any) -> Any:
    """NaN and infinities -> None, numpy and torch values -> Python numbers and lists, tuples -> lists,
    dict keys -> strings; other objects -> their str()."""
    return _jsonable(obj, _array_types())


def _jsonable(obj: Any, types: tuple[tuple[type, ...], ...]) -> Any:
    floats, ints, bools, arrays = types
    if isinstance(obj, bool) or obj is None or isinstance(obj, str):
        return obj
    if isinstance(obj, (float, *floats)):
        return float(obj) if math.isfinite(obj) else None
    if isinstance(obj, (int, *ints)):
        return int(obj)
    if isinstance(obj, bools):
        return bool(obj)
    if isinstance(obj, dict):
        return {str(k): _jsonable(v, types) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v, types) for v in obj]
    if isinstance(obj, arrays):
        return _jsonable(obj.tolist(), types)
    return str(obj)


def dumps(obj: Any, **kwargs: Any) -> str:
    """json.dumps of jsonable(obj), refusing anything that is not strict JSON."""
    return json.dumps(jsonable(obj), allow_nan=False, **kwargs)


def _no_constant(token: str) -> Any:
    raise ValueError(f"{token} is not strict JSON")


def loads(text: str | bytes, what: str, strict: bool = True) -> Any:
    """Strict ``json.loads`` whose every failure is one ExactLensError naming ``what``: text that is not
    UTF-8, not JSON, NaN or Infinity (``strict=False``: read as floats, for files others write), or nested too
    deep for Python to read."""
    from exactlens.errors import ExactLensError

    try:
        if isinstance(text, bytes):
            text = text.decode("utf-8")
        return json.loads(text, parse_constant=_no_constant if strict else None)
    except UnicodeDecodeError:
        raise ExactLensError(f"{what} is not UTF-8 text") from None
    except RecursionError:
        raise ExactLensError(f"{what} is JSON nested too deeply to read") from None
    except ValueError as err:
        raise ExactLensError(f"{what} is not JSON ({str(err).splitlines()[0] if str(err) else err!r})") from None


def read_json(path: Any, what: str | None = None, strict: bool = True) -> Any:
    """A JSON file, strictly (``loads``); an unreadable file is one ExactLensError naming it."""
    from exactlens.errors import ExactLensError

    name = what or str(path)
    try:
        with open(path, "rb") as handle:
            raw = handle.read()
    except OSError as err:
        raise ExactLensError(f"{name} cannot be read ({err.strerror or err})") from None
    return loads(raw, name, strict)

"""Devices: where models and data are computed (``--device`` / ``device=``).

``resolve_device(name)`` turns a name into a ``torch.device``: ``"cpu"``, ``"cuda"`` (or
``"cuda:N"``), ``"mps"``, or ``"auto"`` (CUDA if present, else MPS if present, else the CPU);
``None`` is the CPU (what every function did before devices existed). A device that is not on this
machine is an ExactLensError naming the ones that are.

Everything random is drawn on the CPU from CPU generators (initial weights, training and test
words), then moved: a run on another device sees the same words and starts from the same weights,
so float64 results agree to float64 rounding and float32 results to float32 rounding.
"""

from __future__ import annotations

from typing import Any

from exactlens.errors import ExactLensError

DEVICE_NAMES = ("cpu", "cuda", "mps", "auto")


def available_devices() -> list[str]:
    """The device names this machine offers (``cpu`` always; ``cuda:N`` per GPU; ``mps``)."""
    import torch

    names = ["cpu"]
    if torch.cuda.is_available():
        names += [f"cuda:{i}" for i in range(torch.cuda.device_count())]
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        names.append("mps")
    return names


def resolve_device(name: Any = None, dtype: str | None = None) -> Any:
    """``name`` (a string, a torch.device or None) -> a torch.device that exists on this machine.
    ``dtype`` ("float32"/"float64" or the torch dtype): MPS has no float64, so "auto" then skips it and "mps" is
    refused."""
    from exactlens.dtypes import dtype_name

    dtype = None if dtype is None else dtype_name(dtype)
    device = _resolve(name, float64=dtype == "float64")
    if device.type == "mps" and dtype == "float64":
        raise ExactLensError("device 'mps' has no float64; use --dtype float32 there, or --device cpu for float64")
    return device


def _resolve(name: Any, float64: bool) -> Any:
    import torch

    if name is None:
        return torch.device("cpu")
    if isinstance(name, torch.device):
        text = str(name)
    elif isinstance(name, str):
        text = name.strip().lower()
    else:
        raise ExactLensError(f"device must be one of {', '.join(DEVICE_NAMES)} (or cuda:N), got {name!r}")
    available = available_devices()
    if text == "auto":
        if any(n.startswith("cuda") for n in available):
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("mps" if "mps" in available and not float64 else "cpu")
    kind, _, index = text.partition(":")
    if kind not in ("cpu", "cuda", "mps") or (index and not (kind == "cuda" and index.isdigit())):
        raise ExactLensError(f"unknown device {name!r}; choose one of {', '.join(DEVICE_NAMES)} (or cuda:N)")
    if kind == "cpu":
        return torch.device("cpu")
    if kind == "mps":
        if "mps" not in available:
            raise ExactLensError(f"device 'mps' is not available on this machine; available: {', '.join(available)}")
        return torch.device("mps")
    cudas = [n for n in available if n.startswith("cuda")]
    if index:
        device = torch.device("cuda", int(index))
    else:  # plain "cuda": the current CUDA device
        device = torch.device("cuda", torch.cuda.current_device() if cudas else 0)
    if f"cuda:{device.index}" not in cudas:
        why = "no such CUDA device" if cudas else "no CUDA device, or a torch built without CUDA"
        raise ExactLensError(f"device {name!r} is not available on this machine ({why}); "
                             f"available: {', '.join(available)}")
    return device


def device_of(model: Any) -> Any:
    """The device of a model's parameters (the CPU for a model without any)."""
    import torch

    for parameter in getattr(model, "parameters", tuple)():
        return parameter.device
    return torch.device("cpu")


def device_name(device: Any) -> str:
    """How results record a device: "cpu", "cuda:0", "mps"."""
    text = str(device)
    return "cuda:0" if text == "cuda" else text

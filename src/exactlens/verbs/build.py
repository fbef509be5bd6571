"""``el.build(NAME, dtype=..., device=..., **params)``: a construction as an ExactTransformer (the API only)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from exactlens.requests import DType, Pairs, Text, device_option, option
from exactlens.verbs import VerbSpec, register_verb


@dataclass(frozen=True)
class BuildRequest:
    name: str = option(help="a construction name (see `exactlens list`)", kind=Text(), positional=True)
    dtype: str = option("float32", kind=DType(), help="float32 or float64 (a name or the torch dtype)",
                        api_positional=True)
    device: Any = device_option(api_positional=True)
    params: dict = option({}, kind=Pairs(), extra=True, help="the construction's parameters")


def run(request: BuildRequest) -> Any:
    from exactlens.constructions import get

    return get(request.name).make(dtype=request.dtype, device=request.device, **request.params)


register_verb(VerbSpec("build", "the construction as an ExactTransformer", BuildRequest, run, cli=False, json=False))

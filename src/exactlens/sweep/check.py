"""A job's options checked before anything runs: with its verb's request (exactlens.requests.from_call, the
same check as ``el.VERB(...)``), and for ``train`` also with the preset (unknown training options, bad values).

A function registered with ``exactlens.api.register_api`` (no request class) is checked against its
signature."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from exactlens.errors import ExactLensError

__all__ = ["PARENT_OUTPUT", "check_job", "first_parameter", "parameters", "takes_seed"]

PARENT_OUTPUT = "<parent output>"  # what a `then` job's first argument is while its options are checked
SET_BY_SWEEP = ("out", "overwrite", "seed", "seeds")  # each job's directory and seed are the sweep's


def _spec(verb: str) -> Any:
    from exactlens.verbs import VERBS, load_core_verbs

    load_core_verbs()
    from exactlens.plugins import load_plugins

    load_plugins()
    return VERBS.get(verb)


def _api(verb: str) -> Callable[..., Any] | None:
    from exactlens.api import API

    try:
        return API[verb]
    except KeyError:
        return None


def parameters(verb: str) -> tuple[list[str], list[str], bool]:
    """The verb's positional parameters, its keyword ones, and whether it takes other keywords."""
    from exactlens.verbs import VerbSpec

    spec = _spec(verb)
    if isinstance(spec, VerbSpec):
        from exactlens.requests import api_parameters

        params, extra = api_parameters(spec.request)
        positional = [n for n, _, o in params if o.positional_in_api]
        return positional, [n for n, _, _ in params if n not in positional], extra is not None
    function = _api(verb)
    if function is None:
        return [], [], False
    sig = inspect.signature(function)
    positional = [n for n, p in sig.parameters.items()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    keyword = [n for n, p in sig.parameters.items() if p.kind == p.KEYWORD_ONLY]
    more = any(p.kind == p.VAR_KEYWORD for p in sig.parameters.values())
    return positional, keyword, more


def first_parameter(verb: str) -> str | None:
    positional = parameters(verb)[0]
    return positional[0] if positional else None


def takes_seed(verb: str) -> bool:
    positional, keyword, more = parameters(verb)
    return "seed" in positional + keyword


def takes_out(verb: str) -> bool:
    positional, keyword, _ = parameters(verb)
    return "out" in positional + keyword


def check_job(verb: str, options: dict[str, Any], chained: bool, at: Callable[[str], str], runs: int = 1) -> None:
    """Raise ExactLensError naming the spec's line (``at(key)``) where the job cannot run; ``runs``: how many
    seeds of a train job train together (its stack)."""
    from exactlens.verbs import VerbSpec

    spec = _spec(verb)
    if spec is None or _api(verb) is None:
        from exactlens.api import API

        raise ExactLensError(f"{at('verb')}: unknown verb {verb!r}; verbs: {', '.join(sorted(API))}")
    fixed = [k for k in options if k in SET_BY_SWEEP]
    if fixed:
        raise ExactLensError(f"{at(fixed[0])}: {fixed[0]!r} is set by the sweep (each job's directory and seed)")
    positional, keyword, more = parameters(verb)
    args: list[Any] = []
    if chained:
        if not positional:
            raise ExactLensError(f"{at('verb')}: {verb} takes no input, so it cannot follow another job (`then`)")
        if positional[0] in options:
            raise ExactLensError(f"{at(positional[0])}: {positional[0]!r} of a `then` job is its parent's output")
        args = [PARENT_OUTPUT]
    request = None
    try:
        if isinstance(spec, VerbSpec):
            from exactlens.requests import from_call

            request = from_call(verb, spec.request, args, options)
            params, name = getattr(request, "params", None), getattr(request, "name", None)
            if params and isinstance(name, str):  # a construction's parameters (the request's extra keywords)
                from exactlens.constructions import get

                get(name).resolve(params)
        else:
            unknown = [k for k in options if k not in positional + keyword and not more]
            if unknown:
                raise ExactLensError(f"el.{verb} has no option {unknown[0]!r}; its options: "
                                     f"{', '.join(positional + keyword)}")
            inspect.signature(_api(verb)).bind(*args, **options)
        _check_cost(verb, options, request, runs)
    except ExactLensError as err:
        key = next((k for k in options if repr(k) in str(err) or f"{k}=" in str(err) or f"{k} " in str(err)), "verb")
        raise ExactLensError(f"{at(key)}: {err}") from None
    except TypeError as err:
        raise ExactLensError(f"{at('verb')}: {verb}: {err}") from None


def _check_cost(verb: str, options: dict[str, Any], request: Any, runs: int) -> None:
    """The verb's own estimate of the job's work and memory, as the verb asks it when it runs: training's
    (exactlens.train.budget, its stack's seeds together) and the timeline's long lengths."""
    if verb == "train":
        _check_training(options, runs)
    if verb == "timeline" and getattr(request, "long_lengths", None):
        from exactlens.analysis.timeline.request import check_long_words

        for length in request.long_lengths:
            check_long_words(length, request.strings, 1)


def _check_training(options: dict[str, Any], runs: int) -> None:
    from exactlens.train.presets import get_preset

    name = options.get("name")
    if not isinstance(name, str):
        raise ExactLensError(f"train needs name = a preset or construction name, got {name!r}")
    from exactlens.train.budget import check_training

    own = {k: v for k, v in options.items() if k not in ("name", "device", "progress")}
    check_training(get_preset(name).spec(dict(own)), runs)  # the options, then the stack's work and memory

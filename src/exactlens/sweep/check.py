"""A job's options checked before anything runs: with its verb's request (exactlens.requests.from_call, the
same check as ``el.VERB(...)``), and for ``train`` also with the preset (unknown training options, bad values).
Verbs are found by name in the registry (exactlens.verb_registry), so the sweep engine imports no verb."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from exactlens.errors import ExactLensError
from exactlens.verb_registry import VERBS, VerbSpec, find_verb

__all__ = ["PARENT_OUTPUT", "check_job", "first_parameter", "parameters", "takes_seed", "verb_spec"]

PARENT_OUTPUT = "<parent output>"  # what a `then` job's first argument is while its options are checked
SET_BY_SWEEP = ("out", "overwrite", "seed", "seeds")  # each job's directory and seed are the sweep's


def verb_spec(verb: str) -> VerbSpec:
    """The verb a job names, with an API (its function is what the job runs); else an error listing them."""
    spec = find_verb(verb)
    if spec is None or not spec.api:
        names = sorted(n for n, v in VERBS.items() if v.api)
        raise ExactLensError(f"unknown verb {verb!r}; verbs: {', '.join(names)}")
    return spec


def parameters(verb: str) -> tuple[list[str], list[str], bool]:
    """The verb's positional parameters, its keyword ones, and whether it takes other keywords (none for a verb
    that is not registered)."""
    from exactlens.requests import api_parameters

    spec = find_verb(verb)
    if spec is None:
        return [], [], False
    params, extra = api_parameters(spec.request)
    positional = [n for n, _, o in params if o.positional_in_api]
    return positional, [n for n, _, _ in params if n not in positional], extra is not None


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
    try:
        spec = verb_spec(verb)
    except ExactLensError as err:
        raise ExactLensError(f"{at('verb')}: {err}") from None
    fixed = [k for k in options if k in SET_BY_SWEEP]
    if fixed:
        raise ExactLensError(f"{at(fixed[0])}: {fixed[0]!r} is set by the sweep (each job's directory and seed)")
    positional = parameters(verb)[0]
    args: list[Any] = []
    if chained:
        if not positional:
            raise ExactLensError(f"{at('verb')}: {verb} takes no input, so it cannot follow another job (`then`)")
        if positional[0] in options:
            raise ExactLensError(f"{at(positional[0])}: {positional[0]!r} of a `then` job is its parent's output")
        args = [PARENT_OUTPUT]
    request = None
    try:
        from exactlens.requests import from_call

        request = from_call(verb, spec.request, args, options)
        params, name = getattr(request, "params", None), getattr(request, "name", None)
        if params and isinstance(name, str):  # a construction's parameters (the request's extra keywords)
            from exactlens.constructions import get

            get(name).resolve(params)
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

"""Command-line verbs: the one way to add one (exactlens's own verbs and a plug-in's alike)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass

from exactlens.errors import ExactLensError
from exactlens.plugins import Registry


@dataclass(frozen=True)
class Verb:
    """``exactlens NAME ...``: ``add_arguments`` fills the verb's parser, ``run`` does the work (it
    raises ExactLensError for bad input; with --json it prints one JSON object on stdout)."""

    name: str
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], None]
    description: str | None = None
    order: int = 500  # position in `exactlens --help`


VERBS: dict[str, Verb] = Registry("command-line verbs")


def register_verb(verb: Verb) -> Verb:
    if not isinstance(verb, Verb):
        raise ExactLensError(f"register_verb takes a Verb, got {type(verb).__name__}")
    if VERBS.peek(verb.name) not in (None, verb):
        raise ExactLensError(f"a command-line verb named {verb.name!r} is already registered")
    VERBS[verb.name] = verb
    return verb

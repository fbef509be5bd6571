"""Verbs: the core's verb modules, ``exactlens.verbs.<verb>``, one verb whole each (its request, its work,
its result's views). ``exactlens.verbs.register_verb`` and ``VerbSpec`` are the public names a plug-in
declares its verbs with; they live in the bottom layer, exactlens.verb_registry, where the command line,
the API and the sweep engine find every verb by name."""

from __future__ import annotations

from exactlens.verb_registry import (
    CORE_VERBS,
    VERBS,
    VerbSpec,
    find_verb,
    load_core_verbs,
    messages_on,
    register_verb,
    tell,
)

__all__ = ["CORE_VERBS", "VERBS", "VerbSpec", "find_verb", "load_core_verbs", "messages_on", "register_verb", "tell"]

"""Command-line verbs (kept for plug-ins that import from here): verbs are declared in exactlens.verbs."""

from exactlens.verbs import VERBS, Verb, VerbSpec, register_verb

__all__ = ["VERBS", "Verb", "VerbSpec", "register_verb"]

"""The earlier name of :mod:`exactlens.tasks` (formal languages are membership tasks); kept so that
``exactlens.languages.get("parity")`` and the names below keep working."""

from exactlens.tasks import (
    CLS,
    EOS,
    TASKS,
    Dyck,
    First,
    InductionFrequent,
    InductionRecent,
    Language,
    Majority,
    One,
    Palindrome,
    Parity,
    Task,
    TokenBatch,
    get,
    names,
    register,
)

LANGUAGES = TASKS

__all__ = [
    "CLS", "EOS", "LANGUAGES", "Dyck", "First", "InductionFrequent", "InductionRecent", "Language", "Majority",
    "One", "Palindrome", "Parity", "Task", "TokenBatch", "get", "names", "register",
]

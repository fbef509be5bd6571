"""What the command line prints: one JSON object on stdout (``emit``), progress on stderr.

Like every module the command line loads first, this one imports nothing heavy."""

from __future__ import annotations

import sys
from typing import Any

from exactlens.jsonio import dumps
from exactlens.progress import say as progress  # the verbs' name for the one progress message

__all__ = ["emit", "progress"]


def emit(obj: dict[str, Any], as_json: bool, text: str) -> None:
    """With --json exactly one strict JSON object on stdout; otherwise the text."""
    sys.stdout.write((dumps(obj) if as_json else text) + "\n")

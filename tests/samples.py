"""Helpers shared by test modules (importable as `samples`: tests/ is on sys.path under pytest)."""

from __future__ import annotations


def construction_sample() -> list[str]:
    """The constructions that tests looping over "every construction" cover: every hand-built one, and
    of the compiled RASP programs (tracr, ~5-20 s each to compile) one representative; the tracr tests
    (tests/interop) cover the others."""
    from exactlens import constructions

    names = constructions.names()
    imported = [n for n in names if "tracr" in constructions.get(n).tags]
    return [n for n in names if n not in imported] + [n for n in imported if n == "tracr-hist"]

"""Measured numbers against their goals, machine-readable: what ``make bench`` gathers into one table.

Every ``bench_*.py`` script keeps printing its own tables and, besides, records each headline number
with ``Goals.add(name, measured, unit, goal)``: ``goal`` is a comparison such as ``">= 1.0"`` or
``"< 60"`` (None: no goal, shown for reference). With ``--results PATH`` the script writes them as
one strict JSON object (exactlens.jsonio, through exactlens.outputs: an existing file is replaced
only with ``--overwrite``)::

    {"script": "bench_hull.py", "quick": false,
     "results": [{"name": ..., "measured": 47.6, "unit": "x", "goal": ">= 20", "met": true}, ...]}

``benchmarks/run_all.py`` runs the scripts with ``--results`` and prints every number with its goal.
"""

from __future__ import annotations

import argparse
import json
import operator
from dataclasses import asdict, dataclass
from pathlib import Path

from exactlens.errors import ExactLensError
from exactlens.jsonio import dumps
from exactlens.outputs import write_text

COMPARISONS = {">=": operator.ge, ">": operator.gt, "<=": operator.le, "<": operator.lt}


def parse_goal(goal: str) -> tuple[str, float]:
    """">= 1.0" -> (">=", 1.0); the comparison first, then a number."""
    for sign in sorted(COMPARISONS, key=len, reverse=True):
        if goal.strip().startswith(sign):
            try:
                return sign, float(goal.strip()[len(sign):])
            except ValueError:
                break
    raise ExactLensError(f"a goal is a comparison and a number, e.g. '>= 1.0' or '< 60'; got {goal!r}")


@dataclass
class Result:
    name: str  # what was measured, at which settings
    measured: float | None  # None: not finite (a failed or degenerate measurement)
    unit: str  # "x" for ratios, "s", "ms"
    goal: str | None  # e.g. ">= 1.0"; None: no goal
    met: bool | None  # None where there is no goal or no measurement


class Goals:
    """The results of one script run."""

    def __init__(self, script: str, quick: bool = False):
        self.script = script
        self.quick = quick
        self.results: list[Result] = []

    def add(self, name: str, measured: float | None, unit: str, goal: str | None = None) -> Result:
        value = None if measured is None or measured != measured or abs(measured) == float("inf") else float(measured)
        met = None
        if goal is not None:
            sign, bound = parse_goal(goal)
            met = None if value is None else bool(COMPARISONS[sign](value, bound))
        result = Result(name, value, unit, goal, met)
        self.results.append(result)
        return result

    def to_dict(self) -> dict:
        return {"script": self.script, "quick": self.quick, "results": [asdict(r) for r in self.results]}

    def write(self, path: str | Path | None, overwrite: bool = False) -> None:
        """Write the results to ``path`` (nothing when None)."""
        if path is not None:
            write_text(path, dumps(self.to_dict(), indent=1) + "\n", overwrite=overwrite, what="benchmark results")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``--results PATH`` and ``--overwrite`` for a benchmark script."""
    parser.add_argument("--results", metavar="PATH", default=None,
                        help="also write the measured numbers and their goals as JSON to PATH (see goals.py)")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing --results file")


def read(path: str | Path) -> dict:
    """A results file written by Goals.write, checked."""
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    if not isinstance(data, dict) or not isinstance(data.get("results"), list):
        raise ExactLensError(f"{path}: not a benchmark results file (no 'results' list)")
    for item in data["results"]:
        missing = {f for f in Result.__dataclass_fields__} - set(item)
        if missing:
            raise ExactLensError(f"{path}: a result lacks {sorted(missing)}")
    return data


def fmt(value: float | None, unit: str) -> str:
    """A measured number with its unit, 3 significant digits."""
    if value is None:
        return "n/a"
    text = f"{value:.3g}" if abs(value) < 1000 else f"{value:.0f}"
    return f"{text}x" if unit == "x" else f"{text} {unit}".rstrip()

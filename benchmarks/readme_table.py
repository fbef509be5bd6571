"""The README's table of measured numbers, made from ``make bench``'s results (issue 44: a table that stays true).

``make bench`` (benchmarks/run_all.py) writes every measured number with its goal, the date and the load
average to ``bench-results.json``; this script rewrites the part of README.md between the markers
``<!-- bench-table -->`` and ``<!-- /bench-table -->`` with the same table ``make bench`` printed, headed by
the date and the load average. Nothing outside the markers changes; ``parse`` reads a block back into the
results (tests/test_benchmarks.py checks that the README's block is exactly what ``render`` makes of it).

Usage: PYTHONPATH=src python benchmarks/readme_table.py bench-results.json [--readme README.md]
       (or ``make bench-readme`` after ``make bench``)
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from goals import read
from run_all import table

from exactlens.errors import ExactLensError
from exactlens.outputs import write_text

START = "<!-- bench-table -->"
END = "<!-- /bench-table -->"
HEADER = re.compile(r"^Measured by `(.+)` on (.+), load average ([0-9.]+) at the start and ([0-9.]+) at the end:$")
CELL_SPLIT = re.compile(r"(?<!\\)\|")


def render(data: dict) -> str:
    """The block (markers included) for one results file of run_all.py."""
    for key in ("command", "made", "load_average"):
        if key not in data:
            raise ExactLensError(f"the results lack {key!r}: write them with benchmarks/run_all.py --results PATH "
                                 "(a results file of one bench_*.py script has no date or load)")
    start, end = data["load_average"]
    header = f"Measured by `{data['command']}` on {data['made']}, load average {start:.2f} at the start and " \
             f"{end:.2f} at the end:"
    return "\n".join([START, header, "", table(data["results"], data["quick"]), END])


def _value(text: str) -> tuple[float | None, str]:
    if text == "n/a":
        return None, ""
    if text.endswith("x"):
        return float(text[:-1]), "x"
    number, _, unit = text.partition(" ")
    return float(number), unit


def parse(block: str) -> dict:
    """The results a block shows (numbers at the 3 digits shown): the inverse of ``render`` on its output."""
    lines = block.strip().splitlines()
    if len(lines) < 5 or lines[0] != START or lines[-1] != END:
        raise ExactLensError(f"a bench table starts with {START}, ends with {END} and holds a header and a table")
    match = HEADER.match(lines[1])
    if match is None:
        raise ExactLensError(f"the bench table's header line is not the generator's: {lines[1]!r}")
    results = []
    for line in lines[5:-1]:
        if not line.startswith("| "):
            continue
        script, name, value, goal, met = (c.strip() for c in CELL_SPLIT.split(line)[1:-1])
        if met == "**failed**":
            results.append({"script": script, "error": name})
            continue
        measured, unit = _value(value)
        results.append({"script": script, "name": name.replace("\\|", "|"), "measured": measured, "unit": unit,
                        "goal": None if goal == "(no goal)" else goal,
                        "met": {"yes": True, "**NO**": False}.get(met)})
    quick = "(--quick: small settings" in block
    return {"quick": quick, "command": match.group(1), "made": match.group(2),
            "load_average": [float(match.group(3)), float(match.group(4))], "results": results}


def block_of(readme: str) -> str:
    """The README's generated block (markers included); a clear error when the markers are missing or repeated."""
    if readme.count(START) != 1 or readme.count(END) != 1 or readme.index(START) > readme.index(END):
        raise ExactLensError(f"README.md must hold the markers {START} and {END} once each, in that order")
    return readme[readme.index(START) : readme.index(END) + len(END)]


def rewrite(readme: str, data: dict) -> str:
    """The README with its block replaced by the table of ``data``."""
    return readme.replace(block_of(readme), render(data))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("results", help="the JSON file of benchmarks/run_all.py --results")
    parser.add_argument("--readme", default=str(Path(__file__).resolve().parent.parent / "README.md"))
    args = parser.parse_args(argv)
    try:
        data = read(args.results)
        text = rewrite(Path(args.readme).read_text(encoding="utf-8"), data)
    except (ExactLensError, OSError, ValueError) as err:
        print(f"readme_table: {err}", file=sys.stderr)
        return 2
    write_text(args.readme, text, overwrite=True, what="README")
    print(f"{args.readme}: the bench table now shows {len(data['results'])} numbers of {data['made']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())


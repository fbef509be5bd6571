"""Run every benchmarks/bench_*.py script, then print one table of every measured number beside its goal.

Each script runs in its own process (this interpreter, ``src/`` on PYTHONPATH) and prints its own
output as it always does; it also writes its headline numbers to a temporary file (``--results``,
see goals.py), and the table at the end gathers them. ``--quick`` is passed through: every script
then runs small settings (seconds to a minute each), whose numbers are smaller problems than the
goals', so the verdicts of a quick run are indicative only. A script that fails is reported in the
table and makes the exit status 1; a goal not met does not (timings on a shared machine are noisy).

Usage: PYTHONPATH=src python benchmarks/run_all.py [--quick] [--only bench_hull,bench_vs_torch]
       [--results all.json [--overwrite]]
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

from goals import fmt, read

from exactlens.jsonio import dumps
from exactlens.outputs import check_output, write_text

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

EXTRA_ARGS = {  # beyond the defaults: the runs that the README's speed table quotes
    "bench_training.py": {"full": ["--paper-loop", "10,100"], "quick": ["--paper-loop", "10"]},
}


def scripts(only: str | None) -> list[Path]:
    found = sorted(HERE.glob("bench_*.py"))
    if not only:
        return found
    wanted = [w.strip().removesuffix(".py") for w in only.split(",") if w.strip()]
    by_stem = {p.stem: p for p in found}
    unknown = [w for w in wanted if w not in by_stem]
    if unknown:
        raise SystemExit(f"--only: no benchmark {', '.join(unknown)}; there are {', '.join(sorted(by_stem))}")
    return [by_stem[w] for w in wanted]


def run_one(script: Path, quick: bool, results: Path) -> tuple[int, float]:
    """Run one script with its output on this terminal; (exit status, seconds)."""
    args = [sys.executable, str(script), "--results", str(results)]
    if quick:
        args.append("--quick")
    args += EXTRA_ARGS.get(script.name, {}).get("quick" if quick else "full", [])
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), *filter(None, [env.get("PYTHONPATH")])])
    print(f"== benchmarks/{script.name} {' '.join(args[2:])}", flush=True)
    start = time.perf_counter()
    code = subprocess.run(args, cwd=ROOT, env=env).returncode
    return code, time.perf_counter() - start


def table(rows: list[dict], quick: bool) -> str:
    lines = ["| script | measured | value | goal | met |", "|---|---|---|---|---|"]
    for row in rows:
        if row.get("error"):
            lines.append(f"| {row['script']} | {row['error']} | | | **failed** |")
            continue
        goal = row["goal"] or "(no goal)"
        met = {True: "yes", False: "**NO**", None: "-" if row["goal"] is None else "n/a"}[row["met"]]
        name = re.sub(r"(?<!\\)\|", r"\\|", row["name"])  # a table cell: escape the pipes not yet escaped
        lines.append(f"| {row['script']} | {name} | {fmt(row['measured'], row['unit'])} | {goal} | {met} |")
    if quick:
        lines.append("")
        lines.append("(--quick: small settings, smaller problems than the goals'; the verdicts are indicative only)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small settings in every script (a smoke run)")
    parser.add_argument("--only", default=None, help="comma-separated script names (default: every bench_*.py)")
    parser.add_argument("--results", metavar="PATH", default=None, help="also write every result as JSON to PATH")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing --results file")
    args = parser.parse_args(argv)
    if args.results is not None:
        check_output(args.results, overwrite=args.overwrite, kind="file", what="benchmark results")
    rows: list[dict] = []
    failed = 0
    made = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    load_start = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="exactlens-bench-") as tmp:
        for script in scripts(args.only):
            out = Path(tmp) / f"{script.stem}.json"
            code, seconds = run_one(script, args.quick, out)
            if code != 0 or not out.exists():
                failed += 1
                why = f"exit status {code}" if code != 0 else "wrote no results"
                rows.append({"script": script.name, "error": f"{why} after {seconds:.0f} s"})
                continue
            rows += [dict(item, script=script.name) for item in read(out)["results"]]
    load = [round(load_start, 2), round(os.getloadavg()[0], 2)]
    print(f"\n== every measured number against its goal{' (--quick)' if args.quick else ''}, {made}, "
          f"load average {load[0]:.2f} at the start, {load[1]:.2f} at the end")
    print(table(rows, args.quick), flush=True)
    if args.results is not None:  # benchmarks/readme_table.py makes the README's table from this file
        command = " ".join(["benchmarks/run_all.py", *(["--quick"] if args.quick else []),
                            *(["--only", args.only] if args.only else [])])
        data = {"quick": args.quick, "command": command, "made": made, "load_average": load, "results": rows}
        write_text(args.results, dumps(data, indent=1) + "\n", overwrite=args.overwrite, what="benchmark results")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

"""Circuit discovery on trained weights with a known answer: each method on a SIIT model beside the same
construction's exact weights (issue 45; docs/siit.md's discovery table).

For each case of ``benchmarks/siit_table.py`` whose SIIT checkpoint is under ``--runs`` (NAME/siit), and
each method in ``--methods`` (default patching, EAP, EAP-IG on inputs, ACDC): ``discover`` on the exact
construction (scored against its own circuit) and on the SIIT checkpoint (scored against the circuit its
run recorded, exactlens.analysis.circuit.recorded), head granularity, resample ablation, on the same
words (``--words`` per length; lengths: the last four of the run's training lengths). Reported side by
side: edge AUROC, node AUROC, CPR and CMD of the method's ranking, and the CPR / CMD of the truth's own
ranking (the exact circuit; the recorded one on the SIIT weights), with seconds and load.

Usage: PYTHONPATH=src python benchmarks/siit_discovery.py [--runs runs/siit-table] [--cases first,...]
       [--methods patching,eap,eap-ig-inputs,acdc] [--words 16] [--out FILE.json] [--table]
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

from siit_table import CASES

from exactlens.jsonio import dumps
from exactlens.outputs import write_text

METHODS = ("patching", "eap", "eap-ig-inputs", "acdc")


def side(target: Any, method: str, lengths: list[int], words: int) -> dict[str, Any]:
    """One discovery's scores (None where undefined)."""
    from exactlens.analysis.circuit.evaluate import discover_report

    start = time.perf_counter()
    r = discover_report(target, method, lengths=lengths, words=words)
    score = r.get("score") or {}
    truth = r.get("exact_circuit") or {}
    return {"edge_auroc": score.get("edge_auroc"), "node_auroc": score.get("node_auroc"),
            "n_positive": score.get("n_positive"), "cpr": r.get("cpr"), "cmd": r.get("cmd"),
            "truth_cpr": truth.get("cpr"), "truth_cmd": truth.get("cmd"),
            "seconds": round(time.perf_counter() - start, 1)}


def run_case(name: str, runs: Path, methods: list[str], words: int) -> list[dict[str, Any]]:
    checkpoint = runs / name / "siit"
    record = json.loads((checkpoint / "run.json").read_text())["siit"]
    lo, hi = CASES[name]["train_length"]
    lengths = list(range(max(lo, hi - 3), hi + 1))
    rows = []
    for method in methods:
        load = [round(v, 2) for v in os.getloadavg()]
        exact = side(record["construction"], method, lengths, words)
        trained = side(str(checkpoint), method, lengths, words)
        rows.append({"case": name, "construction": record["construction"], "method": method, "lengths": lengths,
                     "words": words, "exact": exact, "siit": trained, "load": load})
        print(table(rows[-1:], header=False), flush=True)
    return rows


def _f(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def table(rows: list[dict[str, Any]], header: bool = True) -> str:
    lines = []
    if header:
        lines += ["| case | method | edge AUROC exact / SIIT | node AUROC exact / SIIT | CPR exact / SIIT | "
                  "CMD exact / SIIT | truth's CPR / CMD: exact; SIIT | seconds exact / SIIT | load |",
                  "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        e, s = r["exact"], r["siit"]
        lines.append(f"| `{r['case']}` | {r['method']} | {_f(e['edge_auroc'])} / {_f(s['edge_auroc'])} | "
                     f"{_f(e['node_auroc'])} / {_f(s['node_auroc'])} | {_f(e['cpr'])} / {_f(s['cpr'])} | "
                     f"{_f(e['cmd'])} / {_f(s['cmd'])} | {_f(e['truth_cpr'])} / {_f(e['truth_cmd'])}; "
                     f"{_f(s['truth_cpr'])} / {_f(s['truth_cmd'])} | {e['seconds']:.0f} / {s['seconds']:.0f} | "
                     f"{r['load'][0]:.1f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", default="runs/siit-table", help="siit_table.py's --out")
    parser.add_argument("--cases", default=None, help="comma list (default: every case with a SIIT checkpoint)")
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--words", type=int, default=16, help="words per length (all when fewer; default 16)")
    parser.add_argument("--out", default=None, help="write the rows as JSON (default RUNS/discovery.json)")
    parser.add_argument("--table", action="store_true", help="print the table of --out, no discovery")
    args = parser.parse_args()
    runs = Path(args.runs)
    out = Path(args.out) if args.out else runs / "discovery.json"
    if args.table:
        print(table(json.loads(out.read_text())))
        return
    names = args.cases.split(",") if args.cases else [n for n in CASES if (runs / n / "siit" / "run.json").is_file()]
    methods = [m for m in args.methods.split(",") if m]
    rows = json.loads(out.read_text()) if out.is_file() else []
    for name in names:
        rows = [r for r in rows if r["case"] != name] + run_case(name, runs, methods, args.words)
        write_text(out, dumps(rows, indent=1) + "\n", overwrite=True, what="SIIT discovery rows")
    print(table(rows))


if __name__ == "__main__":
    main()

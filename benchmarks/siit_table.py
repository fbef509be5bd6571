"""SIIT models of the catalogue beside models trained without SIIT: docs/siit.md's table.

For each case (a construction or preset with its training settings, ``CASES``), seed 0:

1. ``train(NAME, siit=True, **settings)`` and the same run without ``siit``, both checkpointed under
   ``--out``/NAME/{siit,plain};
2. the held-out measurements: the SIIT run's own (run.json ``siit.measured``) and the plain model's,
   measured with the same mapping and pairs (exactlens.train.siit.measure): each mapped variable's
   interchange accuracy (all pairs, changed pairs), the decision change and the output change (total
   variation) when each unmapped component is resampled;
3. with ``--diff`` (or later, on the checkpoints already trained, ``--diff-only siit,plain``): ``exactlens
   diff --parts alignment`` of each checkpoint against the construction (``DIFF`` settings), each mapped
   variable's verdict, its site and whether that is the mapped site (the plain model is read against the
   SIIT run's mapping).

Each case is written to ``--out``/NAME.json (atomically) as it finishes, so cases can run one at a time
in separate processes (the machine is shared); ``--table`` prints the markdown table of every case
found there (no training). Seconds are wall-clock, with the load average at the start and end.

Usage: PYTHONPATH=src python benchmarks/siit_table.py [--cases first,parity,...] [--diff] [--out runs/siit-table]
       [--threads 1] [--diff-only siit,plain] [--table]
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

from exactlens.jsonio import dumps
from exactlens.outputs import write_text

MEASURE = dict(test_strings=200, eval_every=0)  # every case: a small test set, no evaluation during training
SHORT = dict(MEASURE, strings_per_epoch=64, batch_size=64, lr=3e-3)
TRACR = dict(MEASURE, train_length=(1, 5), test_length=(1, 5))  # else the task defaults
CATALOGUE = ("trend", "dedup", "count_greater", "max_element", "neighbour_sum", "most_frequent", "pair_lookup")
"""The catalogue's benchmark programs (exactlens.interop.tracr.catalogue) beyond ``tracr-count_token``: the
shaped models' generic settings at |w| 1..5 (docs/siit.md "The catalogue's benchmark tasks"); those that met the
targets on seeds 0 and 1 register them as their SIIT defaults, read back here (``registered``)."""
REGISTERED = ("trend", "count_greater", "neighbour_sum")


def registered(name: str, **lengths: Any) -> dict[str, Any]:
    """A case trained with its per-task SIIT defaults (what ``exactlens train NAME --siit`` uses: a paper preset's
    ``Preset.siit_defaults``, else the construction's ``Construction.siit_defaults``, read without building it),
    measured on the small test set; ``lengths``: the case's train and test lengths where the defaults set none."""
    from exactlens.constructions import registry as constructions
    from exactlens.plugins import load_plugins
    from exactlens.train.registry import PRESETS

    load_plugins()
    defaults = PRESETS[name].siit_defaults if name in PRESETS else constructions.get(name).siit_defaults
    return dict(defaults, **lengths, **MEASURE)


CASES: dict[str, dict[str, Any]] = {
    "first": registered("first"),
    "parity": dict(SHORT, epochs=1500, train_length=(1, 8), test_length=(1, 8)),
    "dyck1": dict(SHORT, epochs=2000, train_length=(1, 8), test_length=(1, 8)),
    "induction-recent": dict(SHORT, epochs=2000, train_length=(1, 8), test_length=(1, 8)),
    "majority": registered("majority"),
    "tracr-hist": registered("tracr-hist", train_length=(1, 5), test_length=(1, 5)),
    "tracr-count_token": registered("tracr-count_token", train_length=(1, 5), test_length=(1, 5)),
    "tracr-reverse": dict(TRACR, epochs=300),
    **{f"tracr-{name}": registered(f"tracr-{name}", train_length=(1, 5), test_length=(1, 5))
       if name in REGISTERED else dict(TRACR, epochs=300) for name in CATALOGUE},
    "sm-solution1": dict(optimizer="adam", epochs=1000, strings_per_epoch=128, batch_size=128, lr=3e-3,
                         lr_schedule="constant", eval_every=0, test_strings=200, train_length=(2, 8),
                         test_length=(2, 8)),
}
"""Training settings per case (small: a shared 2-core CPU); the rest are each task's defaults."""
for _name in ("sm-solution2", "sm-solution3"):  # Shin & Matzinger's other two solutions, sm-solution1's settings
    CASES[_name] = dict(CASES["sm-solution1"])
DIFF = dict(parts=("alignment",), untrained_baseline=False, strings=16, das_steps=40)
"""The diff's settings (alignment only, 16 words per length, 40 DAS steps per fit group: a loaded shared
CPU; lengths: the training lengths' last two)."""


def load() -> list[float]:
    return [round(v, 2) for v in os.getloadavg()]


def measured_row(measured: dict[str, Any]) -> dict[str, Any]:
    """The numbers of the table from a ``measure`` result."""
    iia = measured["interchange"]
    return {"iia": {v: m["iia"] for v, m in iia.items()}, "iia_changed": {v: m["iia_changed"] for v, m in iia.items()},
            "decision_change": measured["resample_decision_change"],
            "output_change": measured.get("resample_output_change", {}),
            "max_decision_change": measured["max_resample_decision_change"],
            "max_output_change": measured.get("max_resample_output_change")}


DIFF_DEFAULTS = dict(parts=("alignment",), untrained_baseline=False)
"""``--diff-defaults``: the diff's default words per length and DAS steps (alignment only)."""


def diff_row(checkpoint: Path, against: str, mapping: dict[str, Any], lengths: list[int],
             settings: dict[str, Any] = DIFF) -> dict[str, Any]:
    """Each mapped variable's diff verdict, site and whether it is at its mapped site."""
    from exactlens import diff
    from exactlens.analysis.diff.siit_sites import sites_of

    start = time.perf_counter()
    verdicts = diff(str(checkpoint), against, lengths=lengths, **settings)["summary"]["verdicts"]
    rows = {}
    for name, site in mapping.items():
        # the variable's own line, and its position-resolved lines (v@p) where it was trained at every position
        copies = [v for v in verdicts if v.rpartition("@")[0] == name and v.rpartition("@")[2].isdigit()]
        for key in [name] + (copies if site.get("positions", "all") == "all" else []):
            line = verdicts.get(key, {})
            found = line.get("site")
            rows[key] = {"verdict": line.get("verdict"), "site": found, "mapped_site": site["hook"],
                         "iia": line.get("iia"), "interval": line.get("iia_ci"),
                         "reason": line.get("untestable_reason"), "resolves": name if key != name else None,
                         "at_mapped_site": None if found is None else found in sites_of(site["hook"])}
    kept = ("verdict", "site", "iia", "iia_ci", "changed_pairs")
    lines = {k: {f: v.get(f) for f in kept} for k, v in verdicts.items()}  # every line of the diff, compact
    return {"verdicts": rows, "lines": lines, "seconds": round(time.perf_counter() - start, 1),
            "settings": {k: list(v) if isinstance(v, tuple) else v for k, v in settings.items()}}


def run_case(name: str, settings: dict[str, Any], out: Path, threads: int, with_diff: bool, plain_too: bool = True,
             diff_settings: dict[str, Any] = DIFF) -> dict[str, Any]:
    from exactlens.train import get_preset, train
    from exactlens.train.siit import measure, siit_loss_of

    row: dict[str, Any] = {"case": name, "settings": {k: list(v) if isinstance(v, tuple) else v
                                                      for k, v in settings.items()}, "load_start": load()}
    options = dict({"seed": 0}, **settings, threads=threads, overwrite=True)  # seed 0 unless --set seed=N
    start, cpu = time.perf_counter(), time.process_time()
    siit = train(name, siit=True, out=out / name / "siit", **options)
    row["siit_seconds"] = round(time.perf_counter() - start, 1)
    row["siit_cpu_seconds"] = round(time.process_time() - cpu, 1)
    start = time.perf_counter()
    plain = train(name, out=out / name / "plain", **options) if plain_too else None
    row["plain_seconds"] = round(time.perf_counter() - start, 1) if plain_too else None
    record = siit.info["siit"]
    row["mapping"] = {v: s["hook"] for v, s in record["mapping"].items()}
    row["in_circuit_unmapped"] = record["in_circuit_unmapped"]
    row["siit"] = {**measured_row(record["measured"]), "test_accuracy": siit.final.get("test_accuracy"),
                   "test_r2": siit.final.get("test_r2"), "word_disjoint": record["measured"]["word_disjoint"]}
    row["plain"] = {}
    if plain is not None:
        spec = {k: v for k, v in settings.items() if k != "seed"}  # a run's option, no preset's (--set seed=N)
        loss = siit_loss_of(get_preset(name).spec(dict(spec, siit=True)))
        row["plain"] = {**measured_row(measure(loss, plain.model)), "test_accuracy": plain.final.get("test_accuracy"),
                        "test_r2": plain.final.get("test_r2")}
    row["load_end"] = load()
    if with_diff:
        add_diffs(row, out, ("siit", "plain") if plain is not None else ("siit",), diff_settings)
    return row


def add_diffs(row: dict[str, Any], out: Path, sides: tuple[str, ...], settings: dict[str, Any] = DIFF
              ) -> dict[str, Any]:
    """The diff's verdicts of a case's checkpoints (``sides``), each against the SIIT run's mapping."""
    name = row["case"]
    record = json.loads((out / name / "siit" / "run.json").read_text())["siit"]
    lo, hi = CASES[name]["train_length"]
    row["diff_lengths"] = lengths = list(range(max(lo, hi - 1), hi + 1))
    for side in sides:
        row[side]["diff"] = diff_row(out / name / side, record["construction"], record["mapping"], lengths, settings)
        row[side]["diff"]["load"] = load()
    return row


def _range(values: dict[str, float | None]) -> str:
    got = [v for v in values.values() if v is not None]
    if not got:
        return "-"
    lo, hi = min(got), max(got)
    return f"{lo:.2f}" if abs(hi - lo) < 0.005 else f"{lo:.2f}-{hi:.2f}"


def _at_sites(side: dict[str, Any]) -> str:
    d = side.get("diff")
    if not d:
        return "-"
    found: dict[str, bool] = {}  # a mapped variable is found where it or one of its positions (v@p) is computed there
    for name, r in d["verdicts"].items():
        base = r.get("resolves") or name
        found[base] = found.get(base, False) or (r["verdict"] == "computed" and bool(r["at_mapped_site"]))
    return f"{sum(found.values())}/{len(found)}"


def _test(side: dict[str, Any]) -> str:
    """Test accuracy, or R^2 for a regression task."""
    if side.get("test_accuracy") is not None:
        return f"{side['test_accuracy']:.3f}"
    return "-" if side.get("test_r2") is None else f"R² {side['test_r2']:.3f}"


def _seconds(x: float | None) -> str:
    return "-" if x is None else f"{x:.0f}"


def table(rows: list[dict[str, Any]]) -> str:
    head = ("| case | epochs | interchange acc. SIIT (changed pairs) | plain | max resample decision change SIIT "
            "| plain | max output change SIIT | plain | test acc. (R²) SIIT / plain | diff: computed at mapped site "
            "SIIT / plain | seconds SIIT / plain | load |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        s, p = r["siit"], r["plain"]

        p = {"iia": {}, "iia_changed": {}, "max_decision_change": None, "max_output_change": None, **p}

        def f(x: float | None) -> str:
            return "-" if x is None else f"{x:.3f}"

        lines.append(
            f"| `{r['case']}` | {r['settings']['epochs']} | {_range(s['iia'])} ({_range(s['iia_changed'])}) | "
            f"{_range(p['iia'])} ({_range(p['iia_changed'])}) | {f(s['max_decision_change'])} | "
            f"{f(p['max_decision_change'])} | {f(s['max_output_change'])} | {f(p['max_output_change'])} | "
            f"{_test(s)} / {_test(p)} | {_at_sites(s)} / {_at_sites(p)} | "
            f"{r['siit_seconds']:.0f} / {_seconds(r['plain_seconds'])} | "
            f"{r['load_start'][0]:.1f}-{r['load_end'][0]:.1f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", default=",".join(CASES), help=f"comma list of {', '.join(CASES)}")
    parser.add_argument("--out", default="runs/siit-table", help="checkpoints and one NAME.json per case")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--diff", action="store_true", help="also diff each checkpoint (alignment part)")
    parser.add_argument("--diff-only", default=None, metavar="SIDES",
                        help="diff the checkpoints of cases already trained, e.g. 'siit' or 'siit,plain'")
    parser.add_argument("--diff-defaults", action="store_true", help="diff at the diff's default words and DAS "
                        "steps (alignment only) instead of DIFF's small settings")
    parser.add_argument("--no-plain", action="store_true", help="train the SIIT model only (no contrast)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="override a training setting of every case (a JSON value), e.g. --set epochs=4000")
    parser.add_argument("--table", action="store_true", help="print the table of the cases in --out, no training")
    args = parser.parse_args()
    out = Path(args.out)
    names = [c for c in args.cases.split(",") if c]
    unknown = [c for c in names if c not in CASES]
    if unknown:
        parser.error(f"unknown case {unknown[0]!r}; the cases: {', '.join(CASES)}")
    overrides = {}
    diff_settings = DIFF_DEFAULTS if args.diff_defaults else DIFF
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep:
            parser.error(f"--set takes KEY=VALUE, got {item!r}")
        got = json.loads(value)
        overrides[key] = tuple(got) if isinstance(got, list) else got
    if args.diff_only:
        for name in names:
            row = json.loads((out / f"{name}.json").read_text())
            add_diffs(row, out, tuple(args.diff_only.split(",")), diff_settings)
            write_text(out / f"{name}.json", dumps(row, indent=1) + "\n", overwrite=True, what="SIIT case")
            print(table([row]), flush=True)
    elif not args.table:
        for name in names:
            print(f"{name}: training (load {load()})", flush=True)
            row = run_case(name, {**CASES[name], **overrides}, out, args.threads, args.diff, not args.no_plain,
                           diff_settings)
            write_text(out / f"{name}.json", dumps(row, indent=1) + "\n", overwrite=True, what="SIIT case")
            print(table([row]), flush=True)
    rows = [json.loads((out / f"{n}.json").read_text()) for n in CASES if (out / f"{n}.json").is_file()]
    print(table(rows))


if __name__ == "__main__":
    main()

"""Circuit formation findings (docs/formation.md): train runs with checkpoints, then a timeline of each.

Two settings, reduced from the papers' schedules to fit a shared 2-core CPU (the settings are
printed and recorded in ``findings.json``):

(a) Chiang & Cholak Fig. 4 / Nowak et al. Fig. 4: the ``first`` preset trained at |w| = 10,
    standard vs log-n scaled attention (``--scaled``), tested at |w| = 1000; timeline against the
    exact ``first`` (and, for the scaled runs, ``first-log``).
(b) Brody et al. MAJORITY (the ``majority`` preset: a [CLS] classifier of 20 classes, |w| = 50) with
    layer norm ``full`` (projection + scaling) and ``scale_only`` (no projection); timeline against
    the exact ``majority`` (uniform averaging of the class one-hots: the counting variables). The same
    for the task as the paper trains it (``majority-per-position``: every position, margin >= 6), against
    the exact ``majority-per-position``.

Step 1 trains (``train``: every run through ``exactlens train ... --checkpoints log:N`` into
``OUT/runs/NAME``); step 2 (``timelines``) runs the timeline (``exactlens timeline SEED_DIR --against NAME``,
in this process) on the chosen seeds' runs and writes ``OUT/timelines/NAME-seedS.json``; step 3
(``summary``) prints the events and the checkpoints' own test accuracy and writes ``OUT/findings.json`` (and,
where the per-position MAJORITY runs have their attention timelines, ``OUT/majority-projection.png``).
``all`` does the three in order. ``uniform`` trains finding (b)'s ablation: the per-position MAJORITY with its
attention frozen at the exact uniform average (W_Q = W_K = 0), both layer-norm variants.

Usage: PYTHONPATH=src nice -n 10 python benchmarks/formation_findings.py all --out /tmp/formation [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

PYTHON = sys.executable

# name -> (training preset, its options, timeline against, timeline lengths, long lengths)
FIRST_OPTIONS = ["--train-length", "10", "--test-length", "1000", "--epochs", "1000", "--eval-every", "0",
                 "--test-strings", "100"]
MAJORITY_OPTIONS = ["--epochs", "40", "--strings-per-epoch", "2000", "--batch-size", "100", "--lr", "1e-2",
                    "--lr-schedule", "constant", "--test-strings", "1000", "--eval-every", "0"]
RUNS = {
    "first-standard": ("first", FIRST_OPTIONS, "first"),
    "first-scaled": ("first", [*FIRST_OPTIONS, "--scaled"], "first"),
    "majority-full": ("majority", [*MAJORITY_OPTIONS, "--layer-norm", "full"], "majority"),
    "majority-scale_only": ("majority", [*MAJORITY_OPTIONS, "--layer-norm", "scale_only"], "majority"),
    # the task as Brody et al. train it (every position, margin >= 6): the preset's own budget (600 Adam steps)
    "majority-pp-full": ("majority-per-position", ["--eval-every", "0", "--layer-norm", "full"],
                         "majority-per-position"),
    "majority-pp-scale_only": ("majority-per-position", ["--eval-every", "0", "--layer-norm", "scale_only"],
                               "majority-per-position"),
}
QUICK = {"first": ["--epochs", "30", "--test-strings", "20"], "majority": ["--epochs", "2", "--test-strings", "100"],
         "majority-per-position": ["--epochs", "3", "--test-strings", "100"]}
SEEDS = "0:2"  # inclusive: seeds 0, 1, 2
CHECKPOINTS = "log:16"


def exactlens(*args: str) -> list[str]:
    return [PYTHON, "-m", "exactlens", *args]


def run(command: list[str]) -> float:
    print("$", shlex.join(command), flush=True)
    start = time.perf_counter()
    subprocess.run(command, check=True, env={**os.environ})
    return time.perf_counter() - start


def train_all(out: Path, names: list[str], quick: bool, seeds: str) -> dict[str, float]:
    seconds = {}
    for name in names:
        preset, options, _ = RUNS[name]
        target = out / "runs" / name
        if target.exists():
            print(f"{target} exists: kept", flush=True)
            continue
        extra = QUICK[preset] if quick else []
        seconds[name] = run(exactlens("train", preset, "--out", str(target), "--seeds", seeds, "--threads", "1",
                                      "--checkpoints", CHECKPOINTS, *options, *extra))
    return seconds


# 128 words: a test split of ~26 words of length 10 holds the 48 changed test pairs per variable that DAS's
# designed pairs ask for (48 of 48 right: [0.93, 1], above the 0.9 a variable event needs)
TIMELINE = {"strings": 128, "alignment_pairs": 48, "das_steps": 30}
QUICK_TIMELINE = {"strings": 8, "alignment_pairs": 8, "das_steps": 10}
# the compared lengths: the training length; the long ones: FIRST's test length (Fig. 4), twice MAJORITY's
LENGTHS = {"first": ([10], [1000]), "majority": ([50], [100]), "majority-per-position": ([50], [100])}


def chosen_checkpoints(seed_dir: Path, most: int) -> list:
    """At most ``most`` of a run's checkpoints, evenly spread over their list (first and last kept)."""
    from exactlens.train.checkpoints import read_checkpoints

    found = read_checkpoints(seed_dir)
    if len(found) <= most:
        return found
    return [found[i] for i in sorted({round(k * (len(found) - 1) / (most - 1)) for k in range(most)})]


def timelines(out: Path, names: list[str], options: dict, seeds: list[str], most: int,
              tag: str = "") -> dict[str, float]:
    """``exactlens.analysis.timeline.timeline`` (= ``exactlens timeline SEED_DIR --against NAME``) of each
    chosen seed's run, written to OUT/timelines/NAME-seedS.json (a run already done is kept)."""
    import torch

    from exactlens.analysis.timeline import timeline
    from exactlens.jsonio import dumps
    from exactlens.outputs import write_text

    torch.set_num_threads(1)
    seconds = {}
    for name in names:
        against = RUNS[name][2]
        for seed_dir in sorted((out / "runs" / name).glob("seed*")):
            if seeds and seed_dir.name.removeprefix("seed") not in seeds:
                continue
            target = out / "timelines" / f"{name}-{seed_dir.name}{'-' + tag if tag else ''}.json"
            if target.exists():
                continue
            kept = chosen_checkpoints(seed_dir, most)
            lengths, long_lengths = LENGTHS[RUNS[name][0]]
            print(f"timeline of {seed_dir} (steps {[c.step for c in kept]}) against {against} with {options}",
                  flush=True)
            start = time.perf_counter()
            given = {"lengths": lengths, "long_lengths": long_lengths, **options}  # the options win
            result = timeline(kept, against, steps=[c.step for c in kept], quiet=False, device="cpu", **given)
            result["run"]["path"] = str(seed_dir)
            seconds[target.stem] = time.perf_counter() - start
            write_text(target, dumps(result) + "\n")
            print(f"{target}: {seconds[target.stem]:.0f} s; {result['events']['order']}", flush=True)
    return seconds


def training_curves(out: Path) -> dict[str, list[dict]]:
    """Per run and seed, the checkpoints' own numbers (exactlens train's index.jsonl: the test accuracy on
    one fixed set of test words at the run's test length, e.g. |w| = 1000 for FIRST)."""
    curves = {}
    for index in sorted((out / "runs").glob("*/seed*/checkpoints/index.jsonl")):
        run = f"{index.parents[2].name}-{index.parents[1].name}"
        if run.startswith("."):  # a run still being written (staged)
            continue
        rows = [json.loads(line) for line in index.read_text(encoding="utf-8").splitlines()]
        curves[run] = [{"step": r["step"], "test_accuracy": r.get("test_accuracy")} for r in rows]
    return curves


def first_step(curve: list[dict], key: str, bound: float) -> int | None:
    """The first step from which ``key`` stays >= bound to the end (None: never)."""
    found = None
    for row in curve:
        if row.get(key) is not None and row[key] >= bound:
            found = row["step"] if found is None else found
        else:
            found = None
    return found


def summary(out: Path) -> list[dict]:
    curves = training_curves(out)
    for run, curve in curves.items():
        print(f"{run}: test accuracy (run's test length) from step {first_step(curve, 'test_accuracy', 0.99)} "
              f">= 0.99; " + ", ".join(f"{r['step']}:{r['test_accuracy']:.2f}" for r in curve), flush=True)
    rows = []
    for path in sorted((out / "timelines").glob("*.json")):
        data = json.loads(path.read_text(encoding="utf-8"))
        last = data["checkpoints"][-1] if data.get("checkpoints") else {}
        events = data.get("events") or {}
        rows.append({
            "run": path.stem,
            "final_accuracy": last.get("accuracy"),
            "final_long_accuracy": last.get("long_accuracy"),
            "variables": {k: (v or {}).get("step") for k, v in (events.get("variables") or {}).items()},
            "behaviour": events.get("behaviour"),
            "long_behaviour": events.get("long_behaviour"),
            "circuit": events.get("circuit"),
            "order": events.get("order"),
            "seconds": data.get("seconds"),
            "curve": [{"step": c["step"], "accuracy": c.get("accuracy"), "long_accuracy": c.get("long_accuracy"),
                       "iia": {k: (v or {}).get("iia") for k, v in (c.get("verdicts") or {}).items()},
                       "verdict": {k: (v or {}).get("verdict") for k, v in (c.get("verdicts") or {}).items()},
                       "cls_to_first": (c.get("attention") or {}).get("cls_to_first"),
                       "cls_to_first_exact": (c.get("attention") or {}).get("cls_to_first_exact"),
                       "tv_distance": (c.get("attention") or {}).get("tv_distance"),
                       "circuit_overlap": c.get("circuit_overlap")} for c in data.get("checkpoints") or []],
        })
    for row in rows:
        print(json.dumps(row), flush=True)
    return rows


FROZEN_UNIFORM = ("blocks.0.attn.W_Q", "blocks.0.attn.W_K")


def uniform_attention_runs(out: Path, seeds: list[int], quick: bool) -> dict[str, float]:
    """Finding (b)'s ablation: the ``majority-per-position`` preset with W_Q and W_K frozen at 0 (its b_Q and
    b_K are frozen at 0 already), so that every query scores every key 0 and the attention is exactly the
    exact construction's uniform average from step 0. Only the values, the FFN, the norms and the read-out
    learn. Both layer-norm variants, into OUT/runs/majority-pp-uniform-VARIANT/seedS (with checkpoints)."""
    import dataclasses

    import torch

    from exactlens.plugins import load_plugins
    from exactlens.train import train_many
    from exactlens.train.presets import get_preset
    from exactlens.train.registry import PRESETS, register_preset

    torch.set_num_threads(1)
    load_plugins()
    base = get_preset("majority-per-position")

    def prepare(model, options):
        base.prepare(model, options)
        params = dict(model.named_parameters())
        with torch.no_grad():
            for name in FROZEN_UNIFORM:
                params[name].zero_()

    def masks(model, options):
        return {**base.masks(model, options), **{name: False for name in FROZEN_UNIFORM}}

    name = "majority-per-position-uniform"
    register_preset(dataclasses.replace(base, name=name, prepare=prepare, masks=masks))
    seconds = {}
    try:
        for variant in ("full", "scale_only"):
            target = out / "runs" / f"majority-pp-uniform-{variant}"
            if target.exists():
                print(f"{target} exists: kept", flush=True)
                continue
            start = time.perf_counter()
            extra = {"epochs": 3, "test_strings": 100} if quick else {}
            train_many(name, seeds, layer_norm=variant, checkpoints=CHECKPOINTS, eval_every=0, out=target, **extra)
            seconds[target.name] = time.perf_counter() - start
            print(f"{target}: {seconds[target.name]:.1f} s", flush=True)
    finally:  # a preset of this script only: not left in the process's registry
        PRESETS.pop(name, None)
    return seconds


def projection_figure(out: Path, runs: tuple[str, ...] = ("majority-pp-full", "majority-pp-scale_only")) -> Path | None:
    """Finding (b) in one picture: per variant, the mean over seeds (band: min-max) of the TV distance of the
    head's attention to the exact (uniform) head, from the ``--tag attention`` timelines, and of the
    checkpoints' test accuracy (index.jsonl), against the step (symlog). OUT/majority-projection.png."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(7, 5.5), sharex=True)
    drawn = False
    for name, colour in zip(runs, ("tab:blue", "tab:orange"), strict=False):
        tv, accuracy = {}, {}
        for path in sorted((out / "timelines").glob(f"{name}-seed*-attention.json")):
            for row in json.loads(path.read_text(encoding="utf-8"))["checkpoints"]:
                values = list(((row.get("attention") or {}).get("tv_distance") or {}).values())
                if values:
                    tv.setdefault(row["step"], []).append(sum(values) / len(values))
        for index in sorted((out / "runs" / name).glob("seed*/checkpoints/index.jsonl")):
            for line in index.read_text(encoding="utf-8").splitlines():
                row = json.loads(line)
                if row.get("test_accuracy") is not None:
                    accuracy.setdefault(row["step"], []).append(row["test_accuracy"])
        label = name.removeprefix("majority-pp-")
        for axis, series in ((top, tv), (bottom, accuracy)):
            if not series:
                continue
            steps = sorted(series)
            mean = np.array([np.mean(series[k]) for k in steps])
            axis.plot(steps, mean, color=colour, marker="o", ms=3, label=f"{label} ({len(series[steps[-1]])} seeds)")
            axis.fill_between(steps, [min(series[k]) for k in steps], [max(series[k]) for k in steps],
                              color=colour, alpha=0.2)
            drawn = True
    for name, colour in zip(runs, ("tab:blue", "tab:orange"), strict=False):
        accuracy = {}
        variant = name.removeprefix("majority-pp-")
        for index in sorted((out / "runs" / f"majority-pp-uniform-{variant}").glob("seed*/checkpoints/index.jsonl")):
            for line in index.read_text(encoding="utf-8").splitlines():
                row = json.loads(line)
                if row.get("test_accuracy") is not None:
                    accuracy.setdefault(row["step"], []).append(row["test_accuracy"])
        if accuracy:
            steps = sorted(accuracy)
            bottom.plot(steps, [np.mean(accuracy[k]) for k in steps], color=colour, ls="--",
                        label=f"{variant}, attention frozen uniform ({len(accuracy[steps[-1]])} seeds)")
    if not drawn:
        plt.close(fig)
        return None
    top.set_ylabel("TV distance to uniform attention")
    bottom.set_ylabel("test accuracy (every position)")
    bottom.set_xlabel("optimizer step (symlog)")
    bottom.set_xscale("symlog", linthresh=1)
    for axis in (top, bottom):
        if axis.lines:
            axis.legend()
    top.set_title("majority-per-position: attention and accuracy, with (full) and without (scale_only) projection",
                  fontsize=9)
    fig.tight_layout()
    target = out / "majority-projection.png"
    fig.savefig(target, dpi=110)
    plt.close(fig)
    return target


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("step", choices=("train", "timelines", "uniform", "summary", "all"))
    parser.add_argument("--out", required=True)
    parser.add_argument("--runs", nargs="+", default=list(RUNS), choices=list(RUNS))
    parser.add_argument("--seeds", default=SEEDS)
    parser.add_argument("--quick", action="store_true", help="seconds: a few steps per run (a smoke test)")
    parser.add_argument("--timeline-seeds", default="0",
                        help="comma list of the seeds whose runs get a timeline ('' = all)")
    parser.add_argument("--tag", default="", help="timelines go to NAME-seedS-TAG.json (another set of options)")
    parser.add_argument("--timeline-checkpoints", type=int, default=8,
                        help="at most this many of a run's checkpoints get a timeline (evenly spread)")
    parser.add_argument("--timeline-option", action="append", default=[], metavar="KEY=JSON",
                        help="a timeline option over the defaults (repeatable, e.g. --timeline-option das_steps=80)")
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    record = {"command": "PYTHONPATH=src python benchmarks/formation_findings.py " + shlex.join(argv or sys.argv[1:]),
              "runs": {n: {"preset": RUNS[n][0], "options": RUNS[n][1], "against": RUNS[n][2]} for n in args.runs},
              "seeds": args.seeds, "checkpoints": CHECKPOINTS, "quick": args.quick, "load": os.getloadavg()}
    if args.step in ("train", "all"):
        record["train_s"] = train_all(out, args.runs, args.quick, args.seeds)
    if args.step == "uniform":
        first, _, last = args.seeds.partition(":")
        record["uniform_s"] = uniform_attention_runs(out, list(range(int(first), int(last or first) + 1)), args.quick)
    if args.step in ("timelines", "all"):
        options = dict(QUICK_TIMELINE if args.quick else TIMELINE)
        for item in args.timeline_option:
            key, _, value = item.partition("=")
            options[key] = json.loads(value)
        record["timeline_options"] = options
        record["timeline_s"] = timelines(out, args.runs, options, [s for s in args.timeline_seeds.split(",") if s],
                                         args.timeline_checkpoints, args.tag)
    if args.step in ("summary", "all"):
        record["rows"] = summary(out)
        record["training_curves"] = training_curves(out)
        figure = projection_figure(out)
        if figure is not None:
            print(f"finding (b): {figure}", flush=True)
        (out / "findings.json").write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""`exactlens list [--json]`: the registered constructions (with their tasks), tasks and training presets."""

from __future__ import annotations

import argparse

from exactlens import tasks
from exactlens.cli.common import emit
from exactlens.cli.registry import Verb, register_verb
from exactlens.constructions import get, names
from exactlens.train import get_preset, preset_names


def catalog() -> dict[str, list[dict]]:
    constructions = [get(n).describe() for n in names()]
    task_rows = [{"name": n, "kind": tasks.get(n).kind} for n in tasks.names()]
    presets = [
        {"name": p.name, "task": p.task, "paper": p.paper, "summary": p.summary}
        for p in (get_preset(n) for n in preset_names())
    ]
    return {"constructions": constructions, "tasks": task_rows, "presets": presets}


def run(args: argparse.Namespace) -> None:
    rows = catalog()
    lines = ["constructions:"]
    lines += [
        f"  {r['name']:18s} {r['task']['name']:18s} {r['task']['kind']:14s} {r['paper']:30s} {r['summary']}"
        for r in rows["constructions"]
    ]
    lines += ["tasks:"] + [f"  {r['name']:18s} {r['kind']}" for r in rows["tasks"]]
    lines += ["training presets (exactlens train NAME):"]
    lines += [f"  {r['name']:18s} {r['task']:18s} {r['paper']:30s} {r['summary']}" for r in rows["presets"]]
    lines += ["  every other construction name trains its task in the construction's shape (hard attention -> softmax)"]
    emit(rows, args.json, "\n".join(lines))


def arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true")


register_verb(Verb("list", "list the registered constructions, tasks and training presets", arguments, run, order=0))

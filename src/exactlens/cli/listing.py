"""`exactlens list [--json]`: the registered constructions (with their tasks), tasks and training presets.

Listed from what the plug-ins registered, without importing their builders, tasks or presets (nor
torch): lazily registered entries show the facts they were registered with (exactlens.plugins)."""

from __future__ import annotations

import argparse

from exactlens import tasks
from exactlens.cli.common import emit
from exactlens.cli.registry import Verb, register_verb
from exactlens.constructions import get, names
from exactlens.train.registry import PRESETS, preset_names


def catalog() -> dict[str, list[dict]]:
    constructions = [get(n).describe() for n in names()]
    task_rows = [{"name": n, "kind": tasks.info(n)["kind"]} for n in tasks.names()]
    presets = [{"name": n, **{k: PRESETS.info(n)[k] for k in ("task", "paper", "summary")}} for n in preset_names()]
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

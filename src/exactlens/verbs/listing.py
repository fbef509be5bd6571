"""``exactlens list``: the registered constructions (with their tasks), tasks and training presets.

Listed from what the plug-ins registered, without importing their builders, tasks or presets (nor
torch): lazily registered entries show the facts they were registered with (exactlens.plugins)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from exactlens.results import Result, View
from exactlens.verbs import VerbSpec, register_verb


def catalog() -> dict[str, list[dict]]:
    from exactlens import tasks
    from exactlens.constructions import get, names
    from exactlens.train.registry import PRESETS, preset_names

    constructions = [get(n).describe() for n in names()]
    task_rows = [{"name": n, "kind": tasks.info(n)["kind"]} for n in tasks.names()]
    presets = [{"name": n, **{k: PRESETS.info(n)[k] for k in ("task", "paper", "summary")}} for n in preset_names()]
    return {"constructions": constructions, "tasks": task_rows, "presets": presets}


@dataclass(frozen=True)
class ListRequest:
    """No options."""


def run(request: ListRequest) -> Result:
    return Result("list", catalog())


def text(rows: dict[str, Any]) -> str:
    lines = ["constructions:"]
    lines += [
        f"  {r['name']:18s} {r['task']['name']:18s} {r['task']['kind']:14s} {r['paper']:30s} {r['summary']}"
        for r in rows["constructions"]
    ]
    lines += ["tasks:"] + [f"  {r['name']:18s} {r['kind']}" for r in rows["tasks"]]
    lines += ["training presets (exactlens train NAME):"]
    lines += [f"  {r['name']:18s} {r['task']:18s} {r['paper']:30s} {r['summary']}" for r in rows["presets"]]
    lines += ["  every other construction name trains its task in the construction's shape (hard attention -> softmax)"]
    return "\n".join(lines)


VIEW = View(lambda d: [("constructions", len(d["constructions"])), ("tasks", len(d["tasks"])),
                       ("presets", len(d["presets"]))], text)

register_verb(VerbSpec("list", "list the registered constructions, tasks and training presets", ListRequest, run,
                       views={"list": VIEW}, order=0, api=False))

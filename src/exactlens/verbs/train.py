"""``exactlens train`` (TEMPORARY: the command line's older form until its request is declared)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import exactlens.cli.train  # noqa: F401  (registers the command-line verb)
from exactlens.results import Result, View, fmt, register_view
from exactlens.verbs.common import pyplot


def train(name: str, *, out: str | Path | None = None, seed: int = 0, seeds: Sequence[int] | None = None,
          overwrite: bool = False, device: Any = "auto", **options: Any) -> Result:
    """``exactlens train``: a paper preset or any construction's task in its shape."""
    from exactlens.train import train as one
    from exactlens.train import train_many

    if seeds is not None:
        runs = train_many(name, list(seeds), out=out, overwrite=overwrite, device=device, **options)
        return Result("train_many", {"runs": [r.info for r in runs]}, runs=runs, models=[r.model for r in runs])
    run = one(name, out=out, seed=seed, overwrite=overwrite, device=device, **options)
    return Result("train", run.info, run=run, model=run.model, history=run.history)


def _train_rows(info: dict[str, Any]) -> list[tuple[str, Any]]:
    final = info["final"]
    rows = [("task", info["task"]), ("seed", info["seed"]), ("steps", info["steps"]), ("seconds", info["wall_s"])]
    rows += [(k, v) for k, v in final.items() if k.startswith("test_") and v is not None and k != "test_evaluated"]
    return rows


def _plot_history(histories: list[list[dict[str, Any]]], title: str) -> Any:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(5, 3))
    for history in histories:
        tested = [r for r in history if r.get("test_evaluated")]
        key = "test_mse" if tested and tested[0].get("test_mse") is not None else "test_accuracy"
        ax.plot([r["epoch"] for r in tested], [r[key] for r in tested], marker=".")
        ax.set_ylabel(key.replace("_", " "))
    ax.set_xlabel("epoch")
    ax.set_title(title)
    return fig


register_view("train", View(_train_rows, lambda d: "\n".join(f"{k}: {fmt(v)}" for k, v in _train_rows(d)),
                            lambda r: _plot_history([r.history], r["task"])))
register_view("train_many", View(
    lambda d: [("runs", len(d["runs"]))] + [(f"seed {r['seed']} {k}", v) for r in d["runs"]
                                             for k, v in _train_rows(r)[4:]],
    lambda d: "\n".join(f"seed {r['seed']}: " + ", ".join(f"{k} {fmt(v)}" for k, v in _train_rows(r)[4:])
                        for r in d["runs"]),
    lambda r: _plot_history([run.history for run in r.runs], f"{r['runs'][0]['task']}, {len(r.runs)} runs")))


def _register() -> None:
    from exactlens.api import register_api

    register_api("train", train)


_register()

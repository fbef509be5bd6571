"""A sweep's results table and summary page, rebuilt from its job directories (the directories are the
truth; the table is written again, atomically, after every unit, so a killed driver leaves a readable one).

``results.jsonl``: one row per job and seed (the job's options and grid values, seed, status, error,
seconds, headline figures); ``results.csv`` the same, flat (``options.X``, ``headline.X`` columns);
``results.parquet`` where pyarrow is installed; ``summary.html``: the table and a plot per headline
figure across the grid.
"""

from __future__ import annotations

import base64
import csv
import html
import io
import json
import os
import secrets
from pathlib import Path
from typing import Any

from exactlens.jsonio import dumps
from exactlens.sweep.runner import read_row
from exactlens.sweep.spec import Sweep

__all__ = ["collect_rows", "flat_row", "write_summary", "write_table"]

NOT_PLOTTED = ("seed", "seconds", "steps", "lengths")  # headline rows that describe the job, not its outcome
FIXED = ("job", "verb", "seed", "status", "error", "seconds", "stacked", "parent", "dir", "line")


def collect_rows(sweep: Sweep, root: Path) -> list[dict[str, Any]]:
    """The rows of the spec's jobs that have a directory, in spec order."""
    return [row for row in (read_row(root, j.id) for j in sweep.jobs) if row is not None]


def _replace(path: Path, text: str | bytes) -> None:
    """Write ``path`` through a hidden sibling and one rename (safe with shards writing side by side)."""
    tmp = path.parent / f".{path.name}.partial-{os.getpid()}-{secrets.token_hex(4)}"
    try:
        if isinstance(text, bytes):
            tmp.write_bytes(text)
        else:
            tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def flat_row(row: dict[str, Any]) -> dict[str, Any]:
    """One row as flat columns: options.X, grid values included, headline.X; lists and dicts as JSON."""
    out = {k: row.get(k) for k in FIXED}
    for prefix in ("options", "headline"):
        for key, value in (row.get(prefix) or {}).items():
            out[f"{prefix}.{key}"] = json.dumps(value) if isinstance(value, (list, dict)) else value
    return out


def write_table(rows: list[dict[str, Any]], root: Path, name: str = "results") -> list[Path]:
    """results.jsonl, results.csv and (with pyarrow) results.parquet; the paths written."""
    root.mkdir(parents=True, exist_ok=True)
    written = [root / f"{name}.jsonl"]
    _replace(written[0], "".join(dumps(r) + "\n" for r in rows))
    flat = [flat_row(r) for r in rows]
    columns = list(dict.fromkeys(k for r in flat for k in r)) or list(FIXED)
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=columns, lineterminator="\n")
    writer.writeheader()
    writer.writerows(flat)
    written.append(root / f"{name}.csv")
    _replace(written[1], buffer.getvalue())
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ModuleNotFoundError:
        return written
    table = pa.Table.from_pylist([{c: _scalar(r.get(c)) for c in columns} for r in flat])
    sink = io.BytesIO()
    pq.write_table(table, sink)
    written.append(root / f"{name}.parquet")
    _replace(written[2], sink.getvalue())
    return written


def _scalar(value: Any) -> Any:
    """Parquet columns hold one type: numbers and bools as numbers where a column mixes them is left to
    pyarrow; anything else as text."""
    return value if value is None or isinstance(value, (int, float, str)) else str(value)


def _label(row: dict[str, Any]) -> str:
    grid = row.get("grid") or {}
    return ", ".join(f"{k}={v}" for k, v in grid.items()) or str(row["options"].get("name", row["verb"]))


def _plots(rows: list[dict[str, Any]]) -> list[str]:
    """One PNG per verb and numeric headline figure: the value of each job (one dot per seed) per grid point."""
    from exactlens.viz.backend import pyplot

    ok = [r for r in rows if r["status"] == "ok"]
    images = []
    for verb in dict.fromkeys(r["verb"] for r in ok):
        mine = [r for r in ok if r["verb"] == verb]
        figures = [k for k in dict.fromkeys(k for r in mine for k in r["headline"])
                   if k not in NOT_PLOTTED and all(isinstance(r["headline"].get(k), (int, float))
                                             and not isinstance(r["headline"].get(k), bool) for r in mine)]
        labels = list(dict.fromkeys(_label(r) for r in mine))
        if len(mine) < 2 or not figures:
            continue
        plt = pyplot()
        for figure in figures[:6]:
            fig, ax = plt.subplots(figsize=(max(4.0, 0.6 * len(labels) + 2), 2.8))
            for i, label in enumerate(labels):
                values = [r["headline"][figure] for r in mine if _label(r) == label]
                ax.plot([i] * len(values), values, "o", alpha=0.6, color="C0")
                ax.plot([i - 0.2, i + 0.2], [sum(values) / len(values)] * 2, color="C1")
            ax.set_xticks(range(len(labels)), labels, rotation=30, ha="right", fontsize=7)
            ax.set_title(f"{verb}: {figure} (dots: seeds, bar: mean)", fontsize=9)
            buffer = io.BytesIO()
            fig.savefig(buffer, format="png", dpi=80, bbox_inches="tight")
            plt.close(fig)
            images.append(base64.b64encode(buffer.getvalue()).decode("ascii"))
    return images


def write_summary(rows: list[dict[str, Any]], root: Path, title: str) -> Path:
    """summary.html: counts by status, a plot per headline figure across the grid, the table."""
    flat = [flat_row(r) for r in rows]
    columns = [c for c in dict.fromkeys(k for r in flat for k in r) if c not in ("dir", "line", "parent")]
    counts = {s: sum(r["status"] == s for r in rows) for s in ("ok", "failed", "skipped")}
    cell = lambda v: html.escape("" if v is None else f"{v:.4g}" if isinstance(v, float) else str(v))  # noqa: E731
    body = "".join("<tr>" + "".join(f"<td>{cell(r.get(c))}</td>" for c in columns) + "</tr>" for r in flat)
    images = "".join(f'<img src="data:image/png;base64,{b}">' for b in _plots(rows))
    page = (f"<!doctype html><meta charset='utf-8'><title>{html.escape(title)}</title>"
            "<style>body{font-family:sans-serif}table{border-collapse:collapse;font-size:12px}"
            "td,th{border:1px solid #ccc;padding:2px 6px}img{margin:4px}</style>"
            f"<h1>{html.escape(title)}</h1><p>{len(rows)} jobs: {counts['ok']} ok, {counts['failed']} failed, "
            f"{counts['skipped']} skipped (results.jsonl has every row)</p>{images}"
            "<table><tr>" + "".join(f"<th>{html.escape(c)}</th>" for c in columns) + f"</tr>{body}</table>")
    path = root / "summary.html"
    _replace(path, page)
    return path

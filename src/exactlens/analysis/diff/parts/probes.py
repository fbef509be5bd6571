"""The ``probes`` part: the probe table (held-out R^2 of a ridge probe of every exact residual label at every
trained site; the fits are the shared input ``probe_fits``)."""

from __future__ import annotations

from typing import Any

from exactlens.analysis.diff.parts.base import Done, Part, number
from exactlens.markup import esc, heat, num


def run(ctx: Any, request: Any) -> Done:
    return Done({"probes": ctx.values["probe_fits"][0]})


def text(result: dict[str, Any]) -> list[str]:
    lines = ["  feature                  best trained site                    R^2"]
    for f in result["probes"]["features"]:
        lines.append(f"  {f['label']:24s} {str(f['best_site']):36s} {number(f['best_r2'])}")
    return lines


def probe_heatmap(probes: dict[str, Any]) -> str:
    """Features x trained sites, each cell the held-out R^2 coloured white (<= 0) to green (1)."""
    sites = probes["sites"]
    head = "<th>feature</th><th>positions</th><th>exact site</th>" + "".join(
        f"<th><code>{esc(s)}</code></th>" for s in sites
    )
    rows = []
    for f in probes["features"]:
        cells = "".join(f'<td style="background:{heat(f["r2"][s])}">{num(f["r2"][s])}</td>' for s in sites)
        rows.append(
            f"<tr><td class=l>{esc(f['label'])}</td><td class=l>{esc(f['positions'])}</td>"
            f"<td class=l><code>{esc(f['exact_site'])}</code></td>{cells}</tr>"
        )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>"


def page(result: dict[str, Any]) -> list[str]:
    return [
        "<h3>Named features: held-out R^2 of a ridge probe per trained site</h3>",
        "<p>Row: a residual label of the exact model (its value after the exact model's last layer; "
        "<em>readout</em> rows use only the readout position). Column: a hook site of the trained "
        "model. Green = the feature is a linear function of that activation on held-out words.</p>",
        probe_heatmap(result["probes"]),
    ]


PART = Part("probes", run, ("probe_fits",), ("probes",), order=30, text=text, page=page, help="the probe table")

"""A circuit as an inline SVG: nodes in computation order (embeddings left, output right, one column
per layer's heads and one per its FFN and norms), every edge of the graph drawn faintly, the
circuit's edges drawn strongly (dashed where constant: the ablation used cannot move them), and at qkv
granularity each head's query, key and value inputs as three ports. A position-resolved circuit is
drawn per edge over all positions (constant only where every position is), the positions on hover.

The faint edges are one SVG path (a graph can have thousands: tracr-shuffle_dyck2's 1,400 edges took
320 KB of the report as one element each); the circuit's edges keep one element each, with their name
and features on hover. Coordinates are written without trailing zeros (they are whole or half units)."""

from __future__ import annotations

from html import escape
from typing import Any

BOX_W, BOX_H, COL_W, ROW_H, MARGIN = 74, 26, 120, 40, 14
TOP = 2 * ROW_H  # room above the first row for arcs
SLOT_OFFSET = {"q": -8, "k": 0, "v": 8, None: 0}
CIRCUIT, CONSTANT, OTHER = "#1f4e9a", "#6f8fc9", "#d5d9e0"


def _columns(nodes: list[str]) -> dict[str, tuple[int, int]]:
    """node -> (column, row)."""
    where: dict[str, tuple[int, int]] = {}
    rows: dict[int, int] = {}
    for node in nodes:
        if node in ("embed", "pos"):
            col = 0
        elif node == "output":
            col = -1
        else:
            layer, part = node.split(".", 1)
            col = 2 * int(layer[1:]) + (1 if part.startswith("H") else 2)
        rows[col] = rows.get(col, -1) + 1
        where[node] = (col, rows[col])
    last = max(c for c, _ in where.values()) + 1
    return {n: (last if c == -1 else c, r) for n, (c, r) in where.items()}


def _without_positions(circuit: dict[str, Any], all_edges: list[str]) -> tuple[dict[str, Any], list[str]]:
    """A position-resolved circuit as one edge per sender and receiving input: in the circuit where any
    position is, constant where every position is, its positions listed with the features."""
    merged: dict[str, dict[str, Any]] = {}
    for e in circuit["edges"]:
        whole, _, at = e["edge"].rpartition("@")
        m = merged.setdefault(whole, {**e, "edge": whole, "constant": True, "positions": []})
        m["constant"] = bool(m["constant"] and e.get("constant"))
        m["positions"].append(at)
    for m in merged.values():
        m["features"] = [*m["features"], f"at positions {' '.join(m['positions'])}"]
    wholes = list(dict.fromkeys(e.rpartition("@")[0] or e for e in all_edges))
    return {**circuit, "edges": list(merged.values())}, wholes


def circuit_svg(circuit: dict[str, Any], all_edges: list[str] | None = None) -> str:
    """SVG of a circuit as ``circuit_report``/``Circuit.to_dict`` gives it; ``all_edges`` (names of
    every edge of the graph; default its ``graph_edges``) are drawn faintly under it. An edge dict may
    carry its own ``colour`` (a comparison of two circuits colours shared and one-sided edges)."""
    all_edges = circuit.get("graph_edges", []) if all_edges is None else all_edges
    if any("@" in e["edge"] for e in circuit["edges"]) or any("@" in e for e in all_edges or []):
        circuit, all_edges = _without_positions(circuit, all_edges)
    nodes = circuit["nodes"]
    place = _columns(nodes)
    n_cols = max(c for c, _ in place.values()) + 1
    n_rows = max(r for _, r in place.values()) + 1
    width, height = 2 * MARGIN + (n_cols - 1) * COL_W + BOX_W, TOP + 2 * MARGIN + (n_rows - 1) * ROW_H + BOX_H + 18

    def anchor(node: str, out: bool, slot: str | None = None) -> tuple[float, float]:
        col, row = place[node]
        x = MARGIN + col * COL_W + (BOX_W if out else 0)
        return x, TOP + MARGIN + row * ROW_H + BOX_H / 2 + SLOT_OFFSET[slot]

    def curve(edge: str) -> str:
        """The edge's SVG path data: from the sender's right side to the receiver's (port on the) left."""
        sender, target = edge.split("->")
        receiver, slot = (target.rsplit(".", 1) if target.endswith((".q", ".k", ".v")) else (target, None))
        (x1, y1), (x2, y2) = anchor(sender, True), anchor(receiver, False, slot)
        bend = max(20.0, (x2 - x1) / 2)
        # an edge that skips columns arcs over the boxes between (else it would seem to pass through them)
        skipped = max(0, place[receiver][0] - place[sender][0] - 1)
        lift = 0.75 * ROW_H * min(skipped, 3)
        return f"M{x1:g},{y1:g}C{x1 + bend:g},{y1 - lift:g} {x2 - bend:g},{y2 - lift:g} {x2:g},{y2:g}"

    def path(edge: str, colour: str, width_: float, dash: str = "") -> str:
        return (f'<path d="{curve(edge)}" fill="none" stroke="{colour}" stroke-width="{width_}"{dash}>'
                f'<title>{escape(edge)}</title></path>')

    inside = {e["edge"]: e for e in circuit["edges"]}
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" class="circuit" width="{width}" height="{height}" '
             f'viewBox="0 0 {width} {height}" role="img" aria-label="circuit graph">']
    faint = [e for e in (all_edges or []) if e not in inside]
    if faint:
        parts.append(f'<path d="{"".join(curve(e) for e in faint)}" fill="none" stroke="{OTHER}" stroke-width="0.8">'
                     f"<title>{len(faint)} edges of the graph outside the circuit</title></path>")
    for name, e in inside.items():
        features = ", ".join(e["features"])
        dash = ' stroke-dasharray="4 3"' if e.get("constant") else ""
        colour = e.get("colour") or (CONSTANT if e.get("constant") else CIRCUIT)
        parts.append(path(name, colour, 2.0, dash).replace(
            f"<title>{escape(name)}</title>", f"<title>{escape(name)}: {escape(features)}</title>"))
    active = set(circuit.get("circuit_nodes", []))
    for node in nodes:
        col, row = place[node]
        x, y = MARGIN + col * COL_W, TOP + MARGIN + row * ROW_H
        fill = "#e3ecfa" if node in active else "#f4f5f7"
        parts.append(f'<rect x="{x}" y="{y}" width="{BOX_W}" height="{BOX_H}" rx="4" fill="{fill}" '
                     f'stroke="#8a94a6"/><text x="{x + BOX_W / 2}" y="{y + BOX_H / 2 + 4}" text-anchor="middle" '
                     f'font-size="11" font-family="monospace">{escape(node)}</text>')
    legend = circuit.get("legend") or ("solid: circuit edge; dashed: circuit edge with a constant activation; "
                                       "faint: not in the circuit. Hover an edge for its features.")
    parts.append(f'<text x="{MARGIN}" y="{height - 4}" font-size="10" fill="#555">{escape(legend)}</text></svg>')
    return "".join(parts)

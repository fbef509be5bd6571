"""Pictures of a timeline (``exactlens timeline RUN --against NAME``): how a trained model became the
exact circuit over its checkpoints.

:func:`timeline_figure` draws the metrics against the optimizer step (behaviour, agreement, circuit
overlap; per variable the IIA of its verdict with the 95 % interval as a band) with the formation
events as vertical lines. The step axis is symlog (linear on [0, 1], logarithmic above), so step 0,
the initialization, has a place on it. :func:`iia_strip_figure` draws one small heat map per checkpoint
(variables x sites, the IIA), side by side. :func:`timeline_html` is the page fragment (both figures,
the table of checkpoints, the events, attention views); :func:`write_timeline_page` a standalone page
with its files in a folder next to it, staged like every output.

Every value of a timeline may be null (with a reason elsewhere in the result): a null is a gap in a
curve and a dash in a table, never a zero.
"""

from __future__ import annotations

import contextlib
import html
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from exactlens.outputs import check_output, naming, save_figure, staged
from exactlens.viz.backend import pyplot

__all__ = ["iia_strip_figure", "timeline_figure", "timeline_html", "write_timeline_page"]

BEHAVIOUR = (("accuracy", "accuracy (training lengths)", "#1f77b4", "-"),
             ("long_accuracy", "accuracy (long lengths)", "#17becf", "--"),
             ("agreement", "agreement with the exact model", "#2ca02c", "-."),
             ("circuit_overlap", "circuit overlap (edge Jaccard)", "#7f7f7f", ":"))
EVENT_COLOURS = {"behaviour": "#1f77b4", "long_behaviour": "#17becf", "circuit": "#7f7f7f"}
STEP_AXIS = "optimizer step (symlog axis: linear on [0, 1], log above; step 0 = initialization)"


def _number(value: Any) -> float:
    """A plottable float: None and non-numbers become NaN (a gap), never 0."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return math.nan
    return float(value)


def against(data: dict[str, Any]) -> Any:
    """The exact construction's name (top level, or the exact side's info)."""
    return data.get("against") or (data.get("exact") or {}).get("name")


def lengths_of(data: dict[str, Any], key: str) -> Any:
    """``lengths`` or ``long_lengths``: top level, or in the timeline's settings."""
    return data.get(key) if data.get(key) is not None else (data.get("settings") or {}).get(key)


def overlap(checkpoint: dict[str, Any]) -> Any:
    """The circuit overlap of a checkpoint as one number: the edge Jaccard where it is a record."""
    value = checkpoint.get("circuit_overlap")
    return value.get("edge_jaccard") if isinstance(value, dict) else value


def _checkpoints(data: dict[str, Any]) -> list[dict[str, Any]]:
    rows = [c for c in data.get("checkpoints") or [] if isinstance(c, dict) and c.get("step") is not None]
    return sorted(rows, key=lambda c: c["step"])


def variables(data: dict[str, Any]) -> list[str]:
    """The variables of a timeline, in the order they first appear."""
    names: list[str] = []
    for c in _checkpoints(data):
        for name in c.get("verdicts") or {}:
            if name not in names:
                names.append(name)
    for name in ((data.get("events") or {}).get("variables") or {}):
        if name not in names:
            names.append(name)
    return names


def events(data: dict[str, Any]) -> list[tuple[int, str, str]]:
    """(step, label, colour) of every formation event that happened (a null step: none)."""
    found = data.get("events") or {}
    marks = []
    colours = _variable_colours(variables(data))
    for name, event in (found.get("variables") or {}).items():
        if isinstance(event, dict) and event.get("step") is not None:
            marks.append((event["step"], f"{name} computed", colours.get(name, "#d62728")))
    for key, label in (("behaviour", "accuracy >= 0.99"), ("long_behaviour", "long accuracy >= 0.99"),
                       ("circuit", "circuit overlap final")):
        if found.get(key) is not None:
            marks.append((found[key], label, EVENT_COLOURS[key]))
    return sorted(marks, key=lambda m: m[0])


def _variable_colours(names: Sequence[str]) -> dict[str, Any]:
    plt = pyplot()
    cmap = plt.get_cmap("tab10")
    palette = [cmap(i) for i in (3, 1, 4, 5, 6, 8, 0, 2, 7, 9)]  # red, orange, purple, ... first
    return {name: palette[i % len(palette)] for i, name in enumerate(names)}


def _step_axis(ax: Any, steps: Sequence[int]) -> None:
    ax.set_xscale("symlog", linthresh=1.0, linscale=0.4)
    ax.set_xlim(-0.1 if not steps else min(steps) - 0.1, max(1, *steps) * 1.15 if steps else 10)
    ax.grid(True, which="major", alpha=0.3)


def _mark_events(axes: Sequence[Any], marks: list[tuple[int, str, str]], label_axis: Any) -> None:
    """Vertical lines at the events on every axis; their labels on ``label_axis``, staggered so that
    events at nearby steps stay readable."""
    for ax in axes:
        for step, _, colour in marks:
            ax.axvline(step, color=colour, linestyle="--", linewidth=1.0, alpha=0.8)
    last = max((m[0] for m in marks), default=0)
    for i, (step, label, colour) in enumerate(marks):
        right = step == last and step > 0  # the last events are labelled on the line's left
        label_axis.annotate(f"{label}\n(step {step})", xy=(step, 1.0), xycoords=("data", "axes fraction"),
                            xytext=(-3 if right else 3, -10 - 22 * (i % 3)), textcoords="offset points", fontsize=7,
                            color=colour, va="top", ha="right" if right else "left")


def timeline_figure(data: dict[str, Any], title: str | None = None) -> Any:
    """The metrics of a timeline against the step, events marked: a matplotlib Figure of two panels
    (behaviour, circuit overlap and the attention from [CLS] to the first symbol beside the exact model's;
    per variable the IIA of its verdict, 95 % interval as a band)."""
    plt = pyplot()
    rows = _checkpoints(data)
    steps = [c["step"] for c in rows]
    names = variables(data)
    colours = _variable_colours(names)
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(10.5, 6.4), sharex=True, layout="constrained")
    for key, label, colour, style in BEHAVIOUR:
        values = [_number(overlap(c) if key == "circuit_overlap" else c.get(key)) for c in rows]
        if key == "long_accuracy" and lengths_of(data, "long_lengths"):
            label = f"accuracy at |w| in {_span(lengths_of(data, 'long_lengths'))}"
        elif key == "accuracy" and lengths_of(data, "lengths"):
            label = f"accuracy at |w| in {_span(lengths_of(data, 'lengths'))}"
        if any(not math.isnan(v) for v in values):
            top.plot(steps, values, style, color=colour, marker="o", markersize=3, label=label)
    attention = [_number((c.get("attention") or {}).get("cls_to_first")) for c in rows]
    if any(not math.isnan(v) for v in attention):  # summed over layers: may exceed 1
        top.plot(steps, attention, "-", color="#8c564b", marker="s", markersize=3,
                 label="attention [CLS] -> first symbol (sum over layers)")
        exact = [_number((c.get("attention") or {}).get("cls_to_first_exact")) for c in rows]
        if any(not math.isnan(v) for v in exact):
            top.axhline(next(v for v in exact if not math.isnan(v)), color="#8c564b", linestyle=":", linewidth=1,
                        label="... in the exact model")
    top.set_ylabel("fraction; attention weight")
    highest = max([1.0, *(v for line in top.get_lines() for v in line.get_ydata() if not math.isnan(v))])
    top.set_ylim(-0.03, highest * 1.03)
    if top.get_lines():
        top.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    for name in names:
        verdicts = [(c.get("verdicts") or {}).get(name) or {} for c in rows]
        iia = [_number(v.get("iia")) for v in verdicts]
        ci = [v.get("iia_ci") if isinstance(v.get("iia_ci"), (list, tuple)) and len(v["iia_ci"]) == 2 else None
              for v in verdicts]
        lo = [_number(c[0]) if c else math.nan for c in ci]
        hi = [_number(c[1]) if c else math.nan for c in ci]
        bottom.plot(steps, iia, "-", color=colours[name], marker="o", markersize=3, label=f"{name}: IIA")
        bottom.fill_between(steps, lo, hi, color=colours[name], alpha=0.12, linewidth=0)
        p95 = [_number(v.get("random_iia_p95")) for v in verdicts]
        if any(not math.isnan(v) for v in p95):
            bottom.plot(steps, p95, ":", color=colours[name], linewidth=1, label=f"{name}: random subspace p95")
    bottom.axhline(0.9, color="#555", linewidth=0.6, linestyle="-.")
    bottom.set_ylabel("IIA on changed pairs (95 % band)")
    bottom.set_ylim(-0.03, 1.03)
    if names:
        bottom.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    else:
        bottom.text(0.5, 0.5, "no alignment verdicts in this timeline", transform=bottom.transAxes, ha="center")
    bottom.set_xlabel(STEP_AXIS, fontsize=8)
    for ax in (top, bottom):
        _step_axis(ax, steps)
    _mark_events((top, bottom), events(data), top)
    fig.suptitle(title or f"formation of the {against(data) or '?'} circuit over {len(rows)} checkpoints",
                 fontsize=10)
    return fig


def _span(lengths: Any) -> str:
    """A list of lengths, shortened when long: [1, 2, ..., 32]."""
    if isinstance(lengths, (list, tuple)) and len(lengths) > 4:
        return f"[{lengths[0]}, {lengths[1]}, ..., {lengths[-1]}]"
    return str(list(lengths) if isinstance(lengths, tuple) else lengths)


def _cells(checkpoint: dict[str, Any]) -> dict[tuple[str, str], float]:
    """(variable, site) -> IIA of one checkpoint: its per-site alignment rows where the timeline kept
    them (``alignment``: diff-style rows; the best of a site's positions), else each verdict's IIA at
    its chosen site (a verdict that claims no site, e.g. "indistinguishable from the answer", in a
    column of its own)."""
    cells: dict[tuple[str, str], float] = {}
    for r in checkpoint.get("alignment") or []:
        if isinstance(r, dict) and r.get("site") and r.get("test", "interchange") == "interchange":
            value = _number(r.get("iia_changed", r.get("iia")))
            key = (r.get("variable"), r["site"])
            if not math.isnan(value) and not value <= cells.get(key, -1.0):  # the best of the site's positions
                cells[key] = value
            cells.setdefault(key, math.nan)
    if not cells:  # only the verdicts: each at its chosen site, or in a column of its own without one
        for name, v in (checkpoint.get("verdicts") or {}).items():
            if isinstance(v, dict) and v.get("iia") is not None:
                cells[(name, v.get("site") or NO_SITE)] = _number(v.get("iia"))
    return cells


def iia_strip_figure(data: dict[str, Any], most: int = 12) -> Any:
    """One heat map per checkpoint (rows: variables, columns: sites; colour: IIA, grey: not measured),
    side by side; at most ``most`` checkpoints (evenly chosen, first and last kept). None when no
    checkpoint has an alignment."""
    plt = pyplot()
    rows = _checkpoints(data)
    if len(rows) > most:
        keep = sorted({round(i * (len(rows) - 1) / (most - 1)) for i in range(most)})
        rows = [rows[i] for i in keep]
    cells = [_cells(c) for c in rows]
    names = variables(data)
    sites = sorted({site for found in cells for _, site in found}, key=_site_order)
    if not names or not sites:
        return None
    import numpy as np

    width = max(1.2, 0.32 * len(sites) + 0.5)
    fig, axes = plt.subplots(1, len(rows), figsize=(min(2 + width * len(rows), 30), 1.4 + 0.3 * len(names)),
                             sharey=True, squeeze=False, layout="constrained")
    cmap = plt.get_cmap("Greens").with_extremes(bad="#e6e6e6")
    image = None
    for ax, checkpoint, found in zip(axes[0], rows, cells, strict=True):
        grid = np.full((len(names), len(sites)), np.nan)
        for (name, site), value in found.items():
            if name in names and site in sites:
                grid[names.index(name), sites.index(site)] = value
        image = ax.imshow(np.ma.masked_invalid(grid), vmin=0.0, vmax=1.0, cmap=cmap, aspect="auto")
        ax.set_title(f"step {checkpoint['step']}", fontsize=8)
        ax.set_xticks(range(len(sites)), [_short_site(s) for s in sites], rotation=90, fontsize=6)
        ax.set_yticks(range(len(names)), names, fontsize=7)
    if image is not None:
        fig.colorbar(image, ax=axes, shrink=0.9, label="IIA")
    return fig


NO_SITE = "(no site claimed)"


def _site_order(site: str) -> tuple:
    if site == NO_SITE:
        return (10**6, site)
    parts = site.replace("blocks.", "").split(".")
    layer = int(parts[0]) if parts and parts[0].isdigit() else -1
    return (layer, site)


def _short_site(site: str) -> str:
    return site.replace("blocks.", "").replace("hook_", "")


# ---- the page ---------------------------------------------------------------------------------------

_CSS = """
body { font-family: system-ui, sans-serif; margin: 0 auto; max-width: 1200px; padding: 1em 2em; color: #222; }
table { border-collapse: collapse; margin: .5em 0 1em; font-size: .85em; display: block; max-width: 100%;
        overflow-x: auto; }
th, td { border: 1px solid #ddd; padding: 2px 6px; text-align: right; } th { background: #f4f4f4; }
td.l { text-align: left; } img { max-width: 100%; height: auto; border: 1px solid #eee; }
.views { display: flex; gap: 1em; } .views > div { flex: 1; min-width: 0; }
iframe { width: 100%; height: 520px; border: 1px solid #ddd; } code { background: #f3f3f3; padding: 0 .2em; }
"""


def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _n(value: Any, digits: int = 3) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "–"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return _e(value)


def _ci(ci: Any) -> str:
    if not isinstance(ci, (list, tuple)) or len(ci) != 2 or None in ci:
        return ""
    return f" [{ci[0]:.2f}, {ci[1]:.2f}]"


def checkpoint_table(data: dict[str, Any]) -> str:
    """One row per checkpoint: behaviour, circuit overlap, CLS-to-first attention, per variable the
    verdict (IIA with its interval, site)."""
    names = variables(data)
    head = ["step", "epoch", "accuracy", "long accuracy", "agreement", "circuit overlap (edge Jaccard)",
            "CLS -> first",
            *[f"{name}: verdict, IIA [95 %], site" for name in names], "seconds"]
    body = []
    for c in _checkpoints(data):
        attention = c.get("attention") or {}
        cells = [_n(c.get("step")), _n(c.get("epoch")), _n(c.get("accuracy")), _n(c.get("long_accuracy")),
                 _n(c.get("agreement")), _n(overlap(c)), _n(attention.get("cls_to_first"))]
        for name in names:
            v = (c.get("verdicts") or {}).get(name) or {}
            cells.append(f"<td class=l>{_e(v.get('verdict') or '–')}<br><small>{_n(v.get('iia'))}"
                         f"{_e(_ci(v.get('iia_ci')))} {_e(v.get('site') or '')}</small></td>")
        cells.append(_n(c.get("seconds"), 1))
        body.append("<tr>" + "".join(x if x.startswith("<td") else f"<td>{x}</td>" for x in cells) + "</tr>")
    header = "".join(f"<th>{_e(h)}</th>" for h in head)
    return f"<table><thead><tr>{header}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def events_html(data: dict[str, Any]) -> str:
    found = data.get("events") or {}
    items = [f"<li>{_e(label)}: step {_e(step)}</li>" for step, label, _ in events(data)]
    missing = [name for name, event in (found.get("variables") or {}).items()
               if not isinstance(event, dict) or event.get("step") is None]
    unmeasured = set(found.get("not_measured") or ())  # a part not asked for: nothing to reach
    behaviours = (("behaviour", "accuracy >= 0.99"), ("long_behaviour", "long accuracy >= 0.99"),
                  ("circuit", "circuit overlap final"))
    missing += [label for key, label in behaviours if found.get(key) is None and key not in unmeasured]
    text = f"<p><b>{_e(found.get('order') or 'no order stated')}</b></p>"
    if items:
        text += f"<ul>{''.join(items)}</ul>"
    if missing:
        text += f"<p>Not reached within the checkpoints: {_e(', '.join(missing))}.</p>"
    if unmeasured:
        text += f"<p>Not measured (its part was not asked for): " \
                f"{_e(', '.join(label for key, label in behaviours if key in unmeasured))}.</p>"
    return text


def timeline_html(data: dict[str, Any], figure: str | None = None, strip: str | None = None,
                  views: Sequence[tuple[str, str]] = ()) -> str:
    """The timeline as an HTML fragment: ``figure`` and ``strip`` are relative links to the PNGs of
    :func:`timeline_figure` and :func:`iia_strip_figure`, ``views`` (caption, link) pairs of attention
    pages."""
    rows = _checkpoints(data)
    parts = [
        f"<p>A timeline against <code>{_e(against(data))}</code>: {len(rows)} checkpoints, steps "
        f"{_e(', '.join(str(c['step']) for c in rows))}; behaviour on |w| in {_e(lengths_of(data, 'lengths'))}, "
        f"long lengths {_e(lengths_of(data, 'long_lengths'))}.</p>",
        "<h3>Formation events</h3>", events_html(data),
    ]
    if figure:
        parts.append(f'<p><a href="{_e(figure)}"><img src="{_e(figure)}" alt="metrics against the step"></a><br>'
                     "<small>Top: behaviour and circuit overlap; bottom: per variable the IIA of its alignment "
                     "verdict on held-out pairs whose answer changes, its 95 % interval as a band (dotted: the "
                     "95th percentile of random subspaces). Dashed vertical lines: the formation events. The step "
                     "axis is symlog (linear on [0, 1], log above) so that step 0 shows.</small></p>")
    parts += ["<h3>Checkpoints</h3>", checkpoint_table(data)]
    if strip:
        parts.append("<h3>IIA per checkpoint (variables x sites)</h3>"
                     f'<p><a href="{_e(strip)}"><img src="{_e(strip)}" alt="IIA heat map per checkpoint"></a><br>'
                     "<small>One heat map per checkpoint: rows the variables, columns the trained model's sites, "
                     "colour the IIA (grey: not measured there).</small></p>")
    if views:
        cells = "".join(f'<div><h4>{_e(caption)}</h4><iframe src="{_e(link)}"></iframe></div>'
                        for caption, link in views)
        parts.append(f'<h3>Attention on one word (circuitsvis)</h3><div class="views">{cells}</div>')
    return "\n".join(parts)


def pick_checkpoints(count: int, most: int = 3) -> list[int]:
    """Indices of the first, middle and last of ``count`` checkpoints (fewer when there are fewer)."""
    if count <= 0:
        return []
    return sorted({0, (count - 1) // 2, count - 1})[:most]


def write_figures(data: dict[str, Any], folder: Path) -> tuple[Path, Path | None]:
    """timeline.png and iia_strip.png (when there is an alignment) into ``folder``."""
    plt = pyplot()
    folder.mkdir(parents=True, exist_ok=True)
    fig = timeline_figure(data)
    figure = save_figure(fig, folder / "timeline.png", dpi=100)
    plt.close(fig)
    fig = iia_strip_figure(data)
    strip = None
    if fig is not None:
        strip = save_figure(fig, folder / "iia_strip.png", dpi=100)
        plt.close(fig)
    return figure, strip


def write_attention_views(data: dict[str, Any], models: Sequence[tuple[int, Any]], folder: Path,
                          bundle_dir: Path | None = None, word_length: int = 8) -> list[tuple[str, Path]]:
    """circuitsvis pages of the given (step, model) pairs and of the exact model on one word (drawn
    from the task of ``against``), in ``folder``: [(caption, path)]. The models must be
    ExactTransformers (the views read cfg.vocab); others are skipped."""
    import torch

    from exactlens.constructions import get
    from exactlens.model import ExactTransformer
    from exactlens.viz.attention import attention_view

    construction = get(against(data))
    lang = construction.lang()
    given = lengths_of(data, "lengths") or [word_length]
    lengths = [n for n in given if isinstance(n, int) and n >= 1] or [word_length]
    length = min(word_length, max(lengths))
    ids = lang.sample(length, 1, torch.Generator().manual_seed(0))
    tokens = lang.encode(ids).tokens[0]
    word = lang.decode(ids)[0]
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for step, model in models:
        if isinstance(model, ExactTransformer):
            path = attention_view(model, tokens, folder / f"step{step:08d}.html", f"step {step} on w = {word}",
                                  bundle_dir)
            written.append((f"step {step}", path))
    exact = construction.make(**(data.get("params") or (data.get("exact") or {}).get("params") or {}))
    written.append((f"exact {construction.name}",
                    attention_view(exact, tokens, folder / "exact.html", f"{construction.name} on w = {word}",
                                   bundle_dir)))
    return written


def checkpoint_models(source: Any, data: dict[str, Any]) -> list[tuple[int, Any]]:
    """(step, model) of the first, middle and last checkpoint of ``source``: a run directory with checkpoints,
    a train result or run, a list of Checkpoints (exactlens.train.checkpoints), of (step, model) pairs, or the
    list a timeline was given (models or checkpoint directories; the steps from ``data``'s rows). Items that
    are no model (state dicts) give no view."""
    from exactlens.model import ExactTransformer
    from exactlens.train.checkpoints import Checkpoint, read_checkpoints

    if hasattr(source, "run") and not isinstance(source, (str, Path, list, tuple)):
        source = source.run  # a train Result
    if isinstance(source, (str, Path)):
        source = read_checkpoints(source)
    elif hasattr(source, "checkpoints") and not isinstance(source, (list, tuple)):
        source = source.checkpoints or []
    items = list(source) if isinstance(source, (list, tuple)) else []
    steps = [c["step"] for c in _checkpoints(data)]
    found = []
    for i in pick_checkpoints(len(items)):
        item = items[i]
        if isinstance(item, Checkpoint):
            found.append((item.step, item.model()))
        elif isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], int):
            found.append((item[0], item[1]))
        elif len(steps) == len(items) and isinstance(item, (str, Path)):
            found.append((steps[i], ExactTransformer.load(item).eval()))
        elif len(steps) == len(items) and isinstance(item, ExactTransformer):
            found.append((steps[i], item))
    return found


def write_timeline_page(data: dict[str, Any], path: str | Path, checkpoints: Any = None, *,
                        overwrite: bool = False) -> Path:
    """A standalone page of a timeline: the figure, the IIA strip, the table, the events and (with
    ``checkpoints``: a run directory, Checkpoints or (step, model) pairs) attention views at the first,
    middle and last checkpoint beside the exact model's. Its files go to PATH_stem_files/ next to it;
    both appear only when complete (the folder first), existing ones refused unless ``overwrite``."""
    path = Path(path)
    folder = path.parent / f"{path.stem}_files"
    check_timeline_page(path, overwrite)
    title = f"exactlens timeline against {against(data)}"
    with contextlib.ExitStack() as stack:
        page_tmp = stack.enter_context(staged(path, overwrite=overwrite, kind="file", what="timeline page"))
        tmp = stack.enter_context(staged(folder, overwrite=overwrite, what="timeline page folder"))
        figure, strip = write_figures(data, tmp)
        views = []
        if checkpoints is not None:
            models = checkpoint_models(checkpoints, data)
            views = write_attention_views(data, models, tmp / "attention")

        def link(p: Path | None) -> str | None:
            return None if p is None else (folder / p.relative_to(tmp)).relative_to(path.parent).as_posix()

        body = timeline_html(data, link(figure), link(strip), [(c, link(p)) for c, p in views])
        page = (f'<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n<title>{_e(title)}</title>\n'
                f"<style>{_CSS}</style>\n</head>\n<body>\n<h1>{_e(title)}</h1>\n{body}\n</body>\n</html>\n")
        with naming(path):
            page_tmp.write_text(page, encoding="utf-8")
    return path


def check_timeline_page(path: str | Path, overwrite: bool = False) -> None:
    """Check, before a timeline is computed, that its page and folder can be written."""
    path = Path(path)
    check_output(path, overwrite=overwrite, kind="file", what="timeline page")
    check_output(path.parent / f"{path.stem}_files", overwrite=overwrite, what="timeline page folder")

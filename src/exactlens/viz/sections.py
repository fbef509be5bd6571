"""The generic sections of the report: an overview, and one section per construction (its paper
and architecture, verification and precision frontier in float32 and float64, attention on an
example word, the labelled residual stream). Every construction gets the same treatment, whatever
its task's kind."""

from __future__ import annotations

import inspect
import time
from pathlib import Path
from typing import Any

import torch

from exactlens import tasks
from exactlens.constructions import get
from exactlens.outputs import save_figure
from exactlens.viz.backend import pyplot
from exactlens.viz.circuit_sections import circuit_html
from exactlens.viz.page import ReportContext, Section, esc, figure, fmt, progress, slug, table
from exactlens.viz.parallel import per_construction

# ---- builder: overview ---------------------------------------------------------------


def overview_sections(ctx: ReportContext) -> list[Section]:
    if not ctx.names and ctx.user_model is not None:  # a report on the user's model alone: its section says it all
        return []
    s = ctx.settings
    items = "".join(
        f'<li><a href="#{esc("construction-" + slug(n))}">{esc(n)}</a> — '
        f"{esc(get(n).paper)}: {esc(get(n).summary)}</li>"
        for n in ctx.names
    )
    text = (
        "<p>Hand-built (&quot;exact&quot;) transformers as hooked models: for each construction, its "
        "paper and parameters, accuracy and cross-entropy on random strings in float32 and float64, the "
        "longest length at which floating point keeps it exact, its attention on an example string, and its "
        "labelled residual stream. Everything on this page is local (no network): attention views inline "
        "circuitsvis, figures are PNG files, numbers are also in <code>data/*.json</code>.</p>"
        f"<p>Settings{' (quick)' if ctx.quick else ''}: verification at lengths "
        f"{esc(', '.join(map(str, s.verify_lengths)))} with up to {s.verify_strings} random strings per length "
        "(every string where there are at most 4096); precision frontier up to length "
        f"{s.precision_max_length} ({s.precision_strings} random strings per length plus the language's hard "
        f"strings); example strings of length {s.example_length}.</p>"
        f"<ul>{items}</ul>"
    )
    return [Section("Overview", "overview", text)]


# ---- builder: one section per construction -------------------------------------------


def _lengths(name: str, wanted: list[int] | tuple[int, ...], model: Any) -> list[int]:
    """The wanted lengths that the construction's model answers."""
    low, high = get(name).length_range(model)
    return [n for n in wanted if n >= low and (high is None or n <= high)]


def _example_tokens(ctx: ReportContext, name: str, model: Any) -> tuple[str, torch.Tensor]:
    task = tasks.of_model(model)  # with the parameters the model was built for
    low, high = get(name).length_range(model)
    length = max(low, ctx.settings.example_length if high is None else min(ctx.settings.example_length, high))
    ids = task.sample(length, 1, torch.Generator().manual_seed(1234))
    return task.decode(ids)[0], task.encode(ids).tokens[0]


def _architecture(model: Any) -> list[list[Any]]:
    cfg = model.cfg

    def switch(name: str) -> str:  # one value, or one per layer
        value = cfg.uniform(name)
        return value if value is not None else " | ".join(cfg.per_layer(name))

    attention = f"{switch('attention_weighting')}, mask {switch('attention_mask')}, scores / {fmt(cfg.scale_divisor)}"
    if switch("attn_length_scale") != "none":
        attention += f" x {switch('attn_length_scale')}"
    layers = cfg.per_layer("normalization")
    norm = layers[0] if cfg.uniform("normalization") else "/".join(layers) + " (per layer)"
    norm += f", eps={cfg.ln_eps}" if set(layers) != {"none"} else ""
    norm += ", selective (LN(x W_select))" if cfg.ln_select else ""
    return [
        ["layers", cfg.n_layers],
        ["heads", cfg.n_heads],
        ["d_model", cfg.d_model],
        ["d_head", cfg.d_head],
        ["d_mlp", cfg.d_mlp],
        ["attention", attention],
        ["layer norm", norm],
        ["positions", ", ".join(cfg.positional_features) or "none"],
        ["readout", cfg.readout],
    ]


def _verify_html(ctx: ReportContext, name: str, record: dict[str, Any]) -> str:
    from exactlens.analysis.verify import verify

    lengths = _lengths(name, ctx.settings.verify_lengths, get(name).make())
    results = {}
    for dtype in ("float32", "float64"):
        results[dtype] = verify(name, lengths, strings=ctx.settings.verify_strings, dtype=dtype,
                                device=ctx.device_for(dtype))
    record["verify"] = results
    kind = (results["float32"]["task"] or {}).get("kind")
    # Per kind, the columns that mean something: margins for decisions, errors for regression.
    columns = [("accuracy", "acc"), ("cross_entropy_bits", "CE bits"), ("min_abs_logit", "min margin")]
    if kind == "prediction":
        columns.insert(1, ("per_position_accuracy", "pos. acc"))
    if kind == "regression":
        columns = [("accuracy", "exact"), ("max_abs_error", "max |error|"), ("tolerance", "tolerance")]
    rows = []
    for j, n in enumerate(lengths):
        r32, r64 = results["float32"]["results"][j], results["float64"]["results"][j]
        strings = f"{r32['strings']}{' (all)' if r32['exhaustive'] else ''}"
        rows.append([n, strings, *[r32.get(k) for k, _ in columns], *[r64.get(k) for k, _ in columns]])
    headers = ["|w|", "strings", *[f"{h} f32" for _, h in columns], *[f"{h} f64" for _, h in columns]]
    rule = results["float32"]["decision_rule"]
    return (
        f"<h3>Verification</h3><p>Task <code>{esc(kind)}</code>; outputs read by the {esc(rule)} rule.</p>"
        + table(headers, rows)
    )


def _precision_html(ctx: ReportContext, name: str, record: dict[str, Any]) -> str:
    from exactlens.analysis.verify import log_grid, precision

    low, high = get(name).length_range(get(name).make())
    top = ctx.settings.precision_max_length if high is None else min(ctx.settings.precision_max_length, high)
    grid = sorted(
        set(range(max(1, low), min(16, top) + 1))
        | set(log_grid(top, ctx.settings.precision_points_per_decade, start=16) if top > 16 else [])
    )
    results = {
        dtype: precision(name, dtype=dtype, max_length=top, strings=ctx.settings.precision_strings, lengths=grid,
                         device=ctx.device_for(dtype))
        for dtype in ("float32", "float64")
    }
    record["precision"] = results
    rows = [
        [dtype, r["max_exact_length"], r["first_failure_length"] or f"none up to {top}", len(r["checked"])]
        for dtype, r in results.items()
    ]
    plot = _precision_plot(ctx, name, results)
    return (
        "<h3>Precision frontier</h3>"
        "<p>The largest length at which every checked string is still answered correctly "
        "(random strings plus the task's hardest ones at each checked length; regression: within the "
        "tolerance).</p>"
        + table(["dtype", "exact up to |w| =", "first failure", "lengths checked"], rows)
        + figure(
            ctx,
            plot,
            f"margins of {name}",
            "smallest margin (|logit|, or the gap between the two largest logits) per checked length; the "
            "construction is exact while every decision is right (regression: largest |error|)",
        )
    )


def _precision_plot(ctx: ReportContext, name: str, results: dict[str, dict[str, Any]]) -> Path:
    plt = pyplot()

    regression = all(r["min_abs_logit"] is None for res in results.values() for r in res["checked"])
    key, what = ("max_abs_error", "max |error|") if regression else ("min_abs_logit", "min |logit|")
    fig, ax = plt.subplots(figsize=(6, 3.2))
    for dtype, style in (("float32", "o-"), ("float64", "s--")):
        rows = [r for r in results[dtype]["checked"] if (r.get(key) or 0) > 0]
        ax.plot([r["length"] for r in rows], [r[key] for r in rows], style, ms=3, label=dtype)
        fail = results[dtype]["first_failure_length"]
        if fail is not None:
            ax.axvline(
                fail,
                color="red" if dtype == "float32" else "darkred",
                ls=":",
                lw=1,
                label=f"first failure ({dtype}): {fail}",
            )
    ax.set_xscale("log")
    if any((r.get(key) or 0) > 0 for res in results.values() for r in res["checked"]):
        ax.set_yscale("log")  # otherwise every value is 0: nothing to draw on a log axis
    ax.set_xlabel("|w|")
    ax.set_ylabel(what)
    ax.set_title(name)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize="small")
    fig.tight_layout()
    path = ctx.asset("figures", f"precision-{slug(name)}.png")
    save_figure(fig, path, dpi=90)
    plt.close(fig)
    return path


@torch.no_grad()
def _attention_and_residual_html(ctx: ReportContext, name: str, record: dict[str, Any]) -> str:
    from exactlens.viz.attention import attention_heatmap, attention_patterns, attention_view, token_labels

    model = get(name).make()
    word, tokens = _example_tokens(ctx, name, model)
    title = f"{name} on w = {word}"
    view = attention_view(model, tokens, ctx.asset("attention", f"{slug(name)}.html"), title, ctx.bundle_dir)
    preview = attention_heatmap(model, tokens, ctx.asset("attention", f"{slug(name)}.png"), title)
    patterns = attention_patterns(model, tokens)
    labels = token_labels(model, tokens)
    out = [
        "<h3>Attention</h3>",
        f"<p>Example string <code>{esc(word)}</code> (tokens <code>{esc(' '.join(labels))}</code>). "
        f'Interactive view (circuitsvis, offline): <a href="{esc(ctx.rel(view))}">{esc(ctx.rel(view))}</a>.</p>',
        f'<iframe src="{esc(ctx.rel(view))}" title="{esc(title)}" loading="lazy"></iframe>',
        figure(ctx, preview, title, "static preview of the same patterns (rows: layers, columns: heads)"),
    ]
    # The labelled residual stream at the readout position, after each layer.
    _, cache = model.run_with_cache(tokens.unsqueeze(0), names_filter=lambda n: n.endswith("hook_resid_post"))
    rows = model.readout_rows(torch.tensor([tokens.shape[0]]))
    pos = tokens.shape[0] - 1 if rows is None else int(rows[0])  # per-position readouts: the last position
    columns = [cache[f"blocks.{layer}.hook_resid_post"][0, pos].double() for layer in range(model.cfg.n_layers)]
    rows = [[i, model.residual_label(i), *[float(c[i]) for c in columns]] for i in range(model.cfg.d_model)]
    headers = ["dim", "label", *[f"after layer {layer + 1}" for layer in range(model.cfg.n_layers)]]
    out += [
        "<h3>Residual stream</h3>",
        f"<p>Residual dimensions and their labels; values at position {pos} "
        f"(<code>{esc(labels[pos])}</code>) of the example, after each layer "
        "(<code>blocks.{l}.hook_resid_post</code>).</p>",
        table(headers, rows),
    ]
    record["example"] = {
        "word": word,
        "tokens": labels,
        "attention": [p.tolist() for p in patterns],
        "residual_labels": [model.residual_label(i) for i in range(model.cfg.d_model)],
        "residual_at_readout": [c.tolist() for c in columns],
        "readout_position": pos,
    }
    return "\n".join(out)


def construction_section(ctx: ReportContext, name: str) -> Section:
    construction = get(name)
    progress(f"report: {name}")
    t0 = time.perf_counter()
    info = construction.describe()
    record: dict[str, Any] = {"construction": info}
    parts = [
        f'<p class="paper">{esc(construction.paper)} · task <code>{esc(construction.task)}</code> '
        f"({esc(info['task']['kind'])})"
        + (f" · stated for |w| ≤ {construction.max_length}" if construction.max_length is not None else "")
        + f"</p><p>{esc(construction.summary)}</p>"
    ]
    doc = inspect.getdoc(construction.builder)
    if doc:
        parts.append(f'<pre class="doc">{esc(doc)}</pre>')
    try:
        model = construction.make()
        params = [[k, v] for k, v in info["parameters"].items()]
        parts.append(
            '<div class="side">'
            + table(["parameter", "default"], params or [["(none)", ""]])
            + table(["architecture", ""], _architecture(model))
            + "</div>"
        )
    except Exception as err:  # a broken construction must not take the report down
        parts.append(ctx.error(f"{name}: building the model", err))
    for what, part in (
        ("verification", _verify_html),
        ("precision frontier", _precision_html),
        ("attention and residual stream", _attention_and_residual_html),
        ("circuit", circuit_html),
    ):
        try:
            parts.append(part(ctx, name, record))
        except Exception as err:
            parts.append(ctx.error(f"{name}: {what}", err))
    record["seconds"] = time.perf_counter() - t0
    data = ctx.write_json(f"{slug(name)}.json", record)
    parts.append(f'<p class="data">Data: <a href="{esc(data)}">{esc(data)}</a> ({record["seconds"]:.1f} s)</p>')
    return Section(name, f"construction-{slug(name)}", "\n".join(parts))


@per_construction(construction_section, lambda ctx: ctx.names)
def construction_sections(ctx: ReportContext) -> list[Section]:
    return [ctx.part(construction_section, name) for name in ctx.names]


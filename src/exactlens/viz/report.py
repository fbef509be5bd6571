"""The offline HTML report (``exactlens report [NAME ...] --out DIR``).

index.html is a list of :class:`Section`s. Each comes from a *section builder*, a
function ``(ReportContext) -> list[Section]``; SECTION_BUILDERS lists them in page
order, so adding a section is one line there. Builders write their assets next to
the page through the context: attention/*.html (circuitsvis, JavaScript inlined),
figures/*.png, data/*.json. Nothing is loaded from the network. Every text in the
page is escaped with html.escape; progress goes to stderr.
"""

from __future__ import annotations

import html
import inspect
import json
import math
import re
import sys
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from exactlens.constructions import get
from exactlens.constructions import names as registered_names

# ---- sections and the context builders share ----------------------------------------


@dataclass
class Section:
    """One part of the page: an anchor id, a title, and an HTML fragment (already escaped)."""

    title: str
    id: str
    html: str


@dataclass(frozen=True)
class ReportSettings:
    verify_lengths: tuple[int, ...]
    verify_strings: int
    precision_max_length: int
    precision_strings: int
    precision_points_per_decade: int
    example_length: int
    fig2: dict[str, Any]
    fig3: dict[str, Any]


FULL = ReportSettings(
    verify_lengths=(1, 2, 3, 4, 8, 12, 16, 32, 64, 128),
    verify_strings=256,
    precision_max_length=1000,
    precision_strings=4,
    precision_points_per_decade=8,
    example_length=8,
    fig2={"max_length": 1000, "strings": 1000, "points_per_decade": 8},
    fig3={"lengths": (1, 50), "strings": 1000},
)
QUICK = ReportSettings(
    verify_lengths=(1, 2, 4, 8, 16),
    verify_strings=32,
    precision_max_length=64,
    precision_strings=4,
    precision_points_per_decade=8,
    example_length=8,
    fig2={"max_length": 50, "strings": 50, "points_per_decade": 8},
    fig3={
        "values": [0.9, 0.95, 0.98, 0.99, 0.995, 0.999, 1.0, 1.001, 1.005, 1.01, 1.02, 1.05, 1.1],
        "lengths": (1, 20),
        "strings": 100,
    },
)


@dataclass
class ReportContext:
    out_dir: Path
    names: list[str]
    quick: bool
    settings: ReportSettings
    errors: list[dict[str, str]] = field(default_factory=list)

    def asset(self, kind: str, filename: str) -> Path:
        """out_dir/kind/filename, its folder created."""
        folder = self.out_dir / kind
        folder.mkdir(parents=True, exist_ok=True)
        return folder / filename

    def rel(self, path: Path) -> str:
        return path.relative_to(self.out_dir).as_posix()

    def write_json(self, filename: str, obj: Any) -> str:
        """Write data/filename (strict JSON: NaN and infinities become null); return its relative path."""
        path = self.asset("data", filename)
        path.write_text(json.dumps(_jsonable(obj), indent=1, allow_nan=False) + "\n", encoding="utf-8")
        return self.rel(path)

    def error(self, where: str, err: BaseException) -> str:
        """Record an error (stderr, report.json) and return a visible HTML note."""
        progress(f"report: {where} failed: {err}")
        traceback.print_exception(err, file=sys.stderr)
        self.errors.append({"where": where, "error": f"{type(err).__name__}: {err}"})
        return f'<p class="error">{esc(where)} failed: {esc(type(err).__name__)}: {esc(str(err))}</p>'


SectionBuilder = Callable[[ReportContext], list[Section]]


def progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# ---- small HTML helpers ------------------------------------------------------------


def esc(value: Any) -> str:
    return html.escape(str(value), quote=True)


def slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name)


def fmt(value: Any, digits: int = 4) -> str:
    """Numbers for tables: integers as is, small/large floats in exponent form."""
    if isinstance(value, bool) or value is None:
        return str(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            return str(value)
        if value != 0 and (abs(value) < 1e-3 or abs(value) >= 1e5):
            return f"{value:.{digits - 1}e}"
        return f"{value:.{digits}f}"
    return str(value)


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]], caption: str | None = None) -> str:
    head = "".join(f"<th>{esc(h)}</th>" for h in headers)
    body = "\n".join("<tr>" + "".join(f"<td>{esc(fmt(v))}</td>" for v in row) + "</tr>" for row in rows)
    cap = f"<caption>{esc(caption)}</caption>" if caption else ""
    return f"<table>{cap}<thead><tr>{head}</tr></thead>\n<tbody>\n{body}\n</tbody></table>"


def figure(ctx: ReportContext, path: Path, alt: str, caption: str) -> str:
    return (
        f'<figure><a href="{esc(ctx.rel(path))}"><img src="{esc(ctx.rel(path))}" alt="{esc(alt)}"></a>'
        f"<figcaption>{esc(caption)}</figcaption></figure>"
    )


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, torch.Tensor):
        return _jsonable(obj.tolist())
    if obj is None or isinstance(obj, (str, int, bool)):
        return obj
    return str(obj)


# ---- builder: overview ---------------------------------------------------------------


def overview_sections(ctx: ReportContext) -> list[Section]:
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


def _example_tokens(ctx: ReportContext, name: str) -> tuple[str, torch.Tensor]:
    from exactlens.analysis.verify import language_of

    construction = get(name)
    lang = language_of(construction, construction.make())  # with the parameters the model was built for
    length = ctx.settings.example_length
    if construction.max_length is not None:
        length = min(length, construction.max_length)
    ids = lang.sample(length, 1, torch.Generator().manual_seed(1234))
    return lang.decode(ids)[0], lang.encode(ids).tokens[0]


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

    construction = get(name)
    lengths = [
        n for n in ctx.settings.verify_lengths if construction.max_length is None or n <= construction.max_length
    ]
    results = {}
    for dtype in ("float32", "float64"):
        results[dtype] = verify(name, lengths, strings=ctx.settings.verify_strings, dtype=dtype)
    record["verify"] = results
    rows = []
    for j, n in enumerate(lengths):
        r32, r64 = results["float32"]["results"][j], results["float64"]["results"][j]
        rows.append(
            [
                n,
                f"{r32['strings']}{' (all)' if r32['exhaustive'] else ''}",
                r32["accuracy"],
                r32["cross_entropy_bits"],
                r32["min_abs_logit"],
                r64["accuracy"],
                r64["cross_entropy_bits"],
                r64["min_abs_logit"],
            ]
        )
    headers = [
        "|w|",
        "strings",
        "acc f32",
        "CE bits f32",
        "min |logit| f32",
        "acc f64",
        "CE bits f64",
        "min |logit| f64",
    ]
    return "<h3>Verification</h3>" + table(headers, rows)


def _precision_html(ctx: ReportContext, name: str, record: dict[str, Any]) -> str:
    from exactlens.analysis.verify import log_grid, precision

    construction = get(name)
    top = ctx.settings.precision_max_length
    if construction.max_length is not None:
        top = min(top, construction.max_length)
    grid = sorted(
        set(range(1, min(16, top) + 1))
        | set(log_grid(top, ctx.settings.precision_points_per_decade, start=16) if top > 16 else [])
    )
    results = {
        dtype: precision(name, dtype=dtype, max_length=top, strings=ctx.settings.precision_strings, lengths=grid)
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
        "<p>The largest length at which every checked string is still classified correctly "
        "(random strings plus the language's hardest ones at each checked length).</p>"
        + table(["dtype", "exact up to |w| =", "first failure", "lengths checked"], rows)
        + figure(
            ctx,
            plot,
            f"min |logit| of {name}",
            "smallest |logit| per checked length; the construction is exact while the sign of every logit is right",
        )
    )


def _precision_plot(ctx: ReportContext, name: str, results: dict[str, dict[str, Any]]) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.2))
    for dtype, style in (("float32", "o-"), ("float64", "s--")):
        rows = [r for r in results[dtype]["checked"] if r["min_abs_logit"] > 0]
        ax.plot([r["length"] for r in rows], [r["min_abs_logit"] for r in rows], style, ms=3, label=dtype)
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
    if any(r["min_abs_logit"] > 0 for res in results.values() for r in res["checked"]):
        ax.set_yscale("log")  # otherwise every logit sat on the boundary: nothing to draw on a log axis
    ax.set_xlabel("|w|")
    ax.set_ylabel("min |logit|")
    ax.set_title(name)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize="small")
    fig.tight_layout()
    path = ctx.asset("figures", f"precision-{slug(name)}.png")
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


@torch.no_grad()
def _attention_and_residual_html(ctx: ReportContext, name: str, record: dict[str, Any]) -> str:
    from exactlens.viz.attention import attention_heatmap, attention_patterns, attention_view, token_labels

    model = get(name).make()
    word, tokens = _example_tokens(ctx, name)
    title = f"{name} on w = {word}"
    view = attention_view(model, tokens, ctx.asset("attention", f"{slug(name)}.html"), title)
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
    pos = (
        model.cfg.readout_position if model.cfg.readout_position >= 0 else tokens.shape[0] + model.cfg.readout_position
    )
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
        f'<p class="paper">{esc(construction.paper)} · language <code>{esc(construction.language)}</code>'
        + (f" · stated for |w| ≤ {construction.max_length}" if construction.max_length is not None else "")
        + f"</p><p>{esc(construction.summary)}</p>"
    ]
    doc = inspect.getdoc(construction.build)
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
    checks = (("verification", _verify_html), ("precision frontier", _precision_html))
    if "regression" in construction.tags:  # real-valued outputs: no membership to verify here
        parts.append(
            "<p>A regression construction (real-valued outputs, no membership decision): its exactness "
            "is checked in its paper's section of this report, not by verify/precision.</p>"
        )
        checks = ()
    for what, part in (
        *checks,
        ("attention and residual stream", _attention_and_residual_html),
    ):
        try:
            parts.append(part(ctx, name, record))
        except Exception as err:
            parts.append(ctx.error(f"{name}: {what}", err))
    record["seconds"] = time.perf_counter() - t0
    data = ctx.write_json(f"{slug(name)}.json", record)
    parts.append(f'<p class="data">Data: <a href="{esc(data)}">{esc(data)}</a> ({record["seconds"]:.1f} s)</p>')
    return Section(name, f"construction-{slug(name)}", "\n".join(parts))


def construction_sections(ctx: ReportContext) -> list[Section]:
    return [construction_section(ctx, name) for name in ctx.names]


# ---- builder: Chiang & Cholak figures ------------------------------------------------

FIG2_SHORT = {
    "no layer norm": "no LN",
    "layer norm eps=1e-5": "LN 1e-5",
    "layer norm eps=0": "LN 0",
    "layer norm + Prop. 2, eps=1e-5": "LN+P2 1e-5",
    "layer norm + Prop. 2, eps=0": "LN+P2 0",
}


def chiang_figures_sections(ctx: ReportContext) -> list[Section]:
    """Fig. 2 and Fig. 3, when the report covers a Chiang & Cholak construction."""
    from exactlens.analysis import chiang_figures as cf

    if not any(get(n).paper.startswith("Chiang & Cholak") for n in ctx.names):
        return []
    parts = []
    try:
        t0 = time.perf_counter()
        fig2 = cf.fig2_data(**ctx.settings.fig2)
        fig2_json = ctx.write_json("fig2.json", fig2)
        png = cf.plot_fig2(fig2, ctx.asset("figures", "fig2.png"))
        settings = fig2["settings"]
        headers = ["n"] + [f"{lang[0]} {FIG2_SHORT.get(s, s)}" for lang in cf.LANGUAGES for s in settings]
        rows = [
            [row["length"], *[row[f"{lang} / {s}"] for lang in cf.LANGUAGES for s in settings]]
            for row in cf.fig2_rows(fig2)
        ]
        accuracy = min(min(c["accuracy"]) for lang in fig2["curves"].values() for c in lang.values())
        parts += [
            "<h3>Fig. 2: cross-entropy of the exact solutions</h3>",
            f"<p>Mean cross-entropy in bits per string over {fig2['strings']} random strings of each length n "
            f"({fig2['dtype']}; {esc(fig2['method'])}; lowest accuracy of any curve at any length: "
            f"{fmt(accuracy)}). Five settings: no layer norm (§3); the §4.1 models with layer norm, eps = 1e-5 "
            "and eps = 0; and the same with the Prop. 2 layer (§4.2) added, eta = "
            f"{fmt(fig2['eta'])} bits. The paper's claim that with eps = 0 the cross-entropy does not depend "
            "on n holds for the models with the Prop. 2 layer; the §4.1 models alone still tend to 1 bit, "
            "and their eps = 1e-5 and eps = 0 curves coincide (eps is tiny next to the activations' "
            "variance).</p>",
            figure(
                ctx, png, "Fig. 2 reproduction", "Fig. 2: P = PARITY, F = FIRST, LN = layer norm, P2 = Prop. 2 layer"
            ),
            "<details><summary>Fig. 2 data (bits per string)</summary>"
            + table(headers, rows)
            + f'<p>JSON: <a href="{esc(fig2_json)}">{esc(fig2_json)}</a></p></details>',
        ]
        progress(f"report: fig2 done ({time.perf_counter() - t0:.1f} s)")
    except Exception as err:
        parts.append(ctx.error("Fig. 2", err))
    try:
        t0 = time.perf_counter()
        fig3 = cf.fig3_data(**ctx.settings.fig3)
        fig3_json = ctx.write_json("fig3.json", fig3)
        png = cf.plot_fig3(fig3, ctx.asset("figures", "fig3.png"))
        curves = fig3["curves"]
        exact = [v for v, a in zip(fig3["values"], curves["parity-ln"]["accuracy"], strict=True) if a == 1.0]
        low, high = fig3["lengths"]
        rows = [
            [
                v,
                curves["parity-ln"]["accuracy"][j],
                curves["parity-ln"]["cross_entropy_bits"][j],
                curves["parity-ln-eta"]["accuracy"][j],
                curves["parity-ln-eta"]["cross_entropy_bits"][j],
            ]
            for j, v in enumerate(fig3["values"])
        ]
        window = (
            f"Accuracy is 1 for the tried values from {fmt(min(exact))} to {fmt(max(exact))}"
            if exact
            else "No tried value has accuracy 1"
        )
        parts += [
            "<h3>Fig. 3: sensitivity to one weight</h3>",
            "<p>parity-ln (eps = 0) and parity-ln-eta (the same with the Prop. 2 layer) as the weight that "
            f"writes k/n, {esc(fig3['paper_parameter'])} = <code>{esc(fig3['parameter'])}</code>, moves away "
            f"from its correct value 1; {fig3['strings']} random strings with |w| uniform in [{low}, {high}]. "
            f"{window}. The window shrinks as strings get longer (an error e in k/n moves the peak of "
            "I[i=k] by k e); the cross-entropy of parity-ln stays near 1 bit throughout, that of parity-ln-eta "
            "is eta at the correct value and grows with every misclassified class of strings.</p>",
        ]
        parts += [
            figure(ctx, png, "Fig. 3 reproduction", "Fig. 3: cross-entropy (top) and accuracy (bottom)"),
            "<details><summary>Fig. 3 data</summary>"
            + table(
                ["value", "acc (parity-ln)", "CE bits (parity-ln)", "acc (parity-ln-eta)", "CE bits (parity-ln-eta)"],
                rows,
            )
            + f'<p>JSON: <a href="{esc(fig3_json)}">{esc(fig3_json)}</a></p></details>',
        ]
        progress(f"report: fig3 done ({time.perf_counter() - t0:.1f} s)")
    except Exception as err:
        parts.append(ctx.error("Fig. 3", err))
    return [Section("Chiang & Cholak figures", "chiang-cholak-figures", "\n".join(parts))]


# Page order. To add a section, add its builder here.
SECTION_BUILDERS: list[SectionBuilder] = [
    overview_sections,
    construction_sections,
    chiang_figures_sections,
    __import__("exactlens.viz.report_brody", fromlist=["brody_sections"]).brody_sections,
    __import__("exactlens.viz.report_diff", fromlist=["diff_sections"]).diff_sections,
    __import__("exactlens.viz.report_nowak", fromlist=["nowak_sections"]).nowak_sections,
    __import__("exactlens.viz.report_examples", fromlist=["examples_sections"]).examples_sections,
    __import__("exactlens.viz.report_shin_matzinger", fromlist=["shin_matzinger_sections"]).shin_matzinger_sections,
]


# ---- the page --------------------------------------------------------------------

CSS = """
body { font-family: system-ui, -apple-system, sans-serif; margin: 0 auto; max-width: 1200px; padding: 1em 2em;
       color: #222; line-height: 1.4; }
h1 { font-size: 1.6em; } h2 { border-bottom: 1px solid #ccc; margin-top: 2em; } h3 { margin-top: 1.2em; }
nav ul { columns: 3; font-size: .9em; }
table { border-collapse: collapse; margin: .5em 0 1em; font-size: .85em; }
th, td { border: 1px solid #ddd; padding: 2px 6px; text-align: right; }
th { background: #f4f4f4; } td:nth-child(2) { text-align: left; }
caption { text-align: left; font-weight: bold; }
.side { display: flex; gap: 2em; flex-wrap: wrap; align-items: flex-start; }
pre.doc { background: #f8f8f8; padding: .5em; white-space: pre-wrap; font-size: .85em; }
code { background: #f3f3f3; padding: 0 .2em; }
figure { margin: .5em 0; } figure img { max-width: 100%; border: 1px solid #eee; }
figcaption { font-size: .85em; color: #555; }
iframe { width: 100%; height: 520px; border: 1px solid #ddd; }
.error { color: #a00; font-weight: bold; } .paper { color: #555; } .data { font-size: .85em; color: #555; }
"""


def render_page(sections: Sequence[Section], title: str, footer: str) -> str:
    nav = "".join(f'<li><a href="#{esc(s.id)}">{esc(s.title)}</a></li>' for s in sections)
    body = "\n".join(f'<section id="{esc(s.id)}">\n<h2>{esc(s.title)}</h2>\n{s.html}\n</section>' for s in sections)
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f"<title>{esc(title)}</title>\n<style>{CSS}</style>\n</head>\n<body>\n"
        f"<h1>{esc(title)}</h1>\n<nav><ul>{nav}</ul></nav>\n{body}\n"
        f'<footer><p class="data">{footer}</p></footer>\n</body>\n</html>\n'
    )


@contextmanager
def torch_threads(count: int | None) -> Iterator[None]:
    """Run with ``count`` torch threads (None: leave the setting alone), restored afterwards."""
    if count is None:
        yield
        return
    old = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(old)


def build_report(
    names: list[str] | None,
    out_dir: str | Path,
    quick: bool = False,
    builders: Sequence[SectionBuilder] | None = None,
    threads: int | None = 1,
) -> Path:
    """Write out_dir/index.html and its assets for the given constructions (default: all
    registered); return the path of index.html.

    ``threads``: torch threads while building (None: as set). The default is one: the
    work is many small tensor operations, for which more threads cost more in
    synchronization than they gain (on a shared two-core machine we measured 2 threads
    3 to 10 times slower than 1).
    """
    with torch_threads(threads):
        return _build_report(names, out_dir, quick, builders)


def _build_report(
    names: list[str] | None, out_dir: str | Path, quick: bool, builders: Sequence[SectionBuilder] | None
) -> Path:
    start = time.perf_counter()
    selected = list(dict.fromkeys(names)) if names else registered_names()
    for name in selected:
        get(name)  # unknown names fail before any work
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    ctx = ReportContext(out_dir=out, names=selected, quick=quick, settings=QUICK if quick else FULL)
    progress(f"report: {len(selected)} constructions -> {out / 'index.html'}{' (quick)' if quick else ''}")
    sections: list[Section] = []
    timings: dict[str, float] = {}
    for builder in SECTION_BUILDERS if builders is None else builders:
        t0 = time.perf_counter()
        sections += builder(ctx)
        timings[builder.__name__] = time.perf_counter() - t0
    seconds = time.perf_counter() - start
    ctx.write_json(
        "report.json",
        {
            "constructions": selected,
            "quick": quick,
            "settings": asdict(ctx.settings),
            "sections": [{"id": s.id, "title": s.title} for s in sections],
            "timings": timings,
            "seconds": seconds,
            "errors": ctx.errors,
        },
    )
    footer = (
        f"exactlens report, {len(selected)} constructions, built in {seconds:.1f} s"
        f"{' (quick settings)' if quick else ''}; "
        + esc(", ".join(f"{k} {v:.1f} s" for k, v in timings.items()))
        + '. Data: <a href="data/report.json">data/report.json</a>.'
    )
    if ctx.errors:
        footer += f' <span class="error">{len(ctx.errors)} error(s); see data/report.json.</span>'
    index = out / "index.html"
    index.write_text(render_page(sections, "exactlens report", footer), encoding="utf-8")
    progress(f"report: done in {seconds:.1f} s")
    return index

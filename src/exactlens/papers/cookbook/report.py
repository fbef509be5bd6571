"""Report section: the Transformer Cookbook's worked examples (§9), with Brody et al.'s MAJORITY where
that plug-in is installed (it is built from the same recipes).

For each example: what it computes, whether its output is a uniform external check, a
nonuniform 0/1 decision (with the maximum length it is built for) or a class argmax, an
exhaustive check at small lengths, and the attention views on the papers' example words
(circuitsvis, offline) with the values read out. Default cost ~15 s on one core; quick ~3 s.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from exactlens import tasks
from exactlens.analysis.verify import outputs_of, verify
from exactlens.constructions import get
from exactlens.viz.attention import attention_heatmap, attention_view
from exactlens.viz.page import ReportContext, Section, esc, figure, progress, slug, table
from exactlens.viz.trained_diff import TrainedDiff, trained_diff_section

# name, parameters, example words (from the papers where they give one), what it computes
EXAMPLES: list[tuple[str, dict[str, Any], list[str], str]] = [
    (
        "majority",
        {"num_classes": 3},
        ["aabbbcc", "ccaab"],
        "the most frequent class (ties: smallest index); logits (count_c - c/k)/n at [CLS]",
    ),
    (
        "induction-recent",
        {},
        ["abcab", "abacab", "cab"],
        "at every position: the symbol after the most recent earlier occurrence of the current symbol "
        "(the symbol itself if none); the table shows the last position's logits",
    ),
    (
        "induction-frequent",
        {},
        ["bbcbcbab", "cacbc", "cab"],
        "at every position: the most frequent follower of the current symbol (ties and no occurrence: "
        "alphabetically first)",
    ),
    ("dyck1", {}, ["()(())", "())(()"], "membership in Dyck-1 (balance b = 0 and no prefix violation, E = 0)"),
    ("dyck1", {"max_length": 16}, ["()(())", "())(()"], "the same as a 0/1 decision for |w| <= 16"),
    ("dyck1-depth2", {}, ["(())(()())", "((()))"], "membership in Dyck-1 of depth <= 2"),
    ("dyck-k-D", {"k": 2, "D": 2}, ["([])[]", "([)]"], "membership in Dyck-2 of depth <= 2"),
]
CHECK_LENGTHS = {"full": 10, "quick": 6}


def _label(name: str, params: dict[str, Any]) -> str:
    return name + "".join(f" {k}={v}" for k, v in params.items())


def _kind(model: Any) -> str:
    meta = model.cfg.metadata
    decision = meta.get("decision", "")
    if decision == "nonuniform 0/1 decision":
        return f"nonuniform 0/1 decision, |w| <= {meta['max_length']}"
    return decision


@torch.no_grad()
def _example_html(ctx: ReportContext, name: str, params: dict[str, Any], words: list[str]) -> str:
    construction = get(name)
    model = construction.make(dtype="float64", **params)
    reader = tasks.reader(model)
    lang = reader.task
    rows, parts = [], []
    for word in words:
        ids = lang.ids([word])
        batch = lang.encode(ids)
        out = outputs_of(model, batch.tokens)
        truth = lang.targets(ids)
        decided = reader.decide(out, batch.n_positions)
        shown = out[0, -1] if lang.kind == "prediction" else out  # per-position: the last position's logits
        rows.append(
            [word, " ".join(f"{float(v):.4g}" for v in shown.flatten()), _show(lang, decided), _show(lang, truth)]
        )
    tokens = lang.encode(torch.tensor(lang.to_ids(words[:1]), dtype=torch.long)).tokens[0]
    stem = f"examples-{slug(_label(name, params))}"
    title = f"{_label(name, params)} on {words[0]}"
    view = attention_view(model, tokens, ctx.asset("attention", f"{stem}.html"), title, ctx.bundle_dir)
    png = attention_heatmap(model, tokens, ctx.asset("attention", f"{stem}.png"), title)
    outputs = ", ".join(model.cfg.metadata.get("cookbook", {}).get("outputs", [])) or "see the readout"
    parts.append(table(["word", f"read-out values ({outputs})", "decision", "target"], rows))
    parts.append(
        f'<p>Interactive attention (circuitsvis, offline): <a href="{esc(ctx.rel(view))}">{esc(ctx.rel(view))}</a></p>'
    )
    parts.append(figure(ctx, png, title, f"attention of every layer on {words[0]} (rows: queries, columns: keys)"))
    return "\n".join(parts)


def _show(lang: Any, value: torch.Tensor) -> str:
    """The decision (or target) of one word; per-position tasks: every position's, the last one last."""
    if lang.kind == "prediction":
        return " ".join(lang.alphabet[int(v)] for v in value.flatten())
    v = value.flatten()[0]
    if v.dtype == torch.bool:
        return "accept" if bool(v) else "reject"
    return lang.alphabet[int(v)]


def _check(name: str, params: dict[str, Any], top: int) -> tuple[str, float]:
    low = max(1, get(name).length_range()[0])
    lengths = list(range(low, top + 1))
    if "max_length" in params:
        lengths = [n for n in lengths if n <= params["max_length"]]
    result = verify(name, lengths, dtype="float32", params=params, strings=64, exhaustive_limit=2**12)
    exhaustive = [r["length"] for r in result["results"] if r["exhaustive"]]
    sampled = [r["length"] for r in result["results"] if not r["exhaustive"]]
    accuracy = min(r["accuracy"] for r in result["results"])
    text = f"all words |w| <= {max(exhaustive)}" if exhaustive else ""
    if sampled:
        text += f"; 64 random words at |w| = {min(sampled)}..{max(sampled)}"
    return text, accuracy


def examples_sections(ctx: ReportContext) -> list[Section]:
    chosen = [e for e in EXAMPLES if e[0] in ctx.names]
    if not chosen:
        return []
    t0 = time.perf_counter()
    top = CHECK_LENGTHS["quick" if ctx.quick else "full"]
    summary, details = [], []
    for name, params, words, what in chosen:
        try:
            model = get(name).make(**params)
            checked, accuracy = _check(name, params, top)
            summary.append([_label(name, params), what, _kind(model), checked, accuracy])
            details.append(f"<h3>{esc(_label(name, params))}</h3>" + _example_html(ctx, name, params, words))
        except Exception as err:  # one broken example must not take the section down
            details.append(ctx.error(f"examples: {_label(name, params)}", err))
    intro = (
        "<p>Transformer Cookbook §9 (induction heads, Dyck languages) and Brody et al. §4.1 (majority), "
        "built from the cookbook recipes (<code>exactlens.constructions.cookbook</code>). A <em>uniform</em> "
        "construction has weights that do not depend on the length, so it cannot output a 0/1 membership bit "
        "(§9.2.1): it outputs the quantities whose zero-ness decides membership and an external check tests "
        "them (in floating point: |value| below half its smallest nonzero size, 1/n or 1/n², which the model "
        "also outputs). A <em>nonuniform</em> construction (parameter <code>max_length=N</code>) adds the §4.7 "
        "comparisons with tolerance 1/(N+1) and outputs a logit whose sign is the decision, valid for "
        "|w| ≤ N.</p>"
    )
    head = ["construction", "computes", "output", "checked here (float32)", "accuracy"]
    html = intro + table(head, summary) + "\n".join(details)
    progress(f"report: cookbook examples done ({time.perf_counter() - t0:.1f} s)")
    return [Section("Cookbook worked examples and majority", "cookbook-examples", html)]


INDUCTION_DIFF = TrainedDiff(
    "Trained vs exact: induction head (most recent)", "diff-induction", "induction-recent", "induction-recent",
    lengths=(6, 10), quick_options={"epochs": 20},
    note="A prediction task: behaviour and DAS are scored at every position.",
)


def induction_diff_sections(ctx: ReportContext) -> list[Section]:
    return [trained_diff_section(ctx, INDUCTION_DIFF)] if INDUCTION_DIFF.against in ctx.names else []

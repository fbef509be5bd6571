"""The report's section for a user's own model (``exactlens report --model PATH --against NAME``,
``el.report(model=..., against=...)``): its behaviour on its task's words (verify), the diff against the
construction ``against`` (behaviour and the DAS verdicts per variable) and the hull check (unselectable keys
per layer on the task's words). Each part that cannot apply says which and why in the page (and in
data/your_model.json); a part that fails otherwise is a report error like any section's."""

from __future__ import annotations

from typing import Any

from exactlens.errors import ExactLensError
from exactlens.viz.page import ReportContext, Section, esc, progress, table

QUICK = {"lengths": (1, 2, 4, 8), "strings": 32, "diff_lengths": [2, 4, 8], "diff_strings": 16, "das_steps": 20,
         "parts": ("behaviour", "alignment")}
FULL = {"lengths": (1, 2, 3, 4, 6, 8, 12, 16), "strings": 256, "diff_lengths": None, "diff_strings": 64,
        "das_steps": 80, "parts": ("behaviour", "alignment", "circuit")}


def model_sections(ctx: ReportContext) -> list[Section]:
    spec = ctx.user_model
    if spec is None:
        return []
    s = QUICK if ctx.quick else FULL
    ctx.record_settings(your_model={k: list(v) if isinstance(v, tuple) else v for k, v in s.items()})
    data: dict[str, Any] = {"against": spec["against"]}
    try:
        target = _target(spec)
    except ExactLensError as err:  # the model cannot be read at all: the section says why
        data["refused"] = str(err)
        ctx.write_json("your_model.json", data)
        return [Section("Your model", "your-model", f'<p class="error">Not read: {esc(err)}</p>')]
    data["model"] = target.info
    parts = [f"<p>{esc(target.label)}: task <code>{esc(target.task.name)}</code>; {esc(_source(target))}.</p>"]
    for title, part in (("Behaviour on the task's words", _behaviour), ("Against the exact construction", _diff),
                        ("Hull check: unselectable keys", _hull)):
        progress(f"report: your model: {title.lower()}")
        try:
            html, data[part.__name__.strip("_")] = part(ctx, spec, target, s)
        except ExactLensError as err:  # the part does not apply to this model: said, not an error of the report
            html, data[part.__name__.strip("_")] = (f"<p>Not applicable: {esc(err)}</p>",
                                                    {"applies": False, "reason": str(err)})
        except Exception as err:  # a failing part must not sink the report
            html = ctx.error(f"your model: {title.lower()}", err)
        parts += [f"<h3>{esc(title)}</h3>", html]
    link = ctx.write_json("your_model.json", data)
    parts.append(f'<p class="data">Data: <a href="{esc(link)}">{esc(link)}</a>.</p>')
    return [Section("Your model", "your-model", "\n".join(parts))]


def _source(target: Any) -> str:
    info = target.info
    if info["kind"] == "foreign":
        return f"{info['source']}, readout {info['readout']}, {info['imported']}"
    return {"checkpoint": f"checkpoint {info.get('path')}", "model": "an ExactTransformer"}.get(info["kind"], "")


def _target(spec: dict[str, Any]) -> Any:
    from exactlens.interop.model_target import model_target

    return model_target(spec["model"], spec["task"], spec["readout"])


def _behaviour(ctx: ReportContext, spec: dict[str, Any], target: Any, s: dict[str, Any]) -> tuple[str, Any]:
    from exactlens.analysis.verify import verify_model
    from exactlens.interop.model_target import longest_of, on_device

    high = longest_of(target)
    lengths = [n for n in s["lengths"] if n >= target.task.min_length and (high is None or n <= high)]
    model = on_device(target.model, ctx.device_for(target.model.cfg.dtype) or "cpu")
    rows = verify_model(model, lengths, strings=s["strings"], seed=0, task=target.task)
    body = [[r["length"], r["strings"], r["accuracy"], r["cross_entropy_bits"], r.get("min_abs_logit")] for r in rows]
    html = (f"<p>Accuracy against the task's answers (its membership function or targets), every word where there "
            f"are at most 4096, else {s['strings']} random ones per length.</p>"
            + table(["|w|", "words", "accuracy", "cross-entropy (bits)", "min |logit|"], body))
    return html, {"applies": True, "results": rows}


def _diff(ctx: ReportContext, spec: dict[str, Any], target: Any, s: dict[str, Any]) -> tuple[str, Any]:
    from exactlens.analysis.diff import diff
    from exactlens.viz.diff_page import diff_html

    against = spec["against"]
    if against is None:
        raise ExactLensError(f"no construction to compare with: give against=NAME (--against NAME), a construction "
                             f"of task {target.task.name!r} (see `exactlens list`)")
    model = spec["model"] if target.original is None else target.original
    result = diff(model, against, lengths=s["diff_lengths"], strings=s["diff_strings"], parts=s["parts"],
                  das_steps=s["das_steps"], alignment_pairs=s["diff_strings"], readout=spec["readout"],
                  device=ctx.device)
    verdicts = (result["summary"].get("verdicts") or {})
    line = "; ".join(f"{name}: {v.get('verdict')}" for name, v in verdicts.items()) or "no variable fitted"
    return f"<p>DAS verdicts: {esc(line)}.</p>" + diff_html(result), result


def _hull(ctx: ReportContext, spec: dict[str, Any], target: Any, s: dict[str, Any]) -> tuple[str, Any]:
    from exactlens.analysis.hull.request import HullRequest
    from exactlens.analysis.hull.target import model_report

    if target.info.get("import_refused"):
        refused = target.info["import_refused"]
        raise ExactLensError(f"the hull reads the weights of an ExactTransformer copy, and {refused}")
    request = HullRequest(target=None, device=ctx.device if ctx.device is not None else "cpu")
    foreign = target.info if target.info["kind"] == "foreign" else None
    result = model_report(target.model, request, foreign)
    body = [[layer["layer"], layer["before_ln"]["fraction_unselectable"],
             layer["after_ln"]["fraction_unselectable"] if layer["after_ln"] else None,
             ", ".join(f"h{h['head']} {h['fraction_unselectable']:.3f}" for h in layer["per_head"])]
            for layer in result["layers"]]
    html = (f"<p>Keys no query can select (strictly inside the convex hull of the others), on "
            f"{esc(result['target']['tokens'])} ({result['n_sequences']} sequences). "
            f"{esc(result['attention_input_note'])}</p>"
            + table(["layer", "before LN", "after LN", "per head"], body))
    return html, result

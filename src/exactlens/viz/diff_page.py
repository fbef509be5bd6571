"""HTML for a circuit diff: what was compared and the summary, each part's page section (declared with the part,
exactlens.analysis.diff.parts: behaviour, the probe table and the DAS alignment as heat maps, the circuits, head
matching, weights, interventions), and circuitsvis attention views of both models side by side.

:func:`diff_html` gives an HTML fragment (used by the report section); :func:`write_diff_page`
writes a standalone page whose attention views (offline circuitsvis pages) sit in a folder next to
it. Every text is escaped.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import torch

from exactlens.analysis.diff.parts import steps
from exactlens.analysis.diff.parts.alignment import iia_heatmap
from exactlens.analysis.diff.parts.probes import probe_heatmap
from exactlens.markup import esc, table
from exactlens.outputs import check_output, naming, staged

__all__ = ["attention_views", "check_diff_page", "diff_html", "iia_heatmap", "probe_heatmap", "write_diff_page"]

_CSS = """
body { font-family: system-ui, sans-serif; margin: 0 auto; max-width: 1200px; padding: 1em 2em; color: #222; }
table { border-collapse: collapse; margin: .5em 0 1em; font-size: .85em; display: block; max-width: 100%;
        overflow-x: auto; }
img, svg { max-width: 100%; height: auto; } code { overflow-wrap: anywhere; }
th, td { border: 1px solid #ddd; padding: 2px 6px; text-align: right; }
th { background: #f4f4f4; } td.l { text-align: left; }
.pair { display: flex; gap: 1em; } .pair > div { flex: 1; min-width: 0; }
iframe { width: 100%; height: 560px; border: 1px solid #ddd; }
code { background: #f3f3f3; padding: 0 .2em; }
"""


def diff_html(result: dict[str, Any], views: tuple[str, str] | None = None) -> str:
    """The diff as an HTML fragment: what was compared, the summary, then each part's own page section (its
    declaration's ``page``, exactlens.analysis.diff.parts) in the parts' page order; ``views``: relative links to
    the trained and exact attention pages."""
    trained = result["trained"]
    out = [
        f"<p>Trained model ({esc(trained.get('kind'))}: "
        f"{esc(trained.get('path') or trained.get('name') or trained['class'])}) "
        f"against <code>{esc(result['exact']['name'])}</code> ({esc(result['exact']['paper'])}), word lengths "
        f"{esc(result['settings']['lengths'])}, {esc(result['settings']['strings'])} words per length.</p>",
        table(["summary", "value"], [[k, v] for k, v in result["summary"].items()]),
    ]
    shown = [part for part in steps() if part.page is not None and part.shows_in(result)]
    for part in sorted(shown, key=lambda part: part.order if part.page_order is None else part.page_order):
        out += part.page(result)
    if views is not None:
        out += [
            "<h3>Attention on one word (circuitsvis)</h3>",
            f'<div class="pair"><div><h4>trained</h4><iframe src="{esc(views[0])}"></iframe></div>'
            f'<div><h4>exact</h4><iframe src="{esc(views[1])}"></iframe></div></div>',
        ]
    return "\n".join(out)


def attention_views(
    result: dict[str, Any], trained: Any, folder: Path, word_length: int = 8, bundle_dir: Path | None = None
) -> tuple[Path, Path] | None:
    """Write circuitsvis pages of both models on one word into ``folder``, loading circuitsvis's
    JavaScript from ``bundle_dir`` (default: ``folder``; a report passes its shared assets folder);
    None if the trained model is not an ExactTransformer (the views read cfg.vocab)."""
    from exactlens.analysis.diff import resolve_trained
    from exactlens.constructions import get
    from exactlens.model import ExactTransformer
    from exactlens.viz.attention import attention_view

    model, _ = resolve_trained(trained)
    if not isinstance(model, ExactTransformer):
        return None
    construction = get(result["exact"]["name"])
    exact = construction.make(dtype=result["settings"]["exact_dtype"], **result["exact"]["params"])
    lang = construction.lang()
    length = min(word_length, max(result["settings"]["lengths"]))
    ids = lang.sample(length, 1, torch.Generator().manual_seed(result["settings"]["seed"]))
    tokens = lang.encode(ids).tokens[0]
    word = lang.decode(ids)[0]
    folder.mkdir(parents=True, exist_ok=True)
    shared = folder if bundle_dir is None else bundle_dir
    t = attention_view(model, tokens, folder / "trained_attention.html", f"trained model on w = {word}", shared)
    e = attention_view(exact, tokens, folder / "exact_attention.html", f"{construction.name} on w = {word}", shared)
    return t, e


def write_diff_page(result: dict[str, Any], path: str | Path, trained: Any = None, *, overwrite: bool = False) -> Path:
    """A standalone page; with ``trained`` (model, checkpoint or name) also the attention views,
    written to PATH_stem_files/ next to it. Both are checked before anything is written and each
    appears in one step when complete (exactlens.outputs); existing ones are refused unless
    ``overwrite``."""
    path = Path(path)
    folder = path.parent / f"{path.stem}_files"
    check_diff_page(path, overwrite, with_views=trained is not None)
    views = written = None
    title = f"exactlens diff against {result['exact']['name']}"
    # the page and its views are written before either is moved into place: a write error in one leaves both
    # as they were (the views folder, entered last, is moved in first)
    with contextlib.ExitStack() as stack:
        page_tmp = stack.enter_context(staged(path, overwrite=overwrite, kind="file", what="diff page"))
        if trained is not None:
            tmp = stack.enter_context(staged(folder, overwrite=overwrite, what="attention views folder"))
            written = attention_views(result, trained, tmp)
            if written is not None:
                views = tuple((folder / p.relative_to(tmp)).relative_to(path.parent).as_posix() for p in written)
        page = (
            f'<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n<title>{esc(title)}</title>\n'
            f"<style>{_CSS}</style>\n</head>\n<body>\n<h1>{esc(title)}</h1>\n{diff_html(result, views)}\n"
            "</body>\n</html>\n"
        )
        with naming(path):
            page_tmp.write_text(page, encoding="utf-8")
    if trained is not None and written is None:  # not an ExactTransformer: no views (the empty folder goes again)
        folder.rmdir()
    return path


def check_diff_page(path: str | Path, overwrite: bool = False, with_views: bool = True) -> None:
    """Check, before a diff is computed, that its page (and views folder) can be written."""
    path = Path(path)
    check_output(path, overwrite=overwrite, kind="file", what="diff page")
    if with_views:
        check_output(path.parent / f"{path.stem}_files", overwrite=overwrite, what="attention views folder")

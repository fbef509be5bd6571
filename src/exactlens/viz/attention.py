"""Attention patterns of one string: an offline circuitsvis page and a static heat map.

Both read ``blocks.{l}.attn.hook_pattern`` [batch, head, query, key] from
``run_with_cache``. The circuitsvis page inlines circuitsvis's JavaScript
(``RenderedHTML.local_src``), so it renders without a network; the bundle is
included once and renders one ``AttentionPatterns`` view per layer. With ``bundle_dir`` the bundle
(~1.3 MB, an IIFE defining the global ``CircuitsVis``) is written once to
``bundle_dir/circuitsvis.js`` and pages load it with a classic ``<script src>`` (module scripts
cannot be loaded from file:// URLs), so a report of many views carries it once.
"""

from __future__ import annotations

import html
import os
import re
from collections.abc import Sequence
from pathlib import Path

import torch

from exactlens.errors import ExactLensError
from exactlens.model import ExactTransformer
from exactlens.outputs import save_figure, write_text
from exactlens.viz.backend import pyplot

# local_src is '<div id="ID" .../>' then one module script: the bundle, then
# 'CircuitsVis.render("ID", CircuitsVis.AttentionPatterns, {...})'.
_LOCAL_SRC = re.compile(
    r'^\s*<div id="(?P<id>[^"]+)"[^>]*>\s*<script[^>]*type="module"[^>]*>(?P<body>.*)</script>\s*$', re.S
)
_RENDER_CALL = "CircuitsVis.render("

_PAGE_CSS = """
body { font-family: system-ui, sans-serif; margin: 1.5em; color: #222; }
h1 { font-size: 1.3em; } h2 { font-size: 1.1em; margin-top: 1.5em; }
code { background: #f3f3f3; padding: 0 .2em; }
"""


def _tokens_1d(model: ExactTransformer, tokens: torch.Tensor | Sequence[int]) -> torch.Tensor:
    tokens = torch.as_tensor(tokens, dtype=torch.long)
    if tokens.ndim != 1 or tokens.shape[0] == 0:
        raise ExactLensError(f"tokens must be one non-empty sequence of token ids, got shape {tuple(tokens.shape)}")
    return tokens


def token_labels(model: ExactTransformer, tokens: torch.Tensor | Sequence[int]) -> list[str]:
    """Token names from cfg.vocab (ids where there is none). '<' and '>' become '‹' '›':
    circuitsvis does not escape labels."""
    vocab = model.cfg.vocab
    labels = [vocab[int(t)] if vocab is not None else str(int(t)) for t in _tokens_1d(model, tokens)]
    return [label.replace("<", "‹").replace(">", "›") for label in labels]


@torch.no_grad()
def attention_patterns(model: ExactTransformer, tokens: torch.Tensor | Sequence[int]) -> list[torch.Tensor]:
    """Per layer, the attention pattern [head, query, key] of one string, float32 on CPU."""
    tokens = _tokens_1d(model, tokens)
    _, cache = model.run_with_cache(tokens.unsqueeze(0), names_filter=lambda name: name.endswith("hook_pattern"))
    return [cache[f"blocks.{layer}.attn.hook_pattern"][0].float().cpu() for layer in range(model.cfg.n_layers)]


def _open_div(src: str) -> str:
    """'<div .../>' is no empty element in HTML: give it an explicit end tag."""
    return re.sub(r"^(\s*<div\b[^>]*?)\s*/>", r"\1></div>", src, count=1)


BUNDLE_FILE = "circuitsvis.js"


def _combine(views: list[tuple[str, str]], page: Path | None = None, bundle_dir: Path | None = None) -> str:
    """(heading HTML, local_src) per view -> body HTML with the bundle included once (inline, or with
    ``bundle_dir`` from a shared file next to ``page``'s folder). Falls back to each view's own
    local_src when its layout is not the expected one."""
    parsed = [_LOCAL_SRC.match(src) for _, src in views]
    bodies = [m.group("body") if m else "" for m in parsed]
    cuts = [b.rfind(_RENDER_CALL) for b in bodies]
    bundles = {b[:c].strip() for b, c in zip(bodies, cuts, strict=True)}
    if all(parsed) and all(c > 0 for c in cuts) and len(bundles) == 1:
        divs = [f'{heading}\n<div id="{html.escape(m.group("id"))}" style="margin: 15px 0;"></div>'
                for (heading, _), m in zip(views, parsed, strict=True)]
        calls = "\n".join(b[c:].strip() for b, c in zip(bodies, cuts, strict=True))
        bundle = bundles.pop()
        if bundle_dir is None or page is None:
            return "\n".join(divs) + f'\n<script type="module">\n{bundle}\n{calls}\n</script>'
        shared = Path(bundle_dir) / BUNDLE_FILE
        if not shared.exists() or shared.read_text(encoding="utf-8") != bundle:
            write_text(shared, bundle, overwrite=True, what="circuitsvis bundle")
        src = Path(os.path.relpath(shared, page.parent)).as_posix()
        return ("\n".join(divs) + f'\n<script src="{html.escape(src)}"></script>\n'
                f"<script>\n{calls}\n</script>")
    return "\n".join(f"{heading}\n<section>{_open_div(src)}</section>" for heading, src in views)


def attention_view(model: ExactTransformer, tokens: torch.Tensor | Sequence[int], path: str | Path,
                   title: str, bundle_dir: str | Path | None = None) -> Path:
    """Write an offline circuitsvis page with every layer's heads; return its path. Standalone (the
    JavaScript inlined) unless ``bundle_dir`` names a folder shared by several pages (see above)."""
    from circuitsvis.attention import attention_patterns as cv_attention_patterns

    labels = token_labels(model, tokens)
    patterns = attention_patterns(model, tokens)
    views = []
    for layer, pattern in enumerate(patterns):
        heading = (f"<h2>Layer {layer + 1} <small>(<code>blocks.{layer}.attn.hook_pattern</code>, "
                   f"{pattern.shape[0]} head{'s' if pattern.shape[0] != 1 else ''})</small></h2>")
        views.append((heading, cv_attention_patterns(tokens=labels, attention=pattern).local_src))
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    page = (
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
        f"<title>{html.escape(title)}</title>\n<style>{_PAGE_CSS}</style>\n</head>\n<body>\n"
        f"<h1>{html.escape(title)}</h1>\n"
        f"<p>Tokens: <code>{html.escape(' '.join(labels))}</code>. Rows are queries, columns keys; "
        "hover a head to see its pattern.</p>\n"
        f"{_combine(views, path, None if bundle_dir is None else Path(bundle_dir))}\n</body>\n</html>\n"
    )
    write_text(path, page, overwrite=True, what="attention page")  # a building block: re-drawn in place
    return path


def attention_heatmap(model: ExactTransformer, tokens: torch.Tensor | Sequence[int], path: str | Path,
                      title: str) -> Path:
    """The same patterns as a static PNG (rows: layers, columns: heads), with matplotlib only."""
    plt = pyplot()

    labels = token_labels(model, tokens)
    patterns = attention_patterns(model, tokens)
    n_layers, n_heads = len(patterns), max(p.shape[0] for p in patterns)
    size = 1.0 + 0.28 * len(labels)
    fig, axes = plt.subplots(n_layers, n_heads, figsize=(size * n_heads + 1.2, size * n_layers + 0.5),
                             squeeze=False, layout="constrained")
    top = max(float(p.max()) for p in patterns) or 1.0  # one colour scale for every head
    image = None
    for layer, pattern in enumerate(patterns):
        for head in range(n_heads):
            ax = axes[layer][head]
            if head >= pattern.shape[0]:
                ax.axis("off")
                continue
            image = ax.imshow(pattern[head].numpy(), vmin=0.0, vmax=top, cmap="Blues")
            ax.set_title(f"layer {layer + 1}, head {head + 1}", fontsize=9)
            ticks = range(len(labels))
            ax.set_xticks(ticks, labels, rotation=90, fontsize=7)
            ax.set_yticks(ticks, labels, fontsize=7)
            ax.set_xlabel("key", fontsize=8)
            ax.set_ylabel("query", fontsize=8)
    if image is not None:
        fig.colorbar(image, ax=axes, shrink=0.8, label="attention weight")
    fig.suptitle(title, fontsize=10)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    save_figure(fig, path, dpi=90)
    plt.close(fig)
    return path

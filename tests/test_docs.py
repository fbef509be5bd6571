"""The README and docs/: every docs file is linked from the README, every relative link resolves, and
every code block is closed (an unclosed fence swallows the rest of the page)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def test_every_docs_page_is_linked_from_the_readme():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    for page in sorted((ROOT / "docs").glob("*.md")):
        assert f"(docs/{page.name})" in readme, page.name


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_links_resolve_and_code_blocks_close(page):
    text = page.read_text(encoding="utf-8")
    fences = [line for line in text.splitlines() if line.lstrip().startswith("```")]
    assert len(fences) % 2 == 0, f"{page.name}: an unclosed code block"
    for target in re.findall(r"\]\(([^)#]+)\)", text):
        if "://" in target:
            continue
        assert (page.parent / target).exists(), f"{page.name}: broken link {target}"

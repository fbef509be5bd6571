"""The report in a real browser: headless Chromium opens index.html and a sample of the
attention views from disk with networking cut off (the index with the views it embeds
stubbed: the sample is opened on its own, once); the data of every view is checked
without a browser.

A page fails on any console error or uncaught exception, on any request that
leaves the report folder, or (attention views) when circuitsvis rendered nothing.
Needs Playwright (dev extra) and a Chromium binary (`make test` installs Debian's
chromium-headless-shell where missing). Without a browser the tests skip, unless
EXACTLENS_REQUIRE_BROWSER=1 (set by .ci/run), where they fail instead.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path
from urllib.parse import unquote, urlparse

import pytest

pytestmark = pytest.mark.browser

CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
BROWSERS = ("chromium-headless-shell", "chromium", "chromium-browser")
# The attention view that the negative control strips of its JavaScript.
CONTROL_VIEW = "parity"
WIDTH = 1280  # issue 16: at a window this wide no page of the report scrolls sideways


def _browser_path() -> str | None:
    for name in BROWSERS:
        found = shutil.which(name)
        if found:
            return found
    return None


def _missing(why: str) -> None:
    if os.environ.get("EXACTLENS_REQUIRE_BROWSER") == "1":
        pytest.fail(f"{why} (EXACTLENS_REQUIRE_BROWSER=1)")
    pytest.skip(why)


@pytest.fixture(scope="module")
def browser():
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _missing("playwright is not installed (pip install -e '.[dev]')")
    path = _browser_path()
    if path is None:
        _missing(f"no Chromium binary found (looked for {', '.join(BROWSERS)}; `make setup-browser` installs one)")
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=path, headless=True, args=CHROMIUM_ARGS)
        yield browser
        browser.close()


@pytest.fixture(scope="module")
def report(quick_report: Path) -> Path:
    return quick_report


class PageVisit:
    """Open one file of the report and record what went wrong."""

    def __init__(self, browser, root: Path, stub_frames: bool = False):
        self.root = root.resolve()
        # stub_frames: a page embedded in an iframe (inside the report) is answered with an empty page and
        # its path recorded in .frames; the embedded pages are then checked on their own, each opened alone.
        self.stub_frames = stub_frames
        self.frames: list[Path] = []
        self.context = browser.new_context(offline=True, java_script_enabled=True)
        self.page = self.context.new_page()
        # A busy 2-core machine is slow to parse circuitsvis's JavaScript (each attention view; the
        # index with its embedded views loaded took 80 s in CI): a generous timeout.
        self.page.set_default_timeout(180_000)
        self.page.set_viewport_size({"width": WIDTH, "height": 900})  # issue 16: pages fit a 1280 px window
        self.problems: list[str] = []
        self.page.on("console", self._console)
        self.page.on("pageerror", lambda exc: self.problems.append(f"uncaught exception: {exc}"))
        self.context.route("**/*", self._route)

    def _console(self, message) -> None:
        if message.type == "error":
            self.problems.append(f"console error: {message.text}")

    def _inside_report(self, url: str) -> bool:
        parsed = urlparse(url)
        if parsed.scheme == "data" or url.startswith("about:"):
            return True
        if parsed.scheme != "file":
            return False
        return Path(unquote(parsed.path)).resolve().is_relative_to(self.root)

    def _route(self, route) -> None:
        url = route.request.url
        request = route.request
        if (self.stub_frames and self._inside_report(url) and request.resource_type == "document"
                and request.frame != self.page.main_frame):
            self.frames.append(Path(unquote(urlparse(url).path)).resolve())
            route.fulfill(status=200, content_type="text/html", body="<!doctype html><title>embedded</title>")
        elif self._inside_report(url):
            route.continue_()
        else:
            self.problems.append(f"request outside the report folder: {url}")
            route.abort()

    def open(self, path: Path) -> None:
        self.page.goto(path.resolve().as_uri(), wait_until="load")
        self.page.wait_for_timeout(300)  # let React render and any late errors surface

    def overflow(self) -> int | None:
        """The page's width where it is wider than the window (it would scroll sideways), else None."""
        width = self.page.evaluate("() => document.documentElement.scrollWidth")
        return width if width > WIDTH else None

    def close(self) -> None:
        self.context.close()


def _visit(browser, report: Path, path: Path, stub_frames: bool = False) -> PageVisit:
    visit = PageVisit(browser, report, stub_frames=stub_frames)
    visit.open(path)
    return visit


def _attention_views(report: Path) -> list[Path]:
    """Every attention view of the report, those in sub-folders (formation, diffs) too."""
    return sorted(path.resolve() for path in (report / "attention").rglob("*.html"))


def test_index_opens_without_errors_or_outside_requests(browser, report: Path) -> None:
    """The index loads cleanly and does not scroll sideways at a 1280 px window (issue 16). The attention
    views it embeds are answered with an empty page here (loading all of them took the index a minute and
    more): each is an attention view of the report, whose data test_every_attention_view_is_well_formed checks and
    a sample of which test_attention_views_render opens alone."""
    visit = _visit(browser, report, report / "index.html", stub_frames=True)
    try:
        assert visit.problems == []
        embedded = visit.page.eval_on_selector_all("iframe", "els => els.length")
        assert embedded > 0 and len(visit.frames) == embedded, (embedded, visit.frames)
        views = set(_attention_views(report))
        assert [f for f in visit.frames if f not in views] == [], "an embedded page that is no attention view"
        assert visit.overflow() is None, f"index.html is {visit.overflow()} px wide at a {WIDTH} px window"
        assert visit.page.title()
        images = visit.page.eval_on_selector_all("img", "els => els.map(e => [e.src, e.naturalWidth])")
        assert images, "the index shows no figure"
        broken = [src for src, width in images if width == 0]
        assert broken == [], f"images that did not load: {broken}"
    finally:
        visit.close()


def _rendered_sample(views: list[Path]) -> list[Path]:
    """The views opened in the browser: in each folder of attention/ (the constructions', each diff's, each
    formation's) its first and its largest page (the most heads, layers and tokens). Every view is built by one
    routine from its data; the data of all of them is checked without a browser
    (:func:`test_every_attention_view_is_well_formed`), and each page opened costs the browser 2-4 s of parsing
    circuitsvis's 1.3 MB of JavaScript on a busy 2-core machine (all 43 views of the quick report: 94 s)."""
    folders: dict[Path, list[Path]] = {}
    for view in views:
        folders.setdefault(view.parent, []).append(view)
    chosen = set()
    for members in folders.values():
        chosen |= {members[0], max(members, key=lambda v: v.stat().st_size)}
    return sorted(chosen)


def test_every_attention_view_is_well_formed(report: Path) -> None:
    """Every attention view of the report, without a browser (:func:`_view_problems`)."""
    views = _attention_views(report)
    assert len(views) >= 20, [v.name for v in views]
    assert [problem for view in views for problem in _view_problems(view, report)] == []


def test_a_malformed_view_is_caught(report: Path, tmp_path: Path) -> None:
    """The data check itself can fail: a copy with a NaN in a pattern, a pattern row cut short, a mount point
    renamed, or its script outside the report is flagged."""
    view = report / "attention" / f"{CONTROL_VIEW}.html"
    text = view.read_text(encoding="utf-8")
    copy = tmp_path / "attention" / "copy.html"
    copy.parent.mkdir()
    (tmp_path / "assets").mkdir()
    (tmp_path / "assets" / "circuitsvis.js").write_text("")
    copy.write_text(text, encoding="utf-8")
    assert _view_problems(copy, tmp_path) == []
    number = re.search(r"\[\[\[(\d\.\d+)", text).group(1)
    mount = re.search(r'<div id="([^"]+)"', text).group(1)
    broken = {"NaN": text.replace(f"[[[{number}", "[[[NaN", 1),
              "patterns are not": text.replace(f"[[[{number}, ", "[[[", 1),
              "no element": text.replace(f'<div id="{mount}"', '<div id="elsewhere"', 1),
              "not files inside the report": text.replace('src="../assets/circuitsvis.js"', 'src="../../x.js"')}
    for what, bad in broken.items():
        copy.write_text(bad, encoding="utf-8")
        found = _view_problems(copy, tmp_path)
        assert any(what in problem for problem in found), (what, found)


def _view_problems(view: Path, report: Path) -> list[str]:
    """What is wrong with one attention view's page: it loads the report's circuitsvis script (a path that exists
    inside the report), and each of its CircuitsVis.render calls mounts on an element of the page and passes strict
    JSON: tokens, and one finite [n_tokens x n_tokens] pattern per head."""
    import json
    import math

    name = view.relative_to(report.resolve()) if view.resolve().is_relative_to(report.resolve()) else view.name
    text = view.read_text(encoding="utf-8")
    problems = []
    scripts = re.findall(r'<script src="([^"]+)"></script>', text)
    inside = [(view.parent / src).resolve() for src in scripts]
    if not scripts or not all(path.is_file() and path.is_relative_to(report.resolve()) for path in inside):
        problems.append(f"{name}: scripts {scripts} are not files inside the report")
    calls = list(re.finditer(r'CircuitsVis\.render\(\s*"([^"]+)",\s*CircuitsVis\.AttentionPatterns,\s*', text))
    if not calls or len(calls) != text.count("CircuitsVis.render("):
        problems.append(f"{name}: {text.count('CircuitsVis.render(')} render calls, {len(calls)} of attention patterns")
    for call in calls:
        if f'id="{call.group(1)}"' not in text:
            problems.append(f"{name}: no element {call.group(1)} to mount on")
        props, _ = json.JSONDecoder(parse_constant=lambda c: problems.append(f"{name}: {c} in its data")
                                    ).raw_decode(text, call.end())
        n = len(props["tokens"])
        heads = props["attention"]
        if not heads or any(len(head) != n or any(len(row) != n for row in head) for head in heads):
            problems.append(f"{name}: patterns are not {n} x {n} for its {n} tokens")
        elif not all(isinstance(x, (int, float)) and math.isfinite(x) for head in heads for row in head for x in row):
            problems.append(f"{name}: a pattern value is not finite")
    return problems


def test_attention_views_render(browser, report: Path, tmp_path: Path) -> None:
    """A sample of the attention views (:func:`_rendered_sample`: every folder's first and largest page), each
    in one page: drawn, without errors, and no wider than a 1280 px window (issue 16)."""
    views = _rendered_sample(_attention_views(report))
    assert len(views) >= 5, [v.name for v in views]
    visit = PageVisit(browser, report)
    failures = []
    try:
        for view in views:
            name = view.relative_to(report.resolve())
            visit.problems.clear()
            visit.open(view)
            if not _drawn(visit.page, timeout_ms=10_000):
                failures.append(f"{name}: circuitsvis drew nothing")
                continue
            shot = tmp_path / f"{view.parent.name}-{view.stem}.png"
            visit.page.screenshot(path=str(shot), full_page=True)
            if _distinct_colours(shot) <= 10:
                failures.append(f"{name}: the screenshot is (nearly) blank")
            if visit.overflow() is not None:
                failures.append(f"{name}: {visit.overflow()} px wide at a {WIDTH} px window")
            failures += [f"{name}: {p}" for p in visit.problems]
    finally:
        visit.close()
    assert failures == []


def _drawn(page, timeout_ms: int) -> bool:
    """Did circuitsvis draw? Its views are SVG/canvas/table elements inside the mount
    point; when its JavaScript does not run, the page is an empty <div>."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    try:
        page.wait_for_function("() => document.querySelectorAll('svg, canvas, td').length > 0", timeout=timeout_ms)
    except PlaywrightTimeout:
        return False
    return page.evaluate("() => document.body.querySelectorAll('*').length") > 30


def test_a_view_without_its_javascript_counts_as_blank(browser, report: Path, tmp_path: Path) -> None:
    """The render check itself can fail: strip the scripts and it must. The stripped copy is written
    outside the shared report (other tests, in other workers, read every page of it)."""
    view = report / "attention" / f"{CONTROL_VIEW}.html"
    blank = tmp_path / "blank-for-test.html"
    blank.write_text(re.sub(r"<script[\s\S]*?</script>", "", view.read_text(encoding="utf-8")), encoding="utf-8")
    visit = _visit(browser, tmp_path, blank)
    try:
        assert not _drawn(visit.page, timeout_ms=1_500)
    finally:
        visit.close()


def _distinct_colours(png: Path) -> int:
    import matplotlib.image

    pixels = matplotlib.image.imread(str(png))
    flat = (pixels[..., :3].reshape(-1, 3) * 255).round().astype(int)
    return len({tuple(p) for p in flat[:: max(1, len(flat) // 20000)]})


def test_an_outside_request_is_caught(browser, report: Path, tmp_path: Path) -> None:
    """The check itself can fail: a page that loads a CDN script is flagged."""
    bad = tmp_path / "bad-page-for-test.html"  # not in the shared report: other workers read its pages
    bad.write_text('<html><body><script src="https://cdn.example.org/x.js"></script></body></html>')
    visit = _visit(browser, tmp_path, bad)
    try:
        assert any("outside the report folder" in p for p in visit.problems), visit.problems
    finally:
        visit.close()


def test_no_horizontal_overflow_at_1280_px(browser, report: Path) -> None:
    """Issue 16: at a 1280 px wide window no page of the report scrolls sideways (wide tables scroll
    inside themselves). Here the trained-vs-exact views (attention/*/); the index and every attention view
    are measured where they are opened already (the tests above)."""
    pages = sorted((report / "attention").glob("*/*.html"))[:2]
    assert pages, "the report has no trained-vs-exact views"
    visit = PageVisit(browser, report)
    try:
        wide = []
        for page in pages:
            visit.open(page)
            if visit.overflow() is not None:
                wide.append(f"{page.relative_to(report)}: {visit.overflow()} px")
        assert wide == []
    finally:
        visit.close()

"""Every code block in README.md and docs/*.md runs (at small settings where it says so).

A fresh process (this interpreter; started once per half of the pages, since torch and TransformerLens
take seconds to import) runs its pages in turn; each page's blocks run in order in the page's own temporary
directory, which holds src/, benchmarks/ and examples/ (copies of the checkout's, so
``PYTHONPATH=src python benchmarks/x.py`` works and whatever a block writes, even into src/,
lands in the temporary directory, never in the checkout). A block may use what an earlier block
of its page defined or wrote; a failing block ends its page, and the failure names the page, the
line and the block as run:

* ```python blocks are executed in one namespace per page (tracebacks name the page and its line);
* ```bash blocks run line by line (``\\`` continues a line, ``#`` starts a comment): a plain
  ``exactlens ARGS`` line calls the command's own entry point, ``exactlens.cli.main(ARGS)``, in that
  process (no interpreter start per line) and must exit 0, and with ``--json``
  print one JSON object; any other line runs in ``bash -e -o pipefail`` with the environment's
  bin/ first on PATH (so ``python`` and ``exactlens`` are this environment's);
* ```toml and ```json blocks must parse; a bare ``` fence (or ```text) is a picture, not code.

An HTML comment on the line(s) right above a fence changes how its block is tested; a reader
never sees it, the test shows each one:

    <!-- test: replace "--epochs 1000" "--epochs 2" -->   run with this text replaced (every occurrence)
    <!-- test: env EXACTLENS_NOTEBOOK_QUICK=1 -->         extra environment variables for the block
    <!-- test: skip installs into the environment (tests/test_plugins.py runs these commands) -->
    <!-- test: slow about 3 minutes -->                   runs only with -m slow (make test-slow)
    <!-- test: covered-by README.md -->                   not run here: every command of it (as run, with its
                                                           replaces) is one of a block that runs on that page

A skip or slow needs its reason; every skip is reported by pytest (``-ra``: SKIPPED with page,
line and reason). ``python tests/test_docs_code.py [--slow] [PAGE ...]`` runs pages by hand and
prints each block's time.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
COPIED = ("src", "benchmarks", "examples")  # what a block may read from the checkout, copied into its directory
RUN = {"python": "python", "py": "python", "bash": "bash", "sh": "bash", "shell": "bash"}
PARSE = {"toml", "json"}
TEXT = {"", "text"}
MARKER = "@@exactlens-docs-block"
RUN_TIMEOUT_S = 1800  # every page together; a quiet 2-core machine needs ~2 min

FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})(?P<info>.*)$")
DIRECTIVE = re.compile(r"^\s*<!--\s*test:\s*(?P<body>.*?)\s*-->\s*$")


@dataclass
class Block:
    page: str  # path relative to the repository
    line: int  # line of the opening fence (1-based)
    lang: str
    code: str  # as written (indentation of the fence removed)
    replace: list[tuple[str, str]] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    skip: str | None = None  # the reason
    slow: str | None = None  # the reason
    covered_by: str | None = None  # the page whose runnable blocks run every command of this one
    problems: list[str] = field(default_factory=list)  # bad directives

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"

    @property
    def runnable_code(self) -> str:
        code = self.code
        for old, new in self.replace:
            code = code.replace(old, new)
        return code


def _directive(block: Block, body: str) -> None:
    verb, _, rest = body.partition(" ")
    rest = rest.strip()
    if verb == "skip" or verb == "slow":
        if not rest:
            block.problems.append(f"'{verb}' needs a reason: <!-- test: {verb} WHY -->")
        setattr(block, verb, rest or "(no reason given)")
    elif verb == "covered-by":
        if not (ROOT / rest).is_file():
            block.problems.append(f"covered-by names a page of the repository (e.g. README.md); got {rest!r}")
        block.covered_by = rest or "(no page given)"
    elif verb == "replace":
        try:
            parts = shlex.split(rest)
        except ValueError as err:
            parts = [str(err)]
        if len(parts) != 2 or not parts[0]:
            block.problems.append(f'replace takes two quoted strings, "OLD" "NEW"; got {rest!r}')
        elif parts[0] not in block.code:
            block.problems.append(f"replace: {parts[0]!r} is not in the block")
        else:
            block.replace.append((parts[0], parts[1]))
    elif verb == "env":
        for item in shlex.split(rest):
            key, eq, value = item.partition("=")
            if not eq or not key:
                block.problems.append(f"env takes KEY=VALUE items; got {item!r}")
            else:
                block.env[key] = value
    else:
        block.problems.append(f"unknown test directive {verb!r} (skip, slow, replace, env, covered-by)")


def blocks_of(page: Path) -> list[Block]:
    """Every fenced block of a page, with the directives in the comment lines right above it."""
    lines = page.read_text(encoding="utf-8").splitlines()
    rel = _page_id(page)
    out: list[Block] = []
    i = 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if not opening:
            i += 1
            continue
        indent, fence = opening["indent"], opening["fence"]
        end = i + 1
        while end < len(lines) and not re.match(rf"^[ \t]*{re.escape(fence[0])}{{{len(fence)},}}\s*$", lines[end]):
            end += 1
        body = [ln[len(indent):] if ln.startswith(indent) else ln.lstrip() for ln in lines[i + 1:end]]
        block = Block(rel, i + 1, opening["info"].strip().split(" ")[0].lower(), "\n".join(body) + "\n")
        above = i - 1
        comments = []
        while above >= 0 and DIRECTIVE.match(lines[above]):
            comments.insert(0, DIRECTIVE.match(lines[above])["body"])
            above -= 1
        for body_text in comments:
            _directive(block, body_text)
        if block.lang not in RUN and block.lang not in PARSE and block.lang not in TEXT:
            block.problems.append(f"a ```{block.lang} block: the test knows python, bash, toml, json and text")
        out.append(block)
        i = end + 1
    return out


# ---- the driver: runs one page's blocks in this process (the test starts it as a subprocess) ----------


def _logical_lines(code: str) -> list[tuple[int, str]]:
    """(offset of the first line, command) for each command of a bash block."""
    out, pending, start = [], "", 0
    for offset, raw in enumerate(code.splitlines()):
        if not pending:
            start = offset
        if raw.rstrip().endswith("\\"):
            pending += raw.rstrip()[:-1] + " "
            continue
        line = (pending + raw).strip()
        pending = ""
        if line and not line.startswith("#"):
            out.append((start, line))
    return out


SHELL_SYNTAX = set("|&;<>$`(){}*?~")


def _plain_exactlens(line: str) -> list[str] | None:
    """The arguments of an ``exactlens ...`` line without shell syntax (else None: bash runs it)."""
    try:
        argv = shlex.split(line, comments=True)
    except ValueError:
        return None
    if not argv or argv[0] != "exactlens" or any(SHELL_SYNTAX & set(arg) for arg in argv):
        return None
    return argv[1:]


def _run_exactlens(argv: list[str]) -> tuple[int, str, str]:
    from exactlens.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as exit_:  # argparse's --help or a usage error
            code = exit_.code if isinstance(exit_.code, int) else 1
    return code, out.getvalue(), err.getvalue()


class BlockFailed(Exception):
    def __init__(self, what: str, detail: str):
        super().__init__(what)
        self.what, self.detail = what, detail


def _event(**fields) -> None:
    print(f"{MARKER} {json.dumps(fields)}", flush=True)


def _run_bash_block(block: dict, env: dict[str, str]) -> None:
    first = block["line"] + 1
    for offset, line in _logical_lines(block["code"]):
        argv = _plain_exactlens(line)
        where = f"line {first + offset}: {line}"
        if argv is not None:
            code, stdout, stderr = _run_exactlens(argv)
            if code != 0:
                raise BlockFailed(where, f"exit status {code}\n--- stderr ---\n{stderr[-4000:]}")
            if "--json" in argv:
                try:
                    json.loads(stdout)
                except ValueError as err:
                    raise BlockFailed(where, f"--json, but stdout is not one JSON object ({err}):\n"
                                             f"{stdout[-2000:]}") from None
            continue
        done = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", line], env=env, capture_output=True, text=True)
        if done.returncode != 0:
            raise BlockFailed(where, f"exit status {done.returncode}\n--- stdout ---\n{done.stdout[-2000:]}\n"
                                     f"--- stderr ---\n{done.stderr[-4000:]}")


def _run_block(block: dict, namespace: dict) -> None:
    if block["lang"] == "python":
        code = compile("\n" * block["line"] + block["code"], block["page"], "exec")
        try:
            exec(code, namespace)
        except BaseException as err:  # noqa: BLE001 -- reported with the page's line numbers
            if isinstance(err, SystemExit) and err.code in (None, 0):
                return
            raise BlockFailed("python", traceback.format_exc()[-6000:]) from None
    else:
        _run_bash_block(block, dict(os.environ))


def drive(payload: dict) -> None:
    """Run each page's blocks in order, in the page's directory, one namespace per page; a failing
    block ends its page (the next page still runs). Events go to stdout as marker lines."""
    import matplotlib

    matplotlib.use("Agg")
    for page in payload["pages"]:
        os.chdir(page["dir"])
        namespace: dict = {"__name__": "__main__"}
        for block in page["blocks"]:
            _event(event="start", page=page["page"], line=block["line"])
            wall, cpu = time.perf_counter(), time.process_time()
            saved = dict(os.environ)
            os.environ.update(block["env"])
            try:
                _run_block(block, namespace)
            except BlockFailed as failed:
                _event(event="failed", page=page["page"], line=block["line"], what=failed.what, detail=failed.detail)
                break
            finally:
                os.environ.clear()
                os.environ.update(saved)
            _event(event="ok", page=page["page"], line=block["line"], wall_s=round(time.perf_counter() - wall, 1),
                   cpu_s=round(time.process_time() - cpu, 1))
        _event(event="page done", page=page["page"])


# ---- the tests -------------------------------------------------------------------------------------


def _page_id(page: Path) -> str:
    return str(page.relative_to(ROOT)) if page.is_relative_to(ROOT) else page.name


def runnable(page: Path, include_slow: bool) -> list[Block]:
    return [b for b in blocks_of(page) if b.lang in RUN and b.skip is None and b.covered_by is None
            and (include_slow or b.slow is None)]


def _commands(block: Block) -> list[str]:
    """The block's commands as run: bash logical lines, or python lines (comments and blank lines aside)."""
    if RUN.get(block.lang) == "bash":
        return [line.split(" #")[0].strip() for _, line in _logical_lines(block.runnable_code)]
    return [line.split("  #")[0].rstrip() for line in block.runnable_code.splitlines()
            if line.strip() and not line.lstrip().startswith("#")]


def uncovered(block: Block, page: Path) -> list[str]:
    """The commands of ``block`` that no runnable block of ``page`` (its language, slow ones excluded) runs."""
    ran = {c for b in runnable(page, include_slow=False) if RUN[b.lang] == RUN[block.lang] for c in _commands(b)}
    return [c for c in _commands(block) if c not in ran]


def _message(block: Block, what: str, detail: str) -> str:
    shown = block.runnable_code
    if block.replace:
        shown += f"(as run: the block with {block.replace} applied)\n"
    return (f"{block.where}: the ```{block.lang} block starting at line {block.line} fails ({what})\n"
            f"{detail.strip()}\n--- the block ---\n{shown}")


def run_pages(pages: list[Path], include_slow: bool, tmp: Path, timeout_s: float = RUN_TIMEOUT_S) -> dict:
    """Run the pages' runnable blocks in one process under ``tmp``. Returns, per page id (pages with
    code only): {"blocks": [...], "failure": message or None, "times": {line: (wall s, cpu s)}}."""
    for name in COPIED:
        shutil.copytree(ROOT / name, tmp / name, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", "build"))
    todo = {_page_id(p): runnable(p, include_slow) for p in pages}
    todo = {page: blocks for page, blocks in todo.items() if blocks}
    payload = {"pages": []}
    for k, (page, blocks) in enumerate(todo.items()):
        directory = tmp / "pages" / f"{k:02d}-{Path(page).stem}"
        directory.mkdir(parents=True)
        for name in COPIED:  # each page sees src/, benchmarks/, examples/ in its own directory
            (directory / name).symlink_to(tmp / name, target_is_directory=True)
        payload["pages"].append({"page": page, "dir": str(directory),
                                 "blocks": [dict(asdict(b), lang=RUN[b.lang], code=b.runnable_code) for b in blocks]})
    (tmp / "blocks.json").write_text(json.dumps(payload))
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env["PYTHONPATH"] = os.pathsep.join([str(tmp / "src"), *filter(None, [env.get("PYTHONPATH")])])
    env.update(PYTHONDONTWRITEBYTECODE="1", MPLBACKEND="Agg", OMP_NUM_THREADS="1", EXACTLENS_QUIET="1")
    command = [sys.executable, str(Path(__file__).resolve()), "--payload", str(tmp / "blocks.json")]
    try:
        done = subprocess.run(command, cwd=tmp, env=env, capture_output=True, text=True, timeout=timeout_s)
        stdout, stderr, died = done.stdout, done.stderr, done.returncode != 0
    except subprocess.TimeoutExpired as expired:
        stdout = expired.stdout.decode() if isinstance(expired.stdout, bytes) else (expired.stdout or "")
        stderr, died = f"(timed out after {timeout_s:.0f} s)", True
    events = [json.loads(line[len(MARKER) + 1:]) for line in stdout.splitlines() if line.startswith(MARKER + " ")]
    out = {page: {"blocks": blocks, "failure": None, "times": {}} for page, blocks in todo.items()}
    started: dict[str, int] = {}
    for event in events:
        page = out[event["page"]]
        by_line = {b.line: b for b in page["blocks"]}
        if event["event"] == "start":
            started[event["page"]] = event["line"]
        elif event["event"] == "ok":
            page["times"][event["line"]] = (event["wall_s"], event["cpu_s"])
        elif event["event"] == "failed":
            page["failure"] = _message(by_line[event["line"]], event["what"], event["detail"])
        elif event["event"] == "page done":
            started.pop(event["page"], None)
    for page, result in out.items():
        if result["failure"] is None and (page in started or len(result["times"]) < len(result["blocks"])):
            line = started.get(page)
            block = next((b for b in result["blocks"] if b.line == line), None)
            why = f"the process ended ({stderr.strip()[-3000:] or 'no message'})" if died else "never ran"
            result["failure"] = _message(block, why, "") if block else f"{page}: {why}"
    return out


# The pages run in SHARES processes, so that pytest-xdist's two workers share them and neither ends the run
# alone on a long one. The split balances the pages' measured times: `python tests/test_docs_code.py` on the
# shared 2-core machine at load ~20 (2026-11-28), in seconds (README.md and formation.md scaled by their CPU time
# after their timelines moved to test length 20); only the split reads them, a page not listed counts as
# DEFAULT_PAGE_S.
SHARES = 3
PAGE_SECONDS = {"README.md": 330, "docs/formation.md": 12, "docs/circuits.md": 154, "docs/diff.md": 137,
                "docs/training.md": 96, "docs/brody.md": 37, "docs/architecture.md": 36, "docs/tour.md": 35,
                "docs/your_model.md": 32, "docs/tracr.md": 31, "docs/nowak.md": 17, "docs/cookbook.md": 15,
                "docs/siit.md": 15, "docs/sweeps.md": 7}
DEFAULT_PAGE_S = 10


def shares(pages: list[Path], count: int = SHARES) -> list[list[Path]]:
    """``pages`` in ``count`` lists of about equal measured time (longest page first, each to the least
    loaded list); every page in exactly one list, each list in the pages' order."""
    load = [0.0] * count
    chosen: list[list[Path]] = [[] for _ in range(count)]
    for page in sorted(pages, key=lambda p: -PAGE_SECONDS.get(_page_id(p), DEFAULT_PAGE_S)):
        k = load.index(min(load))
        load[k] += PAGE_SECONDS.get(_page_id(page), DEFAULT_PAGE_S)
        chosen[k].append(page)
    return [sorted(share, key=pages.index) for share in chosen]


try:
    import pytest
except ImportError:  # the driver runs without pytest too
    pytest = None


if pytest is not None:
    ALL_BLOCKS = [b for page in PAGES for b in blocks_of(page)]

    @pytest.mark.parametrize("page", PAGES, ids=_page_id)
    def test_directives_are_valid(page):
        problems = [f"{b.where}: {p}" for b in blocks_of(page) for p in b.problems]
        assert not problems, "\n".join(problems)

    @pytest.mark.parametrize("share", range(SHARES), ids=lambda k: f"pages-{k + 1}-of-{SHARES}")
    def test_every_page_code_runs(share, tmp_path):
        """One process runs a share of the pages' blocks (one interpreter start); each failing block is named."""
        results = run_pages(shares(PAGES)[share], include_slow=False, tmp=tmp_path)
        failures = [r["failure"] for r in results.values() if r["failure"]]
        assert not failures, f"{len(failures)} page(s) with a failing block:\n\n" + "\n\n".join(failures)

    COVERED = [b for b in ALL_BLOCKS if b.covered_by is not None and b.lang in RUN]

    @pytest.mark.parametrize("block", COVERED, ids=lambda b: b.where)
    def test_a_covered_block_runs_on_its_page(block):
        """A block left out as a duplicate: each of its commands, as it would run, runs on the page named."""
        missing = uncovered(block, ROOT / block.covered_by)
        assert not missing, (f"{block.where} is covered-by {block.covered_by}, which does not run: {missing}; "
                             "give this block the same replaces, or remove the directive")

    SLOW_PAGES = [p for p in PAGES if any(b.slow is not None and b.skip is None for b in blocks_of(p))]

    @pytest.mark.slow
    @pytest.mark.parametrize("page", SLOW_PAGES, ids=_page_id)
    def test_page_code_runs_with_slow_blocks(page, tmp_path):
        failure = run_pages([page], include_slow=True, tmp=tmp_path)[_page_id(page)]["failure"]
        assert failure is None, failure

    @pytest.mark.parametrize("block", [b for b in ALL_BLOCKS if b.lang in PARSE], ids=lambda b: b.where)
    def test_data_blocks_parse(block):
        code = block.runnable_code
        parse = pytest.importorskip("tomllib").loads if block.lang == "toml" else json.loads  # tomllib: Python 3.11+
        try:
            parse(code)
        except ValueError as err:
            raise AssertionError(f"{block.where}: the ```{block.lang} block does not parse: {err}\n{code}") from err

    SAMPLE = """# a page

<!-- test: replace "range(3)" "range(2)" -->
```python
total = sum(range(3))
```

   <!-- test: env GREETING=hello -->
   ```bash
   test "$GREETING" = hello && \\
     echo "$GREETING" > greeting.txt
   ```

<!-- test: skip -->
```python
raise SystemExit("never run")
```

```python
assert total == 1, total  # 0 + 1: the replace applied
open("greeting.txt").read() == "hello\\n" or fail_here
undefined_name
```

```text
a picture
```
"""

    def test_the_test_reads_blocks_and_directives_and_names_a_failing_line(tmp_path):
        """The mechanism itself on a made-up page: directives, an indented fence, a block built on an
        earlier one, a skip without a reason (a problem), and the failure naming the page's line."""
        page = tmp_path / "sample.md"
        page.write_text(SAMPLE)
        blocks = blocks_of(page)
        assert [(b.line, b.lang) for b in blocks] == [(4, "python"), (9, "bash"), (15, "python"), (19, "python"),
                                                     (25, "text")]
        assert blocks[0].replace == [("range(3)", "range(2)")] and "range(2)" in blocks[0].runnable_code
        assert blocks[1].env == {"GREETING": "hello"} and blocks[1].code.startswith("test ")
        assert blocks[2].skip and blocks[2].problems == ["'skip' needs a reason: <!-- test: skip WHY -->"]
        assert _logical_lines(blocks[1].code) == [(0, 'test "$GREETING" = hello &&    echo "$GREETING" > greeting.txt')]
        assert _plain_exactlens("exactlens verify parity --lengths 1:4   # a comment") == ["verify", "parity",
                                                                                          "--lengths", "1:4"]
        assert _plain_exactlens("exactlens list | head") is None and _plain_exactlens("make test") is None
        result = run_pages([page], include_slow=False, tmp=tmp_path / "run")["sample.md"]
        assert set(result["times"]) == {4, 9}, "the blocks before the failing one ran"
        failure = result["failure"]
        assert failure.startswith("sample.md:19: the ```python block starting at line 19 fails (python)"), failure
        assert 'File "sample.md", line 22' in failure and "NameError" in failure, failure
        assert "--- the block ---\nassert total == 1" in failure
        other = tmp_path / "other.md"  # covered-by: a block whose commands another page runs, and one it does not
        other.write_text("<!-- test: replace 'b 1' 'b 2' -->\n```bash\nexactlens a  # x\nexactlens b 1\n```\n")
        block = Block("cov.md", 1, "bash", "exactlens a\nexactlens b 2\n", covered_by="other.md")
        assert uncovered(block, other) == []
        block = Block("cov.md", 1, "bash", "exactlens a\nexactlens b 1\n", covered_by="other.md")
        assert uncovered(block, other) == ["exactlens b 1"], "as run, the other page's line is 'exactlens b 2'"

    SKIPPED = [b for b in ALL_BLOCKS if b.skip is not None or b.slow is not None]

    @pytest.mark.parametrize("block", SKIPPED, ids=lambda b: b.where)
    def test_blocks_not_run_here(block):
        """One SKIPPED line per block that this run leaves out, with its reason (pytest -ra lists them)."""
        first = block.code.strip().splitlines()[0] if block.code.strip() else ""
        kind = "skipped" if block.skip is not None else "slow (make test-slow runs it)"
        pytest.skip(f"{block.where} ```{block.lang} {first!r}: {kind}: {block.skip or block.slow}")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--payload"]:
        drive(json.loads(Path(sys.argv[2]).read_text()))
    else:  # by hand: python tests/test_docs_code.py [--slow] [README.md docs/x.md ...] (default: every page)
        names = [a for a in sys.argv[1:] if a != "--slow"]
        with tempfile.TemporaryDirectory() as tmp:
            started = time.perf_counter()
            results = run_pages([ROOT / n for n in names] or PAGES, include_slow="--slow" in sys.argv, tmp=Path(tmp))
            for page, result in results.items():
                for line, (wall, cpu) in result["times"].items():
                    print(f"{page}:{line}  wall {wall:6.1f} s  cpu {cpu:6.1f} s (this process)")
                if result["failure"]:
                    print(f"FAILED {result['failure']}")
            print(f"{len(results)} pages in {time.perf_counter() - started:.0f} s")

"""Write faults in every multi-file output: a file-size limit (RLIMIT_FSIZE, as `ulimit -f`) while a
report, a training run or a checkpoint is written. The command fails in one line naming the file and
the reason (exit 2), and what was there before is left byte for byte (or nothing appears).

Each case runs in a subprocess that sets the limit and ignores SIGXFSZ (Python does too: the write
then fails with EFBIG instead of killing the process)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from exactlens.errors import ExactLensError
from exactlens.outputs import PARTIAL_TAG, failed_write, staged, write_error
from exactlens.viz.page import ReportIncomplete, Section, build_report

ROOT = Path(__file__).resolve().parents[1]
LIMIT = 20 * 1024  # bytes: `ulimit -f 20`

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="RLIMIT_FSIZE semantics checked on Linux")

LIMITED = """
import resource, signal, sys
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, ({limit}, {limit}))
{body}
"""


def limited(body: str, *, limit: int = LIMIT, args: tuple[str, ...] | list[str] = (),
            timeout: float = 240) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "EXACTLENS_QUIET": "1", "MPLBACKEND": "Agg"}
    script = LIMITED.replace("{limit}", str(limit)).replace("{body}", body)
    return subprocess.run([sys.executable, "-c", script, *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout, env=env)


def limited_cli(*argv: str, limit: int = LIMIT) -> subprocess.CompletedProcess:
    return limited(f"from exactlens.cli import main\nsys.exit(main({list(argv)!r}))", limit=limit)


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def leftovers(parent: Path) -> list[str]:
    return [p.name for p in parent.iterdir() if PARTIAL_TAG in p.name or ".replaced-" in p.name]


def old_report(folder: Path) -> dict[str, bytes]:
    """A stand-in for a good earlier report (its bytes are what must survive)."""
    (folder / "data").mkdir(parents=True)
    (folder / "index.html").write_text("<!DOCTYPE html><p>the old report</p>\n")
    (folder / "data" / "report.json").write_text(json.dumps({"errors": []}))
    return snapshot(folder)


def assert_one_line_failure(proc: subprocess.CompletedProcess, *needles: str) -> str:
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-3000:])
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("exactlens: error:")]
    assert len(errors) == 1, proc.stderr[-3000:]
    for needle in needles:
        assert needle in errors[0], errors[0]
    return errors[0]


# ---- the report: all or nothing ------------------------------------------------------------


BIG_SECTIONS = """
from exactlens.viz.page import Section, build_report
def big(ctx):
    ctx.write_json("small.json", {"ok": 1})
    ctx.write_json("big.json", {"values": list(range(20000))})  # ~140 kB: over the limit
    return [Section("Big", "big", "<p>big</p>")]
def caught(ctx):  # a section that catches its errors, as every real one does
    try:
        ctx.write_json("big2.json", {"values": list(range(20000))})
        html = "<p>fine</p>"
    except Exception as err:
        html = ctx.error("caught section", err)
    return [Section("Caught", "caught", html)]
for out in sys.argv[1:]:
    for builder in (big, caught):
        try:
            build_report(["first"], out, quick=True, overwrite=True, builders=[builder])
            print("WROTE", out, builder.__name__)
        except OSError as err:
            print("FAILED", out, builder.__name__, err)
"""


def test_a_report_over_the_file_size_limit_leaves_the_old_report(tmp_path):
    """A section writing past the limit, or catching that error as it catches its own: the report fails
    as a whole, the old one stays byte for byte, and into a new directory nothing appears."""
    before = old_report(tmp_path / "rep")
    proc = limited(BIG_SECTIONS, args=[str(tmp_path / "rep"), str(tmp_path / "new")])
    assert proc.returncode == 0, proc.stderr[-3000:]
    failed = [line for line in proc.stdout.splitlines() if line.startswith("FAILED")]
    assert len(failed) == 4 and "WROTE" not in proc.stdout, proc.stdout
    assert all("File too large" in line and "left as it was" in line for line in failed), failed
    assert str(tmp_path / "rep" / "data" / "big.json") in failed[0], failed[0]
    assert snapshot(tmp_path / "rep") == before
    assert not (tmp_path / "new").exists() and leftovers(tmp_path) == []


def test_the_cli_report_under_a_file_size_limit_fails_in_one_line(tmp_path):
    """`ulimit -f 20; exactlens report first --quick --out rep --overwrite` over a good report: exit 2,
    one line naming the file and the reason, the old report byte for byte."""
    before = old_report(tmp_path / "rep")
    proc = limited_cli("report", "first", "--quick", "--out", str(tmp_path / "rep"), "--overwrite")
    line = assert_one_line_failure(proc, "File too large", str(tmp_path / "rep"))
    assert PARTIAL_TAG not in line, "the file is named at its final path, not the hidden staging one"
    assert "wrote" not in proc.stdout
    assert snapshot(tmp_path / "rep") == before
    assert leftovers(tmp_path) == []


@pytest.mark.slow  # ~30 s; the API's checkpoint write under the limit is in tests/test_reliability.py
def test_train_over_a_good_run_under_a_file_size_limit_fails_in_one_line(tmp_path):
    """torch.save reports the failed write as a RuntimeError: it comes out as one line, not a traceback."""
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "run.json").write_text('{"seed": 0}')  # the good run's bytes are what must survive
    before = snapshot(tmp_path / "run")
    proc = limited_cli("train", "first", "--out", str(tmp_path / "run"), "--overwrite", "--epochs", "1",
                       "--strings-per-epoch", "10", "--test-strings", "10", limit=2048)
    assert_one_line_failure(proc, "File too large", str(tmp_path / "run"))
    assert snapshot(tmp_path / "run") == before
    assert leftovers(tmp_path) == []


def test_a_failed_section_is_on_the_page_and_fails_the_report(tmp_path):
    """A section that fails (not a write error) is shown on its page, recorded in report.json, and
    build_report raises once the report is in place (the CLI exits 2): never a silent gap."""

    def broken(ctx):
        try:
            raise ValueError("no such thing")
        except ValueError as err:
            return [Section("Broken", "broken", ctx.error("broken section", err))]

    def fine(ctx):
        return [Section("Fine", "fine", "<p>fine</p>")]

    with pytest.raises(ReportIncomplete, match="1 part.*broken section.*no such thing") as info:
        build_report(["first"], tmp_path / "rep", quick=True, builders=[fine, broken])
    assert isinstance(info.value, ExactLensError)
    page = (tmp_path / "rep" / "index.html").read_text()
    assert 'id="broken"' in page and "no such thing" in page and 'class="error"' in page
    recorded = json.loads((tmp_path / "rep" / "data" / "report.json").read_text())["errors"]
    assert recorded == [{"where": "broken section", "error": "ValueError: no such thing"}]
    assert info.value.index == tmp_path / "rep" / "index.html"


def test_a_write_error_is_never_shown_as_a_failed_section(tmp_path):
    def full_disk(ctx):
        try:
            raise OSError(28, "No space left on device")
        except OSError as err:
            return [Section("Full", "full", ctx.error("full section", err))]

    with pytest.raises(OSError, match="No space left on device") as info:
        build_report(["first"], tmp_path / "rep", quick=True, builders=[full_disk])
    assert "left as it was" in str(info.value)
    assert not (tmp_path / "rep").exists() and leftovers(tmp_path) == []


def test_report_names_as_one_string_mean_one_name(tmp_path):
    index = build_report("first", tmp_path / "rep", quick=True, builders=[])
    assert json.loads((index.parent / "data" / "report.json").read_text())["constructions"] == ["first"]
    with pytest.raises(ExactLensError, match="construction name"):
        build_report([123], tmp_path / "rep2", quick=True, builders=[])
    with pytest.raises(ExactLensError, match="list of construction names"):
        build_report(123, tmp_path / "rep3", quick=True, builders=[])


# ---- the staging helpers ---------------------------------------------------------------------


def test_a_write_error_names_the_final_path(tmp_path):
    target = tmp_path / "out"
    with pytest.raises(OSError) as info, staged(target) as tmp:
        raise OSError(27, "File too large", str(tmp / "data" / "x.json"))
    assert info.value.filename == str(target / "data" / "x.json")
    assert "File too large" in str(info.value) and "left as it was" in str(info.value)
    assert write_error(RuntimeError("wrapped")) is None
    try:
        try:
            raise OSError(28, "No space left on device")
        except OSError as inner:
            raise RuntimeError("a library's own error") from inner
    except RuntimeError as outer:
        assert isinstance(write_error(outer), OSError)


def test_failed_write_reads_the_reason_off_the_limit(tmp_path):
    (tmp_path / "w.pt").write_bytes(b"x" * 10)
    err = failed_write(tmp_path / "w.pt", RuntimeError("unexpected pos 704 vs 598"))
    assert isinstance(err, OSError) and err.filename == str(tmp_path / "w.pt")
    assert "unexpected pos" in err.strerror  # no limit, free disk: the library's reason is kept


def test_a_diff_page_and_its_views_are_written_together(tmp_path, monkeypatch):
    """The page and its attention-views folder: a write error in either leaves both as they were."""
    import exactlens as el
    from exactlens.viz import diff_page

    result = el.diff("first-flawed", "first", lengths=[2, 3], strings=4, parts=["behaviour"]).to_dict()

    def full_disk(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(diff_page, "diff_html", full_disk)
    with pytest.raises(OSError, match="No space left on device.*left as it was"):
        diff_page.write_diff_page(result, tmp_path / "d.html", trained="first-flawed")
    assert sorted(p.name for p in tmp_path.iterdir()) == [], "neither the page nor its views may appear"
    monkeypatch.undo()
    diff_page.write_diff_page(result, tmp_path / "d.html", trained="first-flawed")
    assert (tmp_path / "d.html").is_file() and any((tmp_path / "d_files").iterdir())

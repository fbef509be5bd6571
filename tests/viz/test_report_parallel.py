"""``exactlens report --jobs``: the constructions' work and the papers' sections in worker processes
give the same pages as one process, but for the times they state (exactlens.viz.parallel)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from exactlens.errors import ExactLensError
from exactlens.viz.page import build_report

# three papers' sections (Chiang & Cholak, Nowak, Shin & Matzinger: its declared parts), circuit discovery on two
NAMES = ["first", "one", "sm-solution1"]
TIMES = [re.compile(r"\d+\.\d+ \+ \d+\.\d+"),  # the discovery table's seconds
         re.compile(r"\d+(?:\.\d+)? s\b"),  # seconds in a text (a construction's, a training's)
         re.compile(r"<td>\d+\.\d</td>")]  # a table's seconds column (one decimal; other numbers have 3-4)
VIEW_ID = re.compile(r"circuits-vis-[0-9a-f-]+")
SECONDS = {"seconds", "faithfulness_seconds", "timings", "work_seconds", "cpu_timings", "tasks", "jobs", "made"}


def _without_times(value):
    if isinstance(value, dict):
        return {k: _without_times(v) for k, v in value.items() if k not in SECONDS}
    if isinstance(value, list):
        return [_without_times(v) for v in value]
    return value


def _page(path: Path) -> str:
    text = path.read_text(encoding="utf-8").split("<footer>")[0]
    for pattern in TIMES:
        text = pattern.sub("TIME", text)
    return text


@pytest.fixture(scope="module")
def reports(tmp_path_factory: pytest.TempPathFactory) -> dict[int, Path]:
    """The same report with one job and with two; with two, "one"'s parts also run apart (as
    tracr-shuffle_dyck2's do: exactlens.viz.parallel.APART)."""
    from exactlens.viz import parallel

    root = tmp_path_factory.mktemp("parallel")
    one = build_report(NAMES, root / "jobs1", quick=True, jobs=1).parent
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(parallel, "APART", ("one",))
        two = build_report(NAMES, root / "jobs2", quick=True, jobs=2).parent
    return {1: one, 2: two}


def test_two_jobs_write_the_pages_of_one(reports: dict[int, Path]) -> None:
    one, two = reports[1], reports[2]
    files = sorted(p.relative_to(one) for p in one.rglob("*") if p.is_file())
    assert files == sorted(p.relative_to(two) for p in two.rglob("*") if p.is_file())
    assert _page(one / "index.html") == _page(two / "index.html")
    for rel in files:
        if rel.suffix == ".json":
            a, b = (json.loads((r / rel).read_text(encoding="utf-8")) for r in (one, two))
            assert _without_times(a) == _without_times(b), rel
        elif rel.suffix == ".html" and rel.name != "index.html":  # circuitsvis draws a random element id
            assert VIEW_ID.sub("ID", (one / rel).read_text(encoding="utf-8")) == VIEW_ID.sub(
                "ID", (two / rel).read_text(encoding="utf-8")), rel
        elif rel.name != "index.html":
            assert (one / rel).read_bytes() == (two / rel).read_bytes(), rel
    made = json.loads((two / "data" / "report.json").read_text(encoding="utf-8"))
    assert made["jobs"] == 2 and "parallel_work" in made["timings"]
    assert set(made["work_seconds"]) == {"construction_section", "discovery_rows", "shin_matzinger_part"}
    assert "with 2 processes" in (two / "index.html").read_text(encoding="utf-8")


def test_each_worker_task_is_timed(reports: dict[int, Path]) -> None:
    """report.json lists every task of the workers with its wall and CPU seconds: one per construction, one per
    declared part (the Shin & Matzinger section's checks and each trained seed), one per whole builder."""
    made = json.loads((reports[2] / "data" / "report.json").read_text(encoding="utf-8"))
    tasks = {t["task"]: t for t in made["tasks"]}
    assert len(tasks) == len(made["tasks"])
    parts = {"shin_matzinger_part checks", "shin_matzinger_part solution2/0", "shin_matzinger_part combined/0"}
    apart = {"construction one (construction_section)", "construction one (discovery_rows)"}
    assert {"construction first", "construction sm-solution1"} | apart | parts <= set(tasks)
    assert {"chiang_figures_sections", "nowak_sections"} <= set(tasks)
    assert all(t["seconds"] >= 0 and t["cpu_seconds"] > 0 for t in tasks.values())
    assert set(made["cpu_timings"]) == set(made["timings"]) - {"parallel_work", "shrink_pngs"}
    one = json.loads((reports[1] / "data" / "report.json").read_text(encoding="utf-8"))
    assert one["tasks"] == [] and set(one["cpu_timings"]) == set(one["timings"]) - {"shrink_pngs"}
    assert "worker tasks" in (reports[2] / "index.html").read_text(encoding="utf-8").split("<footer>")[1]


def test_the_slowest_tasks_start_first() -> None:
    """The order of the workers' tasks (exactlens.viz.parallel.plan): tracr-shuffle_dyck2's two halves, the two
    trained-vs-exact diffs, palindrome-hash, the Shin & Matzinger parts, then the rest; each task once."""
    from exactlens.viz import parallel
    from exactlens.viz.page import FULL, IN_PARENT, ReportContext, section_builders

    names = ["first", "majority", "palindrome-hash", "sm-solution2", "tracr-shuffle_dyck2"]
    ctx = ReportContext(out_dir=Path("unused"), names=names, quick=False, settings=FULL, jobs=2)
    chosen = section_builders()
    whole = [b for b in chosen if b.__name__ not in IN_PARENT and not hasattr(b, "per_construction")
             and not hasattr(b, "per_part")]
    labels = [parallel._label(item) for item in parallel.plan(ctx, chosen, whole)]
    assert labels[:6] == ["construction tracr-shuffle_dyck2 (construction_section)",
                          "construction tracr-shuffle_dyck2 (discovery_rows)", "pairs_diff_sections",
                          "majority_diff_sections", "construction palindrome-hash", "shin_matzinger_part checks"]
    seeds = [f"shin_matzinger_part {s}/{i}" for s in ("solution2", "combined") for i in range(3)]
    assert labels[6:12] == seeds
    assert len(set(labels)) == len(labels)
    assert {f"construction {n}" for n in ("first", "majority", "sm-solution2")} | {b.__name__ for b in whole} <= set(
        labels)


def test_a_construction_registered_here_runs_here(tmp_path: Path) -> None:
    """The workers know the plug-ins' constructions only: one registered in this process runs here."""
    import dataclasses

    from exactlens.constructions import get
    from exactlens.constructions.registry import REGISTRY, register

    register(dataclasses.replace(get("one"), name="one-registered-here"))
    try:
        index = build_report(["one-registered-here", "one"], tmp_path / "r", quick=True, jobs=2)
    finally:
        del REGISTRY["one-registered-here"]
    page = index.read_text(encoding="utf-8")
    assert 'id="construction-one-registered-here"' in page and 'class="error"' not in page
    made = json.loads((index.parent / "data" / "report.json").read_text(encoding="utf-8"))
    assert made["errors"] == []


def test_ctrl_c_stops_the_workers_and_leaves_nothing(tmp_path: Path) -> None:
    """SIGINT to the process group (Ctrl-C) while workers write into the staging directory: every process
    exits, no report and no staging directory remain."""
    import os
    import signal
    import subprocess
    import sys
    import time

    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2] / "src"), "EXACTLENS_QUIET": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "exactlens.cli", "report", "--quick", "--jobs", "2", *NAMES,
                             "--out", str(tmp_path / "r")], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # a shell's & ignores it
    start = time.monotonic()
    while not any(p.is_file() for p in tmp_path.rglob("attention/*")):  # a worker has written a page
        assert proc.poll() is None, proc.communicate()[1][-2000:]
        assert time.monotonic() - start < 300, "no worker wrote anything"
        time.sleep(0.1)
    os.killpg(proc.pid, signal.SIGINT)
    try:
        proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        pytest.fail("the report still ran 60 s after Ctrl-C")
    assert proc.returncode == 130, proc.returncode  # stopped by the Ctrl-C, not finished
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # the workers are gone too
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.2)
    else:
        pytest.fail("workers still running 30 s after the report stopped")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("jobs", [0, -1, 1.5, True, "2"])
def test_jobs_must_be_a_count(tmp_path: Path, jobs) -> None:
    with pytest.raises(ExactLensError, match="jobs is a number of processes"):
        build_report(["one"], tmp_path / "r", quick=True, jobs=jobs)

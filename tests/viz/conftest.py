"""One quick report per test run, shared by the report and browser tests.

Under pytest-xdist each worker is its own process: the first to get the lock builds the
report in the run's shared temporary folder, the others wait and reuse it. Every test of the report is
marked with one xdist group so that `--dist loadgroup` can give the group to one worker while the
other runs the rest. That grouping is only a speed-up, and it is not always honoured: with pytest 9.2
and pytest-xdist 3.8 the group is silently ignored (xdist renames ``item._nodeid``, which pytest 9.2
no longer reads), so the report's tests do run in two workers at once. Hence the rule: no test writes
into the shared report (a test that needs a modified page writes it to its own ``tmp_path``)."""

from __future__ import annotations

from pathlib import Path

import pytest
from filelock import FileLock
from samples import construction_sample

from exactlens.viz.page import build_report

QUICK_REPORT_GROUP = "quick-report"


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the xdist_group marks
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "quick_report" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.xdist_group(QUICK_REPORT_GROUP))


@pytest.fixture(scope="session")
def quick_report(tmp_path_factory: pytest.TempPathFactory, worker_id: str) -> Path:
    shared = tmp_path_factory.getbasetemp() if worker_id == "master" else tmp_path_factory.getbasetemp().parent
    out = shared / "quick-report"
    with FileLock(str(shared / "quick-report.lock")):
        if not (out / "index.html").exists():  # the builder holds the lock until it is done
            index = build_report(construction_sample(), out, quick=True)
            assert index == out / "index.html"
    return out

"""One quick report per test run, shared by the report and browser tests.

Under pytest-xdist each worker is its own process: the first to get the lock builds the
report in the run's shared temporary folder, the others wait and reuse it. So that no worker waits
idle for the build (minutes), every test of the report is put in one xdist group: `make test` runs
with ``--dist loadgroup``, which gives the whole group to one worker while the other runs the rest."""

from __future__ import annotations

from pathlib import Path

import pytest
from filelock import FileLock
from samples import construction_sample

from exactlens.viz.page import build_report

QUICK_REPORT_GROUP = "quick-report"


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

"""One quick report per test run, shared by the report and browser tests.

Under pytest-xdist each worker is its own process: the first to get the lock builds the
report in the run's shared temporary folder, the others wait and reuse it. Every test that uses it is
in one xdist group (tests/conftest.py groups the users of each shared fixture), so `--dist loadgroup`
gives them all to one worker while the other runs the rest. The lock stays for runs without that
grouping (``-n 2`` with another ``--dist``), and the rule with it: no test writes into the shared
report (a test that needs a modified page writes it to its own ``tmp_path``)."""

from __future__ import annotations

from pathlib import Path

import pytest
from filelock import FileLock
from samples import construction_sample

from exactlens.viz.page import build_report


@pytest.fixture(scope="session")
def quick_report(tmp_path_factory: pytest.TempPathFactory, worker_id: str) -> Path:
    shared = tmp_path_factory.getbasetemp() if worker_id == "master" else tmp_path_factory.getbasetemp().parent
    out = shared / "quick-report"
    with FileLock(str(shared / "quick-report.lock")):
        if not (out / "index.html").exists():  # the builder holds the lock until it is done
            index = build_report(construction_sample(), out, quick=True)
            assert index == out / "index.html"
    return out

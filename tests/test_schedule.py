"""The suite's schedule under pytest-xdist (tests/conftest.py): the users of a shared fixture run on one
worker, which builds the fixture once, and so do the tests of one compiled program (tracr-NAME). Run on a
small made-up suite with this conftest, in two workers."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

TOY = '''
import json, os
import pytest

@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    with open(os.environ["TOY_LOG"], "a") as log:
        log.write(json.dumps({"built": os.environ.get("PYTEST_XDIST_WORKER")}) + "\\n")
    return 1

def _ran(name):
    with open(os.environ["TOY_LOG"], "a") as log:
        log.write(json.dumps({"test": name, "worker": os.environ.get("PYTEST_XDIST_WORKER")}) + "\\n")

@pytest.mark.parametrize("k", range(4))
def test_uses_shared(shared, k):
    _ran(f"shared{k}")

@pytest.mark.parametrize("k", range(6))
def test_plain(k):
    _ran(f"plain{k}")

@pytest.mark.parametrize("name", ["tracr-toy:a", "tracr-toy:b", "tracr-toy:c"])
def test_compiled(name):
    _ran(f"compiled-{name}")
'''


def test_the_users_of_a_shared_fixture_run_on_one_worker(tmp_path: Path) -> None:
    pytest.importorskip("xdist")
    suite = tmp_path / "tests"
    suite.mkdir()
    shutil.copy(ROOT / "tests" / "conftest.py", suite / "conftest.py")
    (suite / "test_toy.py").write_text(TOY)
    log = tmp_path / "log.jsonl"
    env = dict(os.environ, TOY_LOG=str(log), OMP_NUM_THREADS="1")
    done = subprocess.run([sys.executable, "-m", "pytest", "-n", "2", "--dist", "loadgroup", "-p", "no:cacheprovider",
                           "-q", "-rA", "tests"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rows = [json.loads(line) for line in log.read_text().splitlines()]
    users = {row["worker"] for row in rows if row.get("test", "").startswith("shared")}
    assert len(users) == 1, rows
    assert [row["built"] for row in rows if "built" in row] == list(users), "built once, by the worker of its users"
    assert "test_uses_shared[0]@test_toy.shared" in done.stdout, "the group is in the test's id (xdist's loadgroup)"
    compilers = {row["worker"] for row in rows if row.get("test", "").startswith("compiled-")}
    assert len(compilers) == 1, "the tests of one compiled program (tracr-toy in their ids) run on one worker"
    assert "test_compiled[tracr-toy:a]@tracr-toy" in done.stdout

"""benchmarks/profile_unit.py (a stacked sweep unit's CPU by phase) runs and prints every phase; bad sizes are refused.
No timing is asserted."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "profile_unit.py"


def _run(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]))
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, env=env, timeout=600)


def test_profile_unit_prints_every_phase():
    done = _run("--quick")
    assert done.returncode == 0, done.stderr
    for phase in ("whole unit (run_unit)", "training (train_many", "drawing the words", "final tests (evaluate",
                  "of which the metric", "the rest", "worker start-up"):
        assert phase in done.stdout, phase
    assert "3 stacked seeds, 5 epochs" in done.stdout and "load average" in done.stdout


def test_profile_unit_refuses_sizes_below_one():
    done = _run("--seeds", "0")
    assert done.returncode != 0 and "--seeds, --epochs and --length are positive integers" in done.stderr

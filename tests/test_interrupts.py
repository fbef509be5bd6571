"""Ctrl-C and kills (docs/safety.md, "What survives Ctrl-C and a kill"): SIGINT or SIGTERM sent to the whole
process group of a running `exactlens sweep --workers 2` stops every worker within seconds, the table keeps
the finished rows, nothing hidden is left, and --resume completes it exactly; SIGTERM to `exactlens train`
leaves no hidden `.partial` sibling; --resume removes what a dead process left (`.ID.work-*`, `.partial-*`)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
STOPPED_WITHIN = 30.0  # seconds from the signal to the exit (the workers stop in about one; a shared machine)
SEEDS = 10
SPEC = (f"[sweep]\nseeds = {list(range(SEEDS))}\n\n[[job]]\nverb = \"verify\"\nname = \"first\"\n"
        "lengths = \"1:40\"\nstrings = 200\ndtype = \"float64\"\n")


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT / "src"), "EXACTLENS_QUIET": "1"}


def _start(args: list[str], cwd: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "exactlens.cli", *args], cwd=cwd, env=_env(), text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)


def _signal_when(proc: subprocess.Popen, ready, sig: int, timeout: float = 240) -> tuple[int, float, str]:
    """Send ``sig`` to the process group once ``ready()``; the exit status, the seconds to exit, stderr."""
    start = time.monotonic()
    while not ready():
        assert proc.poll() is None, proc.communicate()[1][-2000:]
        assert time.monotonic() - start < timeout, "never got ready"
        time.sleep(0.1)
    os.killpg(proc.pid, sig)
    sent = time.monotonic()
    try:
        _, err = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        pytest.fail(f"still running 120 s after signal {sig}")
    return proc.returncode, time.monotonic() - sent, err


def _finished(out: Path) -> list[Path]:
    jobs = out / "jobs"
    return [d for d in jobs.iterdir() if (d / "row.json").is_file()] if jobs.is_dir() else []


def _hidden(folder: Path) -> list[str]:
    return [p.name for p in folder.rglob(".*")] if folder.is_dir() else []


def _rows(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]


def _group_gone(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return True
    return False


@pytest.mark.slow
@pytest.mark.parametrize("engine, sig, status", [("local", signal.SIGINT, 130), ("local", signal.SIGTERM, 143),
                                                 ("ray", signal.SIGINT, 130)])
def test_a_signal_stops_every_worker_keeps_the_finished_rows_and_resume_completes(tmp_path, engine, sig, status):
    if engine == "ray":
        pytest.importorskip("ray")
    (tmp_path / "spec.toml").write_text(SPEC)
    out = tmp_path / "out"
    proc = _start(["sweep", "spec.toml", "--out", "out", "--workers" if engine == "local" else "--engine",
                   "2" if engine == "local" else "ray"], tmp_path)
    code, seconds, err = _signal_when(proc, lambda: len(_finished(out)) >= 2, sig)
    assert code == status, err[-2000:]
    assert seconds < STOPPED_WITHIN
    assert "Traceback" not in err and "Warning" not in err
    assert err.strip().splitlines()[-1].endswith("; outputs left as they were"), err[-2000:]
    time.sleep(3)  # nothing of the sweep goes on after it exited: no worker, no Ray process of the group
    assert _group_gone(proc.pid), "a worker or a Ray process outlived the sweep"
    kept = sorted(d.name for d in _finished(out))
    assert len(kept) < SEEDS, "the sweep ran on after the signal"
    assert sorted(r["job"] for r in _rows(out)) == kept and all(r["status"] == "ok" for r in _rows(out))
    assert _hidden(out) == [], "a stopped worker left its staging or scratch directory"
    again = subprocess.run([sys.executable, "-m", "exactlens.cli", "sweep", "spec.toml", "--out", "out", "--resume",
                            "--workers", "2", "--json"], cwd=tmp_path, env=_env(), capture_output=True, text=True,
                           timeout=600)
    assert again.returncode == 0, again.stderr[-2000:]
    summary = json.loads(again.stdout)
    assert summary["kept"] == len(kept) and summary["ran"] == SEEDS - len(kept) and summary["ok"] == SEEDS
    assert len(_rows(out)) == SEEDS and _hidden(out) == []


def test_sigterm_during_training_leaves_no_hidden_partial(tmp_path):
    proc = _start(["train", "first", "--out", "run", "--epochs", "100000", "--strings-per-epoch", "20",
                   "--test-strings", "10", "--train-length", "8", "--test-length", "8"], tmp_path)
    code, seconds, err = _signal_when(proc, lambda: any(p.name.startswith(".run.partial-") for p in
                                                        tmp_path.iterdir()), signal.SIGTERM)
    assert code == 143 and "terminated; outputs left as they were" in err, err[-2000:]
    assert seconds < STOPPED_WITHIN
    assert sorted(p.name for p in tmp_path.iterdir()) == [], "a kill left the run's hidden sibling"


def test_resume_removes_what_a_dead_process_left(tmp_path):
    """A killed sweep's scratch (`.ID.work-PID-hHOST-...`, in the sweep's directory) and staging siblings (in
    jobs/, and the tables' in the sweep's directory) are removed by the next run; a live process's are kept."""
    from exactlens.sweep import _clean_partials
    from exactlens.sweep.runner import host_tag

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True).stdout.strip()
    out = tmp_path / "out"
    (out / "jobs").mkdir(parents=True)
    left = [out / f".verify-x-s0-0123456789.work-{dead}-h{host_tag()}-abc", out / f".results.jsonl.partial-{dead}-ab12",
            out / "jobs" / f".verify-x-s0-0123456789.partial-{dead}-cd34"]
    running = subprocess.Popen(["sleep", "60"])
    live = out / f".verify-y-s0-0123456789.work-{running.pid}-h{host_tag()}-abc"
    other_host = out / f".verify-z-s0-0123456789.work-{dead}-hsomewhereelse-abc"
    try:
        for path in [*left, live, other_host]:
            path.mkdir() if "work" in path.name or path.parent.name == "jobs" else path.write_text("x")
        _clean_partials(out, shared=False)
        assert not any(p.exists() for p in left)
        assert live.exists() and other_host.exists()
    finally:
        running.kill()
        running.wait()
    shutil.rmtree(out)

"""Sizes estimated from the request alone and refused before anything is built (docs/safety.md, "Impossible
sizes refused up front"): each case runs in a child process under a 2 GiB address-space limit
(``RLIMIT_AS``), so a request that allocated before its check would die of MemoryError instead of being
refused, and the time from the call to the refusal is measured (imports excluded, generous bounds)."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import pytest

from exactlens.errors import ExactLensError
from exactlens.sweep import parse_sweep
from exactlens.train.checkpoints import checkpoint_count

ROOT = Path(__file__).resolve().parents[1]
ADDRESS_SPACE = 2 * 2**30
REFUSED_WITHIN = 10.0  # seconds from the call to the refusal (the refusals take milliseconds; the machine is shared)


def _limited() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE, ADDRESS_SPACE))


def _child(code: str, cwd: Path, timeout: float = 240) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "EXACTLENS_QUIET": "1"}
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout, preexec_fn=_limited)


CALLS = """
import json, sys, time
import exactlens as el
from exactlens.errors import ExactLensError
from exactlens.train import train_many
CASES = {
    "epochs": lambda: el.train("first", epochs=10**12),
    "strings_per_epoch": lambda: el.train("first", strings_per_epoch=10**12),
    "train_length": lambda: el.train("first", train_length=10**9),
    "test_strings": lambda: el.train("first", test_strings=10**12),
    "log": lambda: el.train("first", checkpoints="log:100000000000"),
    "every": lambda: el.train("first", epochs=10**9, checkpoints="every:1"),
    "checkpoint_every": lambda: el.train("first", epochs=10**9, checkpoint_every=3),
    "seeds": lambda: el.train("first", seeds=range(10**8)),
    "train_many": lambda: train_many("first", range(10**8)),
    "long_lengths": lambda: el.timeline(["a", "b"], "first", long_lengths=[10**8]),
}
for name, call in CASES.items():
    start = time.perf_counter()
    try:
        call()
        said = None
    except ExactLensError as err:
        said = str(err)
    print(json.dumps({"case": name, "seconds": time.perf_counter() - start, "said": said}))
"""

NEEDLES = {"epochs": "work limit", "strings_per_epoch": "memory limit", "train_length": "memory limit",
           "test_strings": "memory limit", "log": "at most 10000", "every": "at most 10,000",
           "checkpoint_every": "at most 10,000", "seeds": "memory limit", "train_many": "memory limit",
           "long_lengths": "memory limit"}


@pytest.mark.slow
def test_the_apis_huge_requests_are_refused_at_once_without_allocating(tmp_path):
    proc = _child(CALLS, tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    results = {r["case"]: r for r in map(json.loads, proc.stdout.splitlines())}
    assert set(results) == set(NEEDLES)
    for name, needle in NEEDLES.items():
        said, seconds = results[name]["said"], results[name]["seconds"]
        assert said is not None and needle in said and "\n" not in said, (name, said)
        assert seconds < REFUSED_WITHIN, (name, seconds)


RUN_WITH_A_LONG_TEST = """
import json, exactlens as el
run = el.train("first", out="run", epochs=1, strings_per_epoch=8, test_strings=8, train_length=4, test_length=4,
               checkpoints="log:3")
info = json.load(open("run/run.json"))
info["options"]["test_length"] = [10**8, 10**8]
open("run/run.json", "w").write(json.dumps(info))
result = el.timeline("run", "first", lengths=[2, 3], strings=4, parts=["behaviour"])
row = result["checkpoints"][-1]
print(json.dumps({"long": result["settings"]["long_lengths"], "accuracy": row["long_accuracy"],
                  "reason": row["reasons"].get("long_accuracy")}))
"""


@pytest.mark.slow
def test_a_run_whose_recorded_test_length_is_huge_gets_a_reason_not_an_allocation(tmp_path):
    proc = _child(RUN_WITH_A_LONG_TEST, tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    said = json.loads(proc.stdout.splitlines()[-1])
    assert said["long"] == [10**8] and said["accuracy"] is None
    assert "long length 100,000,000" in said["reason"] and "memory limit" in said["reason"]


def _cli(args: list[str], cwd: Path) -> tuple[subprocess.CompletedProcess, float]:
    start = time.perf_counter()
    proc = _child(f"import sys; from exactlens.cli import main; sys.argv = ['exactlens', *{args!r}]; "
                  "sys.exit(main())", cwd)
    return proc, time.perf_counter() - start


GRID = ", ".join(f"k{i} = [{', '.join(str(v) for v in range(100))}]" for i in range(4))
SPECS = {
    "grid.toml": f'[[job]]\nverb = "verify"\nname = "first"\ngrid = {{ {GRID} }}\n',
    "every.toml": ('[[job]]\nverb = "train"\nname = "first"\n'
                   'options = { checkpoints = "every:1", epochs = 100000000 }\n'),
    "log.toml": '[[job]]\nverb = "train"\nname = "first"\noptions = { checkpoints = "log:100000000" }\n',
    "epochs.toml": '[[job]]\nverb = "train"\nname = "first"\noptions = { epochs = 1000000000 }\n',
}


@pytest.mark.slow
@pytest.mark.parametrize("args, needle", [
    (["train", "first", "--out", "o", "--seeds", "0:100000000"], "100000001 runs"),
    (["train", "first", "--out", "o", "--checkpoints", "log:100000000"], "at most 10000"),
    (["train", "first", "--out", "o", "--epochs", "1000000000000"], "work limit"),
    (["timeline", "run", "--against", "first", "--long-lengths", "100000000"], "long length 100,000,000"),
    (["sweep", "grid.toml", "--dry-run"], "100,000,000 jobs"),
    (["sweep", "every.toml", "--dry-run"], "at most 10,000"),
    (["sweep", "log.toml", "--dry-run"], "at most 10000"),
    (["sweep", "epochs.toml", "--dry-run"], "work limit"),
])
def test_the_command_lines_huge_requests_are_refused_in_one_line(tmp_path, args, needle):
    for name, text in SPECS.items():
        (tmp_path / name).write_text(text)
    proc, seconds = _cli(args, tmp_path)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    last = [line for line in proc.stderr.splitlines() if line.startswith("exactlens:")][-1]
    assert needle in last, last
    assert seconds < 60, seconds  # the imports included, on a shared machine
    assert not (tmp_path / "o").exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_checkpoint_counts_are_arithmetic():
    start = time.perf_counter()
    with pytest.raises(ExactLensError, match="at most 10,000"):
        checkpoint_count(None, "every:1", 10**15)
    with pytest.raises(ExactLensError, match="at most 10,000"):
        checkpoint_count(7, None, 10**15)
    assert checkpoint_count(None, "log:50", 10**15) == 50
    assert checkpoint_count(None, "every:10", 100) == 12
    assert time.perf_counter() - start < REFUSED_WITHIN


def test_a_huge_grid_is_counted_before_it_is_expanded():
    start = time.perf_counter()
    with pytest.raises(ExactLensError, match=r"100,000,000 jobs"):
        parse_sweep(SPECS["grid.toml"], "grid.toml")
    then = ('[[job]]\nverb = "train"\nname = "first"\ngrid = { lr = [' + ", ".join(["0.1"] * 400) + '] }\n'
            'then = [{ verb = "diff", against = "first", grid = { strings = [' + ", ".join(map(str, range(2, 402)))
            + '] } }]\n')
    with pytest.raises(ExactLensError, match=r"160,400 jobs"):
        parse_sweep(then, "then.toml")
    assert time.perf_counter() - start < REFUSED_WITHIN


def test_many_seeds_are_checked_for_duplicates_in_linear_time():
    seeds = ", ".join(str(s) for s in range(60_000))
    start = time.perf_counter()
    sweep = parse_sweep(f'[sweep]\nseeds = [{seeds}]\n[[job]]\nverb = "verify"\nname = "first"\nlengths = "1:2"\n')
    assert len(sweep.jobs) == 60_000
    assert time.perf_counter() - start < 30  # a quadratic check takes minutes here


def test_a_train_jobs_stack_is_estimated_as_it_will_train(monkeypatch):
    """The spec check asks training's estimate for the seeds that train together: 400 seeds in one stack need
    400 runs' memory (refused under a 200 MiB limit), `stack = 1` one run's."""
    monkeypatch.setenv("EXACTLENS_MEMORY_LIMIT", "200M")
    seeds = ", ".join(str(s) for s in range(400))
    text = (f'[sweep]\nseeds = [{seeds}]\n\n[[job]]\nverb = "train"\nname = "first"\n'
            'options = { epochs = 1, strings_per_epoch = 8, test_strings = 8, train_length = 4, test_length = 4 }\n')
    with pytest.raises(ExactLensError, match=r"line 7: training first \(400 runs.*memory limit"):
        parse_sweep(text, "s.toml")
    assert len(parse_sweep(text.replace("[sweep]\n", "[sweep]\nstack = 1\n"), "s.toml").jobs) == 400


def test_a_timeline_jobs_long_lengths_are_estimated_by_the_spec_check():
    text = ('[[job]]\nverb = "train"\nname = "first"\n'
            'options = { epochs = 1, strings_per_epoch = 8, test_strings = 8, train_length = 4, test_length = 4, '
            'checkpoints = "log:3" }\n'
            'then = [{ verb = "timeline", against = "first", long_lengths = [100000000] }]\n')
    start = time.perf_counter()
    with pytest.raises(ExactLensError, match=r"line 5: .*long length 100,000,000"):
        parse_sweep(text, "t.toml")
    assert time.perf_counter() - start < REFUSED_WITHIN

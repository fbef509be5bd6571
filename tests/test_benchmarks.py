"""``make bench``'s runner (benchmarks/run_all.py) and the results every benchmark records
(benchmarks/goals.py). No timing is asserted here: the runner is run with --quick on two fast
scripts, and the table and the JSON it writes are checked for their rows and verdicts."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = ROOT / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

import goals  # noqa: E402  (benchmarks/goals.py)

from exactlens.errors import ExactLensError  # noqa: E402


def test_a_goal_is_a_comparison_and_its_verdict_follows_it():
    record = goals.Goals("bench_x.py")
    assert record.add("ratio", 1.25, "x", ">= 1.0").met is True
    assert record.add("ratio", 0.8, "x", ">= 1.0").met is False
    assert record.add("time", 60.0, "s", "< 60").met is False, "strictly below"
    assert record.add("time", 59.9, "s", "< 60").met is True
    assert record.add("overhead", 1.2, "x", "<= 1.2").met is True
    assert record.add("no goal", 3.0, "x").met is None
    nan = record.add("broken", math.nan, "x", ">= 1")
    assert nan.measured is None and nan.met is None, "a non-finite measurement is no verdict"
    for bad in ("1.0", ">= fast", "=> 1", ""):
        with pytest.raises(ExactLensError, match="comparison and a number"):
            record.add("bad", 1.0, "x", bad)


def test_results_are_strict_json_and_not_silently_replaced(tmp_path):
    record = goals.Goals("bench_x.py", quick=True)
    record.add("ratio", 2.0, "x", ">= 1")
    record.add("broken", math.inf, "s", "< 5")
    path = tmp_path / "r.json"
    record.write(path)
    data = goals.read(path)
    assert data["script"] == "bench_x.py" and data["quick"] is True
    assert data["results"][1] == {"name": "broken", "measured": None, "unit": "s", "goal": "< 5", "met": None}
    with pytest.raises(ExactLensError, match="already exists"):
        record.write(path)
    record.write(path, overwrite=True)
    record.write(None)  # no --results: nothing written


def test_every_benchmark_takes_quick_and_results():
    """run_all passes --quick and --results to every bench_*.py; each must accept both."""
    for script in sorted(BENCHMARKS.glob("bench_*.py")):
        text = script.read_text(encoding="utf-8")
        assert "add_arguments(parser)" in text, f"{script.name}: no --results (goals.add_arguments)"
        assert '"--quick"' in text, f"{script.name}: no --quick"
        assert ".write(args.results" in text, f"{script.name}: never writes its results"


def test_runner_prints_one_table_of_every_number_beside_its_goal(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"), OMP_NUM_THREADS="1", EXACTLENS_QUIET="1",
               PYTHONDONTWRITEBYTECODE="1")
    out = tmp_path / "all.json"
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / "run_all.py"), "--quick", "--only", "bench_hull,bench_fig2",
         "--results", str(out)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    stdout = done.stdout
    assert "== benchmarks/bench_hull.py" in stdout and "== benchmarks/bench_fig2.py" in stdout
    assert "speed-up fast vs naive" in stdout, "each script's own output is kept"
    table = stdout[stdout.index("== every measured number against its goal"):]
    rows = [line for line in table.splitlines() if line.startswith("| bench_")]
    assert any(r.startswith("| bench_hull.py | unselectable keys") for r in rows), table
    assert any(r.startswith("| bench_fig2.py | Fig. 2 data") and "| < 120 |" in r for r in rows), table
    assert "indicative only" in table
    data = json.loads(out.read_text())
    assert data["quick"] is True and len(data["results"]) == len(rows)
    for item in data["results"]:
        assert item["script"] in ("bench_hull.py", "bench_fig2.py")
        assert isinstance(item["measured"], float) and item["goal"] and item["met"] in (True, False)
        cell = "yes" if item["met"] else "**NO**"
        assert any(item["name"] in r and r.endswith(f"| {cell} |") for r in rows), item


def test_runner_reports_a_failing_script(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"), PYTHONDONTWRITEBYTECODE="1")
    done = subprocess.run([sys.executable, str(BENCHMARKS / "run_all.py"), "--only", "bench_nope"], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and "no benchmark bench_nope" in done.stderr


def test_a_failing_script_is_a_row_and_exit_status_1(tmp_path, monkeypatch, capsys):
    import run_all

    (tmp_path / "bench_fails.py").write_text("import sys\nprint('partial output')\nsys.exit(3)\n")
    (tmp_path / "bench_silent.py").write_text("print('no --results written')\n")
    monkeypatch.setattr(run_all, "HERE", tmp_path)
    assert run_all.main([]) == 1
    out = capsys.readouterr().out
    assert "| bench_fails.py | exit status 3 after" in out and "| bench_silent.py | wrote no results after" in out


def test_the_readme_bench_table_is_what_the_generator_makes_of_it():
    """README.md's generated block (benchmarks/readme_table.py) has the generator's exact format: reading it back
    and rendering it again gives the same text, header (command, date, load average) and every row."""
    import readme_table

    block = readme_table.block_of((ROOT / "README.md").read_text(encoding="utf-8"))
    data = readme_table.parse(block)
    assert data["results"], "the README's bench table shows no numbers"
    assert readme_table.render(data) == block


def test_readme_table_round_trip_and_rewrite():
    import readme_table

    data = {"quick": True, "command": "benchmarks/run_all.py --quick", "made": "2026-11-28 10:00 UTC",
            "load_average": [1.25, 3.5], "results": [
                {"script": "bench_a.py", "name": "x vs y, |w| = 10 (a | b)", "measured": 2.13, "unit": "x",
                 "goal": ">= 2", "met": True},
                {"script": "bench_a.py", "name": "seconds", "measured": 12.6, "unit": "s", "goal": "< 10",
                 "met": False},
                {"script": "bench_a.py", "name": "nothing measured", "measured": None, "unit": "x", "goal": None,
                 "met": None},
                {"script": "bench_b.py", "error": "exit status 3 after 2 s"}]}
    block = readme_table.render(data)
    assert "load average 1.25 at the start and 3.50 at the end" in block and "2.13x" in block
    back = readme_table.parse(block)
    shown = [dict(r, unit="") if r.get("measured", 0) is None else r for r in data["results"]]  # n/a: no unit shown
    assert back["results"] == shown and back["quick"] and back["command"] == data["command"]
    readme = f"# T\n\ntext before\n\n{readme_table.START}\nold\n{readme_table.END}\n\ntext after\n"
    new = readme_table.rewrite(readme, data)
    assert new.startswith("# T\n\ntext before\n\n") and new.endswith("\n\ntext after\n") and block in new
    with pytest.raises(ExactLensError, match="markers"):
        readme_table.rewrite("# no markers\n", data)
    with pytest.raises(ExactLensError, match="'made'"):
        readme_table.render({k: v for k, v in data.items() if k != "made"})

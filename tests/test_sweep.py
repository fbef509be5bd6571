"""exactlens sweep: the spec's checks (one line naming the spec's line), the local engine, Ray, shards,
a killed worker and --resume, failures recorded without stopping the others."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

import exactlens as el
from exactlens.errors import ExactLensError
from exactlens.sweep import parse_sweep

TINY = ('epochs = 1, strings_per_epoch = 8, test_strings = 8, train_length = 4, test_length = 4, d_model = 8, '
        'd_mlp = 8, dtype = "float64"')
SPEC = f"""
[sweep]
seeds = [0, 1]

[[job]]
verb = "train"
name = "first"
options = {{ {TINY} }}
then = [{{ verb = "diff", against = "first", options = {{ lengths = "1:4", strings = 8, parts = "behaviour" }} }}]

[[job]]
verb = "verify"
name = "first"
lengths = "1:4"
dtype = "float64"
grid = {{ strings = [5, 10] }}
"""


def _spec(tmp_path: Path, text: str = SPEC) -> Path:
    path = tmp_path / "sweep.toml"
    path.write_text(text)
    return path


def _rows(out: Path, name: str = "results") -> list[dict]:
    return [json.loads(line) for line in (out / f"{name}.jsonl").read_text().splitlines()]


def _answers(rows: list[dict]) -> dict[str, tuple]:
    """What must not depend on the engine: each job's status and figures (timings left out)."""
    return {r["job"]: (r["status"], r["seed"], {k: v for k, v in r["headline"].items() if k != "seconds"})
            for r in rows}


@pytest.fixture(scope="session")  # session: the ray test runs first (tests/conftest.py), the others later
def local_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("sweep")
    out = tmp / "local"
    result = el.sweep(str(_spec(tmp)), out=str(out), workers=1)
    return tmp, out, result


# ---- the spec ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("text, line, words", [
    ('[[job]]\nverb = "trian"\nname = "first"\n', 2, "unknown verb 'trian'"),
    ('[sweep]\nseeds = [0]\n\n[[job]]\nverb = "verify"\nname = "first"\n\n[[job]]\nverb = "train"\nname = "first"\n'
     'options = { epoch = 2 }\n', 11, "epoch"),
    ('[[job]]\nverb = "verify"\nname = "first"\nstrngs = 10\n', 4, "strngs"),
    ('[[job]]\nverb = "verify"\nname = "first"\ngrid = { strings = [] }\n', 4, "empty grid"),
    ('[[job]]\nverb = "train"\nname = "first"\nthen = [{ verb = "diff", agaist = "first" }]\n', 4, "agaist"),
    ('[sweep]\nseeds = []\n[[job]]\nverb = "verify"\nname = "first"\n', 2, "seeds"),
])
def test_a_bad_spec_is_one_line_naming_its_line(text, line, words):
    with pytest.raises(ExactLensError) as err:
        parse_sweep(text, "s.toml")
    message = str(err.value)
    assert "\n" not in message and f"s.toml line {line}:" in message and words in message, message


def test_spec_syntax_and_emptiness_errors():
    with pytest.raises(ExactLensError, match=r"not valid TOML.*line 2"):
        parse_sweep('[[job]]\nverb = "verify\n', "s.toml")
    with pytest.raises(ExactLensError, match="no jobs"):
        parse_sweep('[sweep]\nseeds = [0]\n', "s.toml")


def test_jobs_expand_over_grid_seeds_and_then():
    sweep = parse_sweep(SPEC, check=False)
    verbs = [j.verb for j in sweep.jobs]
    assert verbs.count("train") == 2 and verbs.count("diff") == 2 and verbs.count("verify") == 4
    diffs = [j for j in sweep.jobs if j.verb == "diff"]
    trains = {j.id: j for j in sweep.jobs if j.verb == "train"}
    assert all(trains[d.parent].sweep_seed == d.sweep_seed for d in diffs)
    # ids come from the job alone: the same spec gives the same ids
    assert [j.id for j in parse_sweep(SPEC, check=False).jobs] == [j.id for j in sweep.jobs]


def test_dry_run_lists_jobs_and_estimates(tmp_path):
    plan = el.sweep(str(_spec(tmp_path)), dry_run=True)
    assert len(plan["jobs"]) == 8
    assert plan["estimate"]["train_word_steps"] == 2 * 1 * 8  # two seeds x 1 epoch x 8 words
    assert plan["estimate"]["disk_bytes"] > 0
    assert not (tmp_path / "out").exists()


# ---- running ------------------------------------------------------------------------------------------------


def test_local_sweep_writes_a_row_per_job_and_seed(local_run):
    _, out, result = local_run
    rows = _rows(out)
    assert result["ok"] == 8 and result["failed"] == 0 and len(rows) == 8
    for row in rows:
        directory = out / row["dir"]
        assert (directory / "row.json").is_file() and (directory / "result.json").is_file()
    trains = [r for r in rows if r["verb"] == "train"]
    assert all(r["stacked"] == 2 for r in trains)  # the two seeds trained as one computation
    assert all((out / r["dir"] / "output" / "weights.pt").is_file() for r in trains)
    assert all("test_accuracy" in r["headline"] for r in trains)
    assert {r["options"]["strings"] for r in rows if r["verb"] == "verify"} == {5, 10}
    assert (out / "results.csv").read_text().splitlines()[0].startswith("job,verb,seed,status")
    assert "<img" in (out / "summary.html").read_text()


def test_an_existing_sweep_needs_resume(local_run):
    tmp, out, _ = local_run
    with pytest.raises(ExactLensError, match="--resume"):
        el.sweep(str(tmp / "sweep.toml"), out=str(out))
    again = el.sweep(str(tmp / "sweep.toml"), out=str(out), resume=True)
    assert again["ran"] == 0 and again["kept"] == 8


def test_shards_make_the_whole(local_run):
    tmp, whole, _ = local_run
    out = tmp / "sharded"
    first = el.sweep(str(tmp / "sweep.toml"), out=str(out), shard="0/2", workers=1)
    assert 0 < first["ran"] < 8 and first["missing"] == 8 - first["ran"]
    second = el.sweep(str(tmp / "sweep.toml"), out=str(out), shard="1/2", workers=1)
    assert first["ran"] + second["ran"] == 8
    halves = _rows(out, "results.shard0of2") + _rows(out, "results.shard1of2")
    assert _answers(halves) == _answers(_rows(whole)) == _answers(_rows(out))
    with pytest.raises(ExactLensError, match="i/n"):
        el.sweep(str(tmp / "sweep.toml"), out=str(out), shard="2/2")


def test_a_failed_job_is_recorded_and_resume_reruns_it(tmp_path, monkeypatch):
    import dataclasses

    from exactlens.verb_registry import VERBS, find_verb

    real = find_verb("verify")

    def flaky(request):
        if request.seed == 1:
            raise RuntimeError("boom\nsecond line")
        return real.run(request)

    spec = _spec(tmp_path, '[sweep]\nseeds = [0, 1]\n[[job]]\nverb = "verify"\nname = "first"\nlengths = "1:3"\n')
    monkeypatch.setitem(VERBS, "verify", dataclasses.replace(real, run=flaky))  # the sweep finds verbs here
    result = el.sweep(str(spec), out=str(tmp_path / "out"), workers=1)
    rows = {r["seed"]: r for r in _rows(tmp_path / "out")}
    assert rows[0]["status"] == "ok" and rows[1]["status"] == "failed"
    assert rows[1]["error"] == "RuntimeError: boom"
    assert result.failure is not None and "1 of 2 jobs failed" in result.failure
    monkeypatch.setitem(VERBS, "verify", real)
    again = el.sweep(str(spec), out=str(tmp_path / "out"), resume=True, workers=1)
    assert again["kept"] == 1 and again["ran"] == 1 and again["ok"] == 2


def test_a_killed_worker_leaves_no_partial_job_and_resume_completes(tmp_path, monkeypatch):
    spec = _spec(tmp_path, '[sweep]\nseeds = [0, 1]\n[[job]]\nverb = "verify"\nname = "first"\nlengths = "1:3"\n'
                           'strings = 5\n')
    victim = next(j.id for j in parse_sweep(spec.read_text()).jobs if j.sweep_seed == 1)
    out = tmp_path / "out"
    monkeypatch.setenv("EXACTLENS_SWEEP_CRASH", victim)  # the worker dies while writing this job's directory
    el.sweep(str(spec), out=str(out), workers=2)
    jobs = out / "jobs"
    for directory in jobs.iterdir():  # every job directory is complete (a dead worker's job: recorded lost)
        assert directory.name.startswith(".") or (directory / "row.json").is_file()
    lost = json.loads((jobs / victim / "row.json").read_text())
    assert lost["status"] == "failed" and "worker lost" in lost["error"]
    assert not (jobs / victim / "result.json").exists()
    monkeypatch.delenv("EXACTLENS_SWEEP_CRASH")
    again = el.sweep(str(spec), out=str(out), resume=True, workers=1)
    assert again["ok"] == 2 and again["ran"] >= 1
    assert not [p for p in jobs.iterdir() if p.name.startswith(".")]  # the dead worker's staging is gone


def test_ray_without_ray_says_how_to_install(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)
    with pytest.raises(ExactLensError, match=r"pip install 'exactlens\[ray\]'"):
        el.sweep(str(_spec(tmp_path)), out=str(tmp_path / "out"), engine="ray")


def _ray():
    try:
        import ray
    except ModuleNotFoundError:
        if os.environ.get("EXACTLENS_REQUIRE_RAY") == "1":  # CI (.ci/run) installs exactlens[ray]
            pytest.fail("ray is not installed (EXACTLENS_REQUIRE_RAY=1): pip install -e '.[ray]'")
        pytest.skip("ray is not installed (pip install -e '.[ray]')")
    return ray


def test_ray_gives_the_same_table_as_local(local_run):
    ray = _ray()
    tmp, local, _ = local_run
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        result = el.sweep(str(tmp / "sweep.toml"), out=str(tmp / "ray"), engine="ray")
    finally:
        ray.shutdown()
    assert result["ok"] == 8
    assert _answers(_rows(tmp / "ray")) == _answers(_rows(local))
    rows = _rows(tmp / "ray")
    assert all((tmp / "ray" / r["dir"] / "output" / "weights.pt").is_file() for r in rows if r["verb"] == "train")


def test_cli_dry_run_json_and_a_bad_spec_exits_2(tmp_path, capsys):
    from exactlens.cli import main

    spec = _spec(tmp_path)
    assert main(["sweep", str(spec), "--dry-run", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["dry_run"] and len(plan["jobs"]) == 8 and plan["estimate"]["per_verb"]["verify"] == 4
    bad = _spec(tmp_path, '[[job]]\nverb = "verify"\nname = "first"\ngrid = { strings = [] }\n')
    assert main(["sweep", str(bad), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert any("line 4: empty grid" in line for line in err), err
    assert not (tmp_path / "out").exists()


def test_stack_splits_the_seeds_of_a_train_job_into_units():
    from exactlens.sweep.engines import plan_units

    text = SPEC.replace("seeds = [0, 1]", "seeds = [0, 1, 2]")
    whole = parse_sweep(text, check=False)
    assert [len([j for j in u if j.verb == "train"]) for u in plan_units(whole, set())][:1] == [3]
    split = parse_sweep(text.replace("[sweep]\n", "[sweep]\nstack = 2\n"), check=False)
    trains = [[j.sweep_seed for j in u if j.verb == "train"] for u in plan_units(split, set())]
    assert trains[:2] == [[0, 1], [2]]
    assert [j.id for j in split.jobs] == [j.id for j in whole.jobs]  # how seeds stack is no part of a job's id
    with pytest.raises(ExactLensError, match="line 3: stack must be"):
        parse_sweep(text.replace("[sweep]\n", "[sweep]\nstack = -1\n"), "s.toml", check=False)


def test_a_timeline_follows_a_training_job_with_checkpoints(tmp_path):
    """train with checkpoints, then a timeline of its checkpoints against the exact circuit: one row each, the
    timeline's headline from its view, its checkpoints those the training kept."""
    spec = _spec(tmp_path, f"""
[[job]]
verb = "train"
name = "first"
options = {{ {TINY.replace("epochs = 1", "epochs = 2")}, checkpoint_every = 1 }}
then = [{{ verb = "timeline", against = "first", options = {{ lengths = "1:4", strings = 8, parts = "behaviour" }} }}]
""")
    out = tmp_path / "out"
    result = el.sweep(str(spec), out=str(out), workers=1)
    rows = {r["verb"]: r for r in _rows(out)}
    assert result["failed"] == 0 and set(rows) == {"train", "timeline"}, result
    timeline = json.loads((out / rows["timeline"]["dir"] / "result.json").read_text())
    assert [c["step"] for c in timeline["checkpoints"]] == [0, 1, 2]
    assert rows["timeline"]["headline"], rows["timeline"]


# ---- the third reliability pass (docs/safety.md) -------------------------------------------------------------


def test_a_directory_that_holds_no_sweep_is_refused_and_left_alone(tmp_path):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "results.jsonl").write_text("my own results\n")
    (mine / "summary.html").write_text("<p>mine</p>")
    with pytest.raises(ExactLensError, match="holds no sweep"):
        el.sweep(str(_spec(tmp_path)), out=str(mine), workers=1)
    with pytest.raises(ExactLensError, match="holds no sweep"):
        el.sweep(str(_spec(tmp_path)), out=str(mine), workers=1, resume=True)
    assert sorted(p.name for p in mine.iterdir()) == ["results.jsonl", "summary.html"]
    assert (mine / "results.jsonl").read_text() == "my own results\n"


@pytest.mark.parametrize("shard", ["2/2", "0/0", "a/b", "1/-2"])
def test_dry_run_refuses_a_bad_shard(tmp_path, shard):
    with pytest.raises(ExactLensError, match="--shard"):
        el.sweep(str(_spec(tmp_path)), dry_run=True, shard=shard)


def test_dry_run_lists_only_the_slice(tmp_path):
    spec = str(_spec(tmp_path))
    whole = [j["id"] for j in el.sweep(spec, dry_run=True)["jobs"]]
    slices = [[j["id"] for j in el.sweep(spec, dry_run=True, shard=f"{i}/2")["jobs"]] for i in range(2)]
    assert slices[0] and slices[1] and not set(slices[0]) & set(slices[1])
    assert sorted(slices[0] + slices[1]) == sorted(whole)
    from exactlens.sweep import planned
    from exactlens.sweep.engines import parse_shard, plan_units

    sweep = parse_sweep(Path(spec).read_text(), check=False)
    assert {j.id for u in plan_units(sweep, set(), parse_shard("1/2")) for j in u} == set(slices[1])
    assert [j.id for j in planned(sweep, "1/2").jobs] == slices[1]


def test_a_failed_jobs_error_names_its_directory_not_the_hidden_scratch(tmp_path):
    from exactlens.sweep.runner import _public

    job = parse_sweep(SPEC, check=False).jobs[0]
    scratch = tmp_path / f".{job.id}.work-1-hhost-x"
    said = _public(f"cannot write {scratch / 'runs' / f'seed{job.sweep_seed}'}/weights.pt; and {scratch}", scratch,
                   tmp_path, job)
    assert ".work-" not in said and f"jobs/{job.id}/output/weights.pt" in said


def test_ray_refuses_a_request_no_node_can_hold(tmp_path):
    ray = _ray()
    spec = _spec(tmp_path, '[sweep]\ncpus = 64\n[[job]]\nverb = "verify"\nname = "first"\nlengths = "1:2"\n')
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        with pytest.raises(ExactLensError, match=r"cpus = 64, but the largest node of the Ray cluster has 2 CPUs"):
            el.sweep(str(spec), out=str(tmp_path / "out"), engine="ray")
    finally:
        ray.shutdown()
    assert not list((tmp_path / "out" / "jobs").iterdir())


def test_workers_see_the_environment_of_their_sweep_not_of_an_earlier_one(tmp_path, monkeypatch):
    """The forkserver starts with the first pool and forks every later worker from itself: a variable set after
    it started reached no worker, so the killed-worker test above passed alone and failed after another sweep
    in the same process (its crash variable never reached the worker). Each pool now hands its workers the
    caller's environment."""
    first = _spec(tmp_path, '[sweep]\nseeds = [0, 1]\n[[job]]\nverb = "verify"\nname = "first"\nlengths = "1:2"\n'
                            'strings = 4\n')
    el.sweep(str(first), out=str(tmp_path / "before"), workers=2)  # starts the forkserver
    spec = _spec(tmp_path, '[sweep]\nseeds = [0, 1]\n[[job]]\nverb = "verify"\nname = "first"\nlengths = "1:3"\n'
                           'strings = 5\n')
    victim = next(j.id for j in parse_sweep(spec.read_text()).jobs if j.sweep_seed == 1)
    monkeypatch.setenv("EXACTLENS_SWEEP_CRASH", victim)
    out = tmp_path / "out"
    el.sweep(str(spec), out=str(out), workers=2)
    lost = json.loads((out / "jobs" / victim / "row.json").read_text())
    assert lost["status"] == "failed" and "worker lost" in lost["error"], lost

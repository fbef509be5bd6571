"""Damaged files that exactlens reads back (a checkpoint index, a run's run.json, a sweep's row.json, a sweep
spec, a MIB score file): each damage is one ExactLensError line, or for a sweep row a job that --resume runs
again; never a traceback. A hypothesis fuzz test mutates each of them (docs/safety.md, "No tracebacks")."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from exactlens.analysis.circuit.mib import load_mib
from exactlens.analysis.timeline.sources import sources_of
from exactlens.cli import _one_line
from exactlens.errors import ExactLensError
from exactlens.sweep import load_sweep, parse_sweep
from exactlens.sweep.runner import read_row
from exactlens.sweep.table import collect_rows, write_summary, write_table
from exactlens.train.checkpoints import read_checkpoints

INDEX_LINE = {"step": 0, "epoch": 0, "strings_seen": 0, "train_loss_bits": None, "test_loss_bits": 1.0,
              "test_accuracy": 0.5, "directory": "step00000000"}
RUN_JSON = {"task": "first", "seed": 0, "options": {"train_length": [4, 4], "test_length": [8, 8]}}
SPEC = '[sweep]\nseeds = [0, 1]\n\n[[job]]\nverb = "verify"\nname = "first"\nlengths = "1:3"\nstrings = 4\n'
DEEP = "[" * 100_000 + "]" * 100_000


def _run_dir(tmp: Path, index: bytes | str, run: bytes | str | None = None) -> Path:
    run_dir = tmp / "run"
    (run_dir / "checkpoints" / "step00000000").mkdir(parents=True, exist_ok=True)
    for name, content in (("checkpoints/index.jsonl", index), ("run.json", run)):
        if content is not None:
            path = run_dir / name
            path.write_bytes(content if isinstance(content, bytes) else content.encode())
    return run_dir


def _one_line_error(call, *needles: str) -> str:
    with pytest.raises(ExactLensError) as err:
        call()
    said = str(err.value)
    assert "\n" not in said, said
    for needle in needles:
        assert needle in said, said
    return said


# ---- each case the audit found --------------------------------------------------------------------------------

@pytest.mark.parametrize("line, needle", [
    ({**INDEX_LINE, "directory": None}, "directory must be the name"),
    ({**INDEX_LINE, "directory": "../../etc"}, "directory must be the name"),
    ({**INDEX_LINE, "step": "3"}, "step and epoch must be integers"),
    ([1, 2], "not a checkpoint record"),
    ("NaN", "not a checkpoint record"),
    (DEEP, "nested too deeply"),
])
def test_a_damaged_checkpoint_index_is_one_line(tmp_path, line, needle):
    text = line if isinstance(line, str) else json.dumps(line)
    _one_line_error(lambda: read_checkpoints(_run_dir(tmp_path, text + "\n")), "index.jsonl", needle)


def test_a_checkpoint_index_that_is_not_utf8_is_one_line(tmp_path):
    damaged = b"\xff\xfe" + json.dumps(INDEX_LINE).encode()
    _one_line_error(lambda: read_checkpoints(_run_dir(tmp_path, damaged)), "not UTF-8")


@pytest.mark.parametrize("run", [
    json.dumps({**RUN_JSON, "options": [1, 2]}), json.dumps([1, 2]), b"\xff{}", "{", DEEP, '{"options": NaN}',
])
def test_a_damaged_run_json_is_one_line(tmp_path, run):
    run_dir = _run_dir(tmp_path, json.dumps(INDEX_LINE) + "\n", run)
    _one_line_error(lambda: sources_of(run_dir), "run.json")


def test_a_good_run_json_gives_the_recorded_lengths(tmp_path):
    sources, origin = sources_of(_run_dir(tmp_path, json.dumps(INDEX_LINE) + "\n", json.dumps(RUN_JSON)))
    assert [s.step for s in sources] == [0] and origin.test_length == [8, 8]


@pytest.mark.parametrize("text, needle", [
    (b'[[job]]\nverb = "verify"\nname = "\xff"\n', "not UTF-8"),
    (("[[job]]\nverb = \"verify\"\nname = \"first\"\nx = " + DEEP + "\n").encode(), "nested too deeply"),
    (b'[sweep]\ncpus = inf\n[[job]]\nverb = "verify"\nname = "first"\n', "finite"),
    (b'[sweep]\ncpus = nan\n[[job]]\nverb = "verify"\nname = "first"\n', "finite"),
    (b'[[job]]\nverb = "verify"\nname = "first"\ngpus = -inf\n', "finite"),
    (b'[sweep]\nseeds = [1099511627777]\n[[job]]\nverb = "verify"\nname = "first"\n', "[0, 2^40]"),
])
def test_a_damaged_spec_is_one_line(tmp_path, text, needle):
    path = tmp_path / "spec.toml"
    path.write_bytes(text)
    _one_line_error(lambda: load_sweep(path), needle)


def test_a_deeply_nested_score_file_is_one_line(tmp_path):
    path = tmp_path / "circuit.json"
    path.write_text('{"edges": ' + DEEP + "}")
    _one_line_error(lambda: load_mib(path), "circuit file", "nested too deeply")


def test_a_multi_line_error_is_said_in_one_line():
    """An ExactLensError built from another error's several lines (tracr's, torch's) is one line, in Python too."""
    err = ExactLensError("first part\n  second part\n")
    assert str(err) == "first part; second part" and _one_line(err) == "first part; second part"

    class Listed(ExactLensError):
        def __str__(self) -> str:
            return "one\ntwo"

    assert _one_line(Listed()) == "one; two"


# ---- the fuzz test -------------------------------------------------------------------------------------------

JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=8)


@st.composite
def damaged(draw, good: dict) -> bytes:
    """A good record damaged: one field replaced by any JSON value, or removed, or its bytes cut, doubled or
    overwritten at any place."""
    how = draw(st.sampled_from(["replace", "remove", "cut", "bytes"]))
    record = dict(good)
    key = draw(st.sampled_from(sorted(good)))
    if how == "replace":
        record[key] = draw(JSON_VALUES)
    elif how == "remove":
        del record[key]
    text = json.dumps(record).encode()
    if how == "cut":
        return text[:draw(st.integers(0, len(text)))]
    if how == "bytes":
        at = draw(st.integers(0, len(text)))
        return text[:at] + draw(st.binary(min_size=1, max_size=4)) + text[at:]
    return text


FUZZ = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@FUZZ
@given(line=damaged(INDEX_LINE))
def test_fuzz_checkpoint_index(tmp_path, line):
    run_dir = _run_dir(tmp_path, line + b"\n")
    try:
        found = read_checkpoints(run_dir)
    except ExactLensError as err:
        assert "\n" not in str(err)
        return
    assert all(isinstance(c.step, int) and c.path.parent == run_dir / "checkpoints" for c in found)


@FUZZ
@given(run=damaged(RUN_JSON))
def test_fuzz_run_json(tmp_path, run):
    run_dir = _run_dir(tmp_path, json.dumps(INDEX_LINE) + "\n", run)
    try:
        _, origin = sources_of(run_dir)
    except ExactLensError as err:
        assert "\n" not in str(err)
        return
    for lengths in (origin.train_length, origin.test_length):
        assert lengths is None or all(isinstance(n, int) for n in lengths)


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    from exactlens.sweep import run_sweep

    root = tmp_path_factory.mktemp("swept")
    (root / "spec.toml").write_text(SPEC)
    run_sweep(root / "spec.toml", root / "out", workers=1, progress=False)
    sweep = parse_sweep(SPEC)
    rows = {j.id: read_row(root / "out", j.id) for j in sweep.jobs}
    assert all(r is not None and r["status"] == "ok" for r in rows.values())
    return root / "out", sweep, rows


@settings(FUZZ, max_examples=15)
@given(row=st.data())
def test_fuzz_sweep_rows(swept, row):
    out, sweep, rows = swept
    job = sweep.jobs[0]
    path = out / "jobs" / job.id / "row.json"
    path.write_bytes(row.draw(damaged(rows[job.id])))
    try:
        read = read_row(out, job.id)
        assert read is None or (read["job"] == job.id and read["status"] in ("ok", "failed", "skipped"))
        table = collect_rows(sweep, out)
        write_table(table, out / "check")
        write_summary(table, out / "check", "fuzz")
    finally:
        path.write_text(json.dumps(rows[job.id]))


def test_a_damaged_row_is_run_again_by_resume(swept, tmp_path):
    import shutil

    from exactlens.sweep import run_sweep

    out = tmp_path / "out"
    shutil.copytree(swept[0], out)
    sweep, rows = swept[1], swept[2]
    damage = [b"\xff\xfe", json.dumps({**rows[sweep.jobs[1].id], "status": 3}).encode()]
    for job, bad in zip(sweep.jobs, damage, strict=True):
        (out / "jobs" / job.id / "row.json").write_bytes(bad)
    spec = tmp_path / "spec.toml"
    spec.write_text(SPEC)
    result = run_sweep(spec, out, workers=1, resume=True, progress=False)
    assert result["ran"] == len(sweep.jobs) and result["ok"] == len(sweep.jobs)
    table = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert [r["job"] for r in table] == [j.id for j in sweep.jobs] and all(r["status"] == "ok" for r in table)


def _toml(value) -> str:
    """A Python value as a TOML value (None, which TOML lacks, as an empty string)."""
    if value is None:
        return '""'
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return {"inf": "inf", "-inf": "-inf", "nan": "nan"}.get(repr(value), repr(value))
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    return "{ " + ", ".join(f"{json.dumps(k)} = {_toml(v)}" for k, v in value.items()) + " }"


SPEC_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(["strings", "lengths", "x"]), inner,
                                                                 max_size=2),
    max_leaves=6)
SWEEP_KEYS = ("seeds", "cpus", "gpus", "stack")


@settings(max_examples=30, deadline=None)
@given(key=st.sampled_from([*SWEEP_KEYS, "lengths", "strings", "grid", "then", "verb", "options"]),
       value=SPEC_VALUES)
def test_fuzz_sweep_specs(key, value):
    line = f"{key} = {_toml(value)}\n"
    head, job = (line, "") if key in SWEEP_KEYS else ("", line)
    text = f'[sweep]\n{head}\n[[job]]\nverb = "verify"\nname = "first"\n{job}'.replace(
        'verb = "verify"\nname = "first"\nverb', "name = \"first\"\nverb")
    try:
        sweep = parse_sweep(text, "fuzz.toml")
    except ExactLensError as err:
        assert "\n" not in str(err)
        return
    assert sweep.jobs and len({j.id for j in sweep.jobs}) == len(sweep.jobs)

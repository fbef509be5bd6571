"""The `exactlens` command: with --json, stdout is exactly one JSON object, progress goes to
stderr, and bad input exits 2 with a one-line error on stderr and nothing on stdout.

The subprocess runs (the real `python -m exactlens.cli`) start together in one fixture, since
each pays the interpreter and torch start-up; the rest call exactlens.cli.main in-process.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from exactlens.cli import main

ROOT = Path(__file__).resolve().parents[1]

RUNS = {
    "list": ["list", "--json"],
    "verify": ["verify", "parity", "--lengths", "1:4", "--dtype", "float64", "--json"],
    "precision": ["precision", "first-flawed", "--param", "c=3", "--max-length", "30", "--strings", "8", "--json"],
    "bad_c": ["verify", "parity", "--param", "c=-1", "--json"],
}
# Each run costs seconds of interpreter + torch + TransformerLens start-up, so only one bad input
# runs as a subprocess; the others (unknown name, bad --lengths, ...) go through main() below.


@pytest.fixture(scope="module")
def runs():
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"), OMP_NUM_THREADS="1")
    procs = {
        key: subprocess.Popen([sys.executable, "-m", "exactlens.cli", *argv], cwd=ROOT, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for key, argv in RUNS.items()
    }
    out = {}
    for key, proc in procs.items():
        stdout, stderr = proc.communicate(timeout=300)
        out[key] = (proc.returncode, stdout, stderr)
    return out


def one_json_object(stdout: str) -> dict:
    """stdout must hold exactly one JSON object (and nothing else but whitespace)."""
    decoder = json.JSONDecoder()
    text = stdout.strip()
    obj, end = decoder.raw_decode(text)
    assert end == len(text), f"extra output after the JSON object: {text[end:]!r}"
    assert isinstance(obj, dict)
    return obj


def assert_one_line_error(code: int, stdout: str, stderr: str, needle: str) -> None:
    assert code == 2
    assert stdout == ""
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, f"stderr should be one line, got {stderr!r}"
    assert lines[0].startswith("exactlens: error:") and needle in lines[0]
    assert "Traceback" not in stderr


# ----------------------------------------------------------------------------- subprocess


def test_subprocess_list_json(runs):
    code, stdout, stderr = runs["list"]
    assert code == 0, stderr
    obj = one_json_object(stdout)
    names = [row["name"] for row in obj["constructions"]]
    assert {"parity", "first", "parity-ln", "first-flawed", "first-log-ln", "parity-ln-eta"} <= set(names)
    for row in obj["constructions"]:
        assert {"name", "language", "paper", "summary", "parameters"} <= set(row)


def test_subprocess_verify_json(runs):
    code, stdout, stderr = runs["verify"]
    assert code == 0, stderr
    obj = one_json_object(stdout)
    assert obj["name"] == "parity" and obj["dtype"] == "float64" and obj["seed"] == 0
    assert [r["length"] for r in obj["results"]] == [1, 2, 3, 4]
    assert [r["strings"] for r in obj["results"]] == [2, 4, 8, 16]
    assert all(r["accuracy"] == 1.0 for r in obj["results"])
    assert obj["results"][0]["min_abs_logit"] == pytest.approx(2 * math.tanh(1.0) / 4, rel=1e-12)
    assert "verifying parity" in stderr  # progress goes to stderr


def test_subprocess_precision_json(runs):
    code, stdout, stderr = runs["precision"]
    assert code == 0, stderr
    obj = one_json_object(stdout)
    assert {"name", "dtype", "max_exact_length", "first_failure_length", "checked"} <= set(obj)
    assert obj["max_exact_length"] == 20 and obj["first_failure_length"] == 21
    assert "scanning first-flawed" in stderr


def test_subprocess_bad_input(runs):
    assert_one_line_error(*runs["bad_c"], "c must be")


# ----------------------------------------------------------------------------- in-process


def test_main_verify_json(capsys):
    assert main(["verify", "first", "--lengths", "2,5", "--param", "c=2", "--dtype", "float64", "--json"]) == 0
    captured = capsys.readouterr()
    obj = one_json_object(captured.out)
    if "params" in obj:
        assert obj["params"] == {"c": 2}
    rows = obj["results"]
    assert [r["length"] for r in rows] == [2, 5]
    for r in rows:
        n = r["length"] + 1
        assert r["min_abs_logit"] == pytest.approx(math.exp(2) / (math.exp(2) + n - 1) / 2, rel=1e-12)
    assert captured.err.strip() and not captured.err.startswith("{")


def test_main_verify_text_and_note(capsys):
    assert main(["verify", "first-flawed", "--lengths", "1:4"]) == 0
    captured = capsys.readouterr()
    assert captured.out.splitlines()[0].startswith("first-flawed float32")
    assert len(captured.out.strip().splitlines()) == 5
    assert "accuracy below 1" in captured.err


def test_main_precision_json(capsys):
    assert main(["precision", "first-flawed", "--param", "c=2", "--max-length", "20", "--json"]) == 0
    obj = one_json_object(capsys.readouterr().out)
    assert obj["max_exact_length"] == 7 and obj["first_failure_length"] == 8  # e^2 = 7.39


def test_main_list_text_and_json(capsys):
    assert main(["list"]) == 0
    text = capsys.readouterr().out
    assert "parity-ln-eta" in text and not text.lstrip().startswith("{")
    assert main(["list", "--json"]) == 0
    assert "constructions" in one_json_object(capsys.readouterr().out)


# one_line: the error comes before any progress line (names, parameters, lengths are checked first).
@pytest.mark.parametrize("argv, needle, one_line", [
    (["verify", "nope", "--json"], "nope", True),
    (["verify", "parity", "--lengths", "5:1", "--json"], "5:1", True),
    (["verify", "parity", "--lengths", "1:2:0", "--json"], "1:2:0", True),
    (["verify", "parity", "--lengths", "a,b"], "a,b", True),
    (["verify", "parity", "--param", "c=-1", "--json"], "-1", True),
    (["verify", "parity", "--param", "gamma=2", "--json"], "gamma", True),
    (["verify", "parity", "--param", "c", "--json"], "KEY=VALUE", True),
    (["verify", "parity-ln", "--param", "eps=abc", "--json"], "eps", True),
    (["verify", "parity-ln-eta", "--param", "eta=2", "--json"], "eta", True),
    (["verify", "parity", "--strings", "0", "--lengths", "20", "--json"], "strings", False),
    (["precision", "nope", "--json"], "nope", True),
    (["precision", "first", "--param", "c=0", "--json"], "c must be", True),
    (["precision", "first", "--max-length", "0", "--json"], "max-length", False),
])
def test_main_bad_input_exits_2(capsys, argv, needle, one_line):
    assert main(argv) == 2
    captured = capsys.readouterr()
    if one_line:
        assert_one_line_error(2, captured.out, captured.err, needle)
    else:
        assert captured.out == "" and "Traceback" not in captured.err
        assert captured.err.strip().splitlines()[-1].startswith("exactlens: error:")
        assert needle in captured.err.strip().splitlines()[-1]


def test_main_argparse_errors_exit_2(capsys):
    with pytest.raises(SystemExit) as info:
        main(["verify", "parity", "--dtype", "float16"])
    assert info.value.code == 2
    assert capsys.readouterr().out == ""
    with pytest.raises(SystemExit) as info:
        main([])
    assert info.value.code == 2


# ----------------------------------------------------------------------------- start-up without torch

HEAVY = ("torch", "numpy", "transformer_lens", "scipy")


def _heavy_imports(argv: list[str], papers_only: bool = False) -> tuple[list[str], str]:
    """Run `exactlens ARGV` in a fresh interpreter; return the heavy modules it imported and its stdout
    (papers_only: with exactlens's paper plug-ins as the only plug-ins)."""
    code = "\n".join([
        "import contextlib, io, json, sys",
        "import exactlens.plugins as plugins",
        "found = plugins.entry_points",
        "plugins.entry_points = lambda group: [e for e in found(group=group)\n"
        "                                      if e.value.startswith('exactlens.papers.')]"
        if papers_only else "",
        "from exactlens.cli import main",
        "out = io.StringIO()",
        "with contextlib.redirect_stdout(out):",
        "    try:",
        f"        main({argv!r})",
        "    except SystemExit:",
        "        pass",
        f"print(json.dumps({{'heavy': sorted(m for m in {HEAVY!r} if m in sys.modules), 'out': out.getvalue()}}))",
    ])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))  # this process's plug-ins
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    return result["heavy"], result["out"]


def test_help_imports_no_torch():
    heavy, out = _heavy_imports(["--help"])
    assert heavy == [], f"`exactlens --help` imported {heavy}"
    assert "pairlogic" in out and "list" in out  # the plug-ins' verbs are there too


@pytest.mark.parametrize("argv", [["list"], ["list", "--json"]])
def test_list_of_the_papers_imports_no_torch(argv):
    heavy, out = _heavy_imports(argv, papers_only=True)
    assert heavy == [], f"`exactlens {' '.join(argv)}` imported {heavy}"
    assert "parity-ln-eta" in out and "majority-per-position" in out


def test_list_imports_no_torch():
    heavy, out = _heavy_imports(["list"])
    assert heavy == [], f"`exactlens list` imported {heavy}"

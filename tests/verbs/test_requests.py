"""Requests declared once: the CLI flags, the API's keywords and their checks come from one dataclass."""

from __future__ import annotations

import argparse
import inspect
import math
from dataclasses import dataclass

import pytest

from exactlens.errors import ExactLensError
from exactlens.requests import (
    Bool,
    Choice,
    DType,
    Float,
    Int,
    IntList,
    Lengths,
    Pairs,
    TextList,
    add_arguments,
    command_line,
    from_call,
    from_namespace,
    option,
    options_of,
)


@dataclass(frozen=True)
class ToyRequest:
    name: str = option(help="a name", positional=True)
    count: int = option(3, kind=Int(1, 10), help="how many")
    rate: float = option(0.5, kind=Float(0.0, 1.0, open_hi=True), help="a rate")
    mode: str = option("a", kind=Choice(("a", "b")), help="a mode")
    dtype: str = option("float32", kind=DType(), help="dtype")
    lengths: list | None = option(None, kind=Lengths(1), help="lengths")
    check: bool = option(True, kind=Bool(), flag="--no-check", negate=True, help="skip the check")
    params: dict = option({}, kind=Pairs(), flag="--param", dest="param", extra=True, help="parameters")


def _parse(argv):
    parser = argparse.ArgumentParser()
    add_arguments(parser, ToyRequest)
    return from_namespace(ToyRequest, parser.parse_args(argv))


def test_cli_and_api_build_the_same_request():
    cli = _parse(["x", "--count", "4", "--rate", "0.25", "--mode", "b", "--dtype", "float64", "--lengths", "1:3",
                  "--no-check", "--param", "c=2", "--param", "eps=0"])
    api = from_call("toy", ToyRequest, ["x"], {"count": 4, "rate": 0.25, "mode": "b", "dtype": "float64",
                                              "lengths": [3, 1, 2], "check": False, "c": 2, "eps": 0})
    assert cli == api
    assert api.params == {"c": 2, "eps": 0} and api.lengths == [1, 2, 3]
    assert _parse(["x"]) == from_call("toy", ToyRequest, ["x"], {}) == ToyRequest("x")


@pytest.mark.parametrize("key, value, needle", [
    ("count", "3", "count takes an integer from 1 to 10"),
    ("count", 3.0, "integer"),
    ("count", True, "integer"),
    ("count", 11, "from 1 to 10"),
    ("rate", math.inf, "finite"),
    ("rate", math.nan, "finite"),
    ("rate", 1.0, "< 1"),
    ("rate", "0.5", "finite number"),
    ("mode", "c", "one of a, b"),
    ("dtype", "float16", "float32, float64"),
    ("lengths", ["a"], "word lengths"),
    ("lengths", [0, 1], "from 1"),
    ("lengths", "5:1", "word lengths"),
    ("lengths", [], "word lengths"),
    ("check", "no", "True or False"),
])
def test_api_refuses_with_one_line_naming_the_option(key, value, needle):
    with pytest.raises(ExactLensError, match=needle) as info:
        from_call("toy", ToyRequest, ["x"], {key: value})
    assert "\n" not in str(info.value) and key in str(info.value)


def test_unknown_keyword_goes_to_extra_or_is_refused():
    @dataclass(frozen=True)
    class Strict:
        count: int = option(1, kind=Int(0), help="n")

    with pytest.raises(ExactLensError, match="has no option 'cuont'; its options: count"):
        from_call("strict", Strict, [], {"cuont": 2})
    with pytest.raises(ExactLensError, match="takes 0 positional"):
        from_call("strict", Strict, [1], {})


def test_torch_dtypes_are_accepted_as_their_names():
    torch = pytest.importorskip("torch")
    assert from_call("toy", ToyRequest, ["x"], {"dtype": torch.float64}).dtype == "float64"
    with pytest.raises(ExactLensError, match="float32, float64"):
        from_call("toy", ToyRequest, ["x"], {"dtype": torch.float16})


def test_cli_text_is_checked_by_the_same_kinds():
    for argv, needle in ((["x", "--count", "0"], "--count takes an integer from 1 to 10"),
                         (["x", "--rate", "inf"], "--rate takes a finite number"),
                         (["x", "--param", "c"], "KEY=VALUE")):
        with pytest.raises(ExactLensError, match=needle):
            _parse(argv)


def test_lists_kinds():
    assert IntList(0).check("seeds", "0:3") == [0, 1, 2, 3]
    assert IntList(0).check("seeds", [2, 5]) == [2, 5]
    with pytest.raises(ExactLensError, match="at most 4"):
        IntList(0, most=4).check("seeds", "0:100000000")  # refused before a list is built
    assert TextList().check("parts", "behaviour") == ("behaviour",)  # a string is one item, not its letters
    assert TextList().parse("parts", "a,b") == ("a", "b")
    for bad in ("", ",", "a,,b"):
        with pytest.raises(ExactLensError):
            TextList().parse("parts", bad)
    with pytest.raises(ExactLensError, match="unknown 'x'"):
        TextList(choices=("a", "b")).check("parts", ["a", "x"])


def test_command_line_echo_leaves_defaults_out():
    request = ToyRequest("x", count=4, check=False, params={"c": 2})
    assert command_line("toy", request) == "exactlens toy x --count 4 --no-check --param c=2"
    assert _parse(["x", "--count", "4", "--no-check", "--param", "c=2"]) == request


def test_command_line_echo_parses_back_to_the_same_request():
    """The echo of a request with ranges, lists and schedules reads back as that request (a train length range
    is written LO:HI, the form its flag parses)."""
    import shlex

    from exactlens.verbs.train import TrainRequest

    request = TrainRequest(task="first", out="runs/x", seed=3, options={"num_classes": 3},
                           flags={"train_length": (1, 4), "test_length": (7, 7), "checkpoints": "log:5", "lr": 0.01})
    line = command_line("train", request)
    assert "--train-length 1:4" in line and "--test-length 7" in line, line
    parser = argparse.ArgumentParser()
    add_arguments(parser, TrainRequest)
    assert from_namespace(TrainRequest, parser.parse_args(shlex.split(line)[2:])) == request


def test_every_verb_is_declared_with_help_and_a_real_signature():
    """Every registered verb: each option has help and a kind; the API function's signature lists exactly the
    request's API options; the parser builds."""
    from exactlens.api import API
    from exactlens.cli import build_parser
    from exactlens.verbs import VERBS, VerbSpec, load_core_verbs

    load_core_verbs()
    build_parser()
    specs = [v for v in VERBS.values() if isinstance(v, VerbSpec)]
    assert {"verify", "precision", "hull", "circuit", "discover", "report", "build", "pairlogic"} <= {
        s.name for s in specs}
    for spec in specs:
        for f, opt in options_of(spec.request):
            assert opt.help, (spec.name, f.name)
        if spec.api:
            names = [p.name for p in inspect.signature(API[spec.name]).parameters.values()]
            declared = [opt.api_name or f.name for f, opt in options_of(spec.request) if opt.api]
            assert sorted(names) == sorted(declared), spec.name


@pytest.mark.parametrize("argv", [["list", "--json", "--quiet"], ["--quiet", "list", "--json"],
                                  ["list", "--debug", "--json"], ["verify", "first", "--lengths", "1", "--strings", "1",
                                                                  "--json", "--quiet", "--debug"]])
def test_global_options_before_or_after_the_verb(capsys, argv):
    import json

    from exactlens.cli import main

    assert main(argv) == 0
    json.loads(capsys.readouterr().out)  # one JSON object, the global flags not taken for the verb's

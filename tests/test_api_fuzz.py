"""The Python API under bad input (hypothesis): every verb of ``import exactlens as el``, one argument at
a time replaced by a wrong type, an empty, huge, non-finite or nested value, either works or raises
ExactLensError with one line; never an AttributeError, TypeError or KeyError from inside, never a
hang (sizes are refused up front: the limits are lowered here so that a huge request is refused, not
run). Plus the exact calls a second reliability audit found failing (issue 31)."""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import exactlens as el
from exactlens.errors import ExactLensError

# small but valid calls: each argument below is replaced by a drawn value in turn
BASE = {
    "build": {"name": "first"},
    "verify": {"name": "first", "lengths": [1, 2], "strings": 4},
    "precision": {"name": "first", "max_length": 4, "strings": 4},
    "hull": {"target": "first"},
    "circuit": {"target": "first", "lengths": [1, 2], "words": 4},
    "discover": {"target": "first", "method": "patching", "lengths": [1, 2], "words": 4},
    "diff": {"trained": "first-flawed", "against": "first", "lengths": [2, 3], "strings": 4,
             "parts": ["behaviour"]},
    "train": {"name": "first", "epochs": 1, "strings_per_epoch": 10, "test_strings": 10},
}
FUZZED = {
    "build": ["name", "dtype", "device"],
    "verify": ["name", "lengths", "strings", "dtype", "seed"],
    "precision": ["name", "max_length", "strings", "seed"],
    "hull": ["target", "tol", "seed"],
    "circuit": ["target", "granularity", "lengths", "words", "seed", "ablation"],
    "discover": ["target", "method", "lengths", "words", "seed", "threshold", "ablation"],
    "diff": ["trained", "against", "lengths", "strings", "parts", "seed"],
    "train": ["out", "seed", "seeds", "epochs", "lr"],
}
# wrong types that only the request validation generated at the entry can refuse (the lead's rewrite of
# api.py) would be listed here, as (verb, argument), and marked xfail; none is left at present
LEAD: set[tuple[str, str]] = set()

scalars = st.one_of(
    st.none(), st.booleans(),
    st.integers(min_value=-(10**12), max_value=10**12),
    st.sampled_from([0, -1, 1, 2, 10**9, 10**15]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from(["", "a", "nope", "1:3", "nan", "inf", "0:100000000", ","]),
    st.text(max_size=4),
    st.builds(object),
)
values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=3), st.tuples(inner, inner),
                                                     st.dictionaries(st.text(max_size=2), inner, max_size=2)),
                      max_leaves=5)


def nested(depth: int) -> list:
    out: list = []
    for _ in range(depth):
        out = [out]
    return out


@pytest.fixture(autouse=True)
def small_limits(monkeypatch, tmp_path):
    """A huge request is refused by the up-front estimates instead of running; outputs land in tmp_path."""
    monkeypatch.setenv("EXACTLENS_WORK_LIMIT", "1e9")
    monkeypatch.setenv("EXACTLENS_MEMORY_LIMIT", "2G")
    monkeypatch.setenv("EXACTLENS_QUIET", "1")
    monkeypatch.chdir(tmp_path)


def outcome(verb: str, **kwargs) -> str:
    """'ok' or 'refused' (ExactLensError); anything else fails the test with what was called."""
    function = getattr(el, verb)
    try:
        function(**kwargs)
    except ExactLensError as err:
        message = str(err)
        assert message and "\n" not in message.strip(), f"el.{verb}({kwargs!r}): not one line: {message!r}"
        return "refused"
    except Exception as err:  # noqa: BLE001 - the point of the test
        pytest.fail(f"el.{verb}(**{kwargs!r}) raised {type(err).__name__}: {err}")
    return "ok"


CASES = [pytest.param(verb, arg, marks=pytest.mark.xfail(strict=False, reason="request validation (lead)"))
         if (verb, arg) in LEAD else pytest.param(verb, arg) for verb, args in FUZZED.items() for arg in args]


@pytest.mark.parametrize(("verb", "arg"), CASES)
@settings(max_examples=8, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(value=values)
def test_each_argument_of_each_verb(verb, arg, value):
    if verb == "train" and arg == "seeds" and isinstance(value, (list, tuple)) and len(value) > 2:
        value = value[:2]  # keep a valid drawn list small: the point is the type, not training many runs
    if verb == "hull" and arg == "target" and value is None:
        return  # valid: Brody's random keys (a minute of linear programs), not a bad input
    outcome(verb, **{**BASE[verb], arg: value})


@pytest.mark.parametrize(("verb", "arg"), [(v, a) for v, args in FUZZED.items() for a in args
                                          if (v, a) not in LEAD and a not in ("name", "target", "trained")])
def test_nested_and_non_finite_values(verb, arg):
    for value in (nested(50), math.nan, math.inf, -math.inf, 10**30, [math.nan], {"a": 1}):
        outcome(verb, **{**BASE[verb], arg: value})


# ---- the calls of the audit ---------------------------------------------------------------------


AUDIT = [
    ("diff", {"trained": 123, "against": "first"}, "model"),
    ("circuit", {"target": 123}, "model"),
    ("verify", {"name": "first", "lengths": ["a", "b"]}, "integer"),
    ("verify", {"name": "first", "lengths": [1], "seed": "x"}, "seed"),
    ("hull", {"target": 123}, "a checkpoint directory, a construction name or a model"),
    ("train", {"name": "first", "out": 123}, "path"),
    ("build", {"name": ["first"]}, "name takes a string"),
    ("discover", {"target": "first", "method": "patching", "threshold": math.inf}, "finite"),
    ("diff", {"trained": "first-flawed", "against": "first", "parts": []}, "parts takes a list of names"),
    ("report", {"names": 123, "out": "r"}, "list of construction names"),
    ("report", {"names": [123], "out": "r"}, "list of construction names"),
    ("report", {"names": ["first"], "out": 123}, "path"),
    ("circuit", {"target": "first", "lengths": [10**8]}, "memory limit"),
    ("circuit", {"target": "first", "words": 10**7}, "--words"),
    ("build", {"name": "tracr-reverse", "max_seq_len": 10**6}, "max_seq_len"),
]


@pytest.mark.parametrize(("verb", "kwargs", "needle"), AUDIT, ids=[f"{v}-{i}" for i, (v, _, _) in enumerate(AUDIT)])
def test_the_audits_calls_are_refused_in_one_line(verb, kwargs, needle):
    if kwargs.get("name") == "tracr-reverse":
        pytest.importorskip("tracr")
    with pytest.raises(ExactLensError, match=needle.replace("-", r"\-")):
        getattr(el, verb)(**kwargs)


def test_a_string_where_a_list_is_expected_is_one_item(tmp_path):
    """diff's parts and report's names given as one string mean that one item, never its letters."""
    result = el.diff("first-flawed", "first", lengths=[2, 3], strings=4, parts="behaviour")
    assert result["settings"]["parts"] == ["behaviour"]
    with pytest.raises(ExactLensError, match="unknown construction 'nope'"):
        el.report("nope", out=tmp_path / "r")

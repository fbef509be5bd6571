"""verify and precision on a model, not a construction name: an ExactTransformer, a checkpoint directory, a
train result; the same numbers as the construction's where the model is the construction, and the
precision question (does the float64 twin of the same weights fail too?) answered from evidence."""

from __future__ import annotations

import json

import pytest

import exactlens as el
from exactlens.cli import main
from exactlens.errors import ExactLensError


def test_verify_a_model_and_its_checkpoint_give_the_construction_s_numbers(tmp_path, capsys) -> None:
    by_name = el.verify("first", lengths=[2, 5], strings=16)
    model = el.build("first")
    by_model = el.verify(model, lengths=[2, 5], strings=16)
    assert by_model["target"] == {"kind": "model"} and by_model["task"]["name"] == "first"
    assert [r["accuracy"] for r in by_model["results"]] == [r["accuracy"] for r in by_name["results"]]
    assert [r["cross_entropy_bits"] for r in by_model["results"]] == [r["cross_entropy_bits"]
                                                                         for r in by_name["results"]]
    model.save(tmp_path / "ck")
    capsys.readouterr()
    assert main(["verify", str(tmp_path / "ck"), "--lengths", "2,5", "--strings", "16", "--json"]) == 0
    from_cli = json.loads(capsys.readouterr().out)
    assert from_cli["target"]["kind"] == "checkpoint"
    assert [r["accuracy"] for r in from_cli["results"]] == [r["accuracy"] for r in by_name["results"]]


def test_verify_refuses_what_does_not_apply() -> None:
    model = el.build("first")
    with pytest.raises(ExactLensError, match="task applies to a model that records none"):
        el.verify(model, task="parity", lengths=[2])
    with pytest.raises(ExactLensError, match="readout applies to a model exactlens did not build"):
        el.verify(model, readout="last", lengths=[2])
    with pytest.raises(ExactLensError, match="construction 'first' answers its own task"):
        el.verify("first", task="first", lengths=[2])
    with pytest.raises(ExactLensError, match="param .* applies to a construction"):
        el.verify(model, lengths=[2], c=3)
    with pytest.raises(ExactLensError, match="got int"):
        el.verify(3, lengths=[2])


def test_precision_of_a_model_says_whether_floating_point_is_the_cause() -> None:
    by_name = el.precision("palindrome", max_length=48, strings=4)
    assert by_name["first_failure_length"] is not None and "float64" not in by_name  # the construction's JSON as it was
    model = el.build("palindrome", dtype="float32")
    result = el.precision(model, max_length=48, strings=4)
    assert result["first_failure_length"] == by_name["first_failure_length"]
    twin = result["float64"]
    assert twin["applies"] and twin["cause"].startswith("floating point")
    assert twin["first_failure_length"] is None or twin["first_failure_length"] > result["first_failure_length"]
    exact = el.precision(el.build("first"), max_length=8, strings=4)
    assert exact["first_failure_length"] is None and not exact["float64"]["applies"]
    assert "nothing for floating point to explain" in exact["float64"]["reason"]


@pytest.mark.parametrize("argv", [
    ["verify", "CK", "--readout", "last", "--lengths", "2"],
    ["precision", "CK", "--readout", "last", "--max-length", "2"],
    ["report", "--model", "CK", "--readout", "last", "--out", "REP", "--quick"],
])
def test_a_readout_for_an_exactlens_checkpoint_is_refused_as_diff_refuses_it(tmp_path, capsys, argv) -> None:
    """--readout applies to a foreign model; an exactlens checkpoint reads its own (never silently ignored)."""
    el.build("first").save(tmp_path / "ck")
    argv = [str(tmp_path / "ck") if a == "CK" else str(tmp_path / "rep") if a == "REP" else a for a in argv]
    assert main(argv) == 2
    assert "readout applies to a model exactlens did not build" in capsys.readouterr().err
    assert not (tmp_path / "rep").exists()
    with pytest.raises(ExactLensError, match="readout applies"):
        el.verify(str(tmp_path / "ck"), readout="last", lengths=[2])

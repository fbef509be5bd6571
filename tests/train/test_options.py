"""The training options declared once (exactlens.train.options.TrainOptions): the tables, the checks and
``exactlens train``'s flags all come from it."""

from __future__ import annotations

import argparse
import dataclasses
import json

import pytest

from exactlens.errors import ExactLensError
from exactlens.train.options import (
    GENERIC_DEFAULTS,
    OPTION_DOCS,
    PRESET_SETS,
    SHARED_OPTIONS,
    LengthRange,
    TrainOptions,
)

TINY = dict(epochs=1, strings_per_epoch=4, test_strings=2, train_length=3, test_length=3)


def _train_parser() -> argparse.ArgumentParser:
    from exactlens.cli import build_parser

    parser = build_parser(["train"])
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices["train"]


def test_tables_are_read_off_the_declaration():
    fields = {f.name: f for f in dataclasses.fields(TrainOptions)}
    assert list(OPTION_DOCS) == list(fields)
    assert all(OPTION_DOCS[name] == f.metadata["option"].help and OPTION_DOCS[name] for name, f in fields.items())
    # every field is in exactly one of: set by each preset, a generic default, a preset-declared option
    parts = [set(PRESET_SETS), set(GENERIC_DEFAULTS), set(SHARED_OPTIONS)]
    assert sum(map(len, parts)) == len(fields) and set().union(*parts) == set(fields)
    assert SHARED_OPTIONS == {"scaled": False, "layer_norm": "full", "positions": "paper", "num_classes": None}
    assert GENERIC_DEFAULTS["eval_every"] == 10 and GENERIC_DEFAULTS["ln_eps"] == 1e-5


def test_every_option_is_a_flag_of_exactlens_train():
    actions = {a.dest: a for a in _train_parser()._actions}
    for f in dataclasses.fields(TrainOptions):
        action = actions[f.name]
        assert action.option_strings == ["--" + f.name.replace("_", "-")]
        assert action.default in (None, False)  # not given: the preset's value
        assert action.help == OPTION_DOCS[f.name]
    assert set(actions["optimizer"].choices) == {"adam", "lbfgs"}


def test_length_range_kind():
    kind = LengthRange()
    assert kind.check("x", 5) == (5, 5) and kind.check("x", [2, 7]) == (2, 7)
    assert kind.parse("x", "4") == (4, 4) and kind.parse("x", "1:9") == (1, 9)
    for bad in ("10", (5, 2), (1, 2, 3), -1, True, 2.0):  # text only from the command line
        with pytest.raises(ExactLensError, match="lo <= hi"):
            kind.check("train_length", bad)
    with pytest.raises(ExactLensError, match="--train-length"):
        kind.parse("--train-length", "1:x")


def test_checks_come_from_the_kinds():
    from exactlens.train.presets import get_preset

    first = get_preset("first")
    with pytest.raises(ExactLensError, match="eval_every takes an integer >= 0"):
        first.resolve({"eval_every": -1})
    with pytest.raises(ExactLensError, match="grad_clip takes a finite number > 0"):
        first.resolve({"grad_clip": float("inf")})
    with pytest.raises(ExactLensError, match="optimizer='sgd' is not allowed; choose one of adam, lbfgs"):
        first.resolve({"optimizer": "sgd"})
    resolved = first.resolve({"lr": 1, "train_length": [2, 4], "grad_clip": None})
    assert resolved["lr"] == 1.0 and isinstance(resolved["lr"], float) and resolved["train_length"] == (2, 4)


def test_a_preset_default_must_name_an_option():
    from exactlens.train.presets import Preset

    with pytest.raises(ExactLensError, match=r"defaults for \['epochz'\]"):
        Preset(name="p", task="first", paper="-", summary="-", config=lambda t, o: None, defaults={"epochz": 3})


def test_train_spec_shares_the_preset():
    from exactlens.train.presets import get_preset

    preset = get_preset("majority")
    spec = preset.spec({"num_classes": 4})
    assert spec.preset is preset and spec.name == "majority" and spec.metrics == preset.metrics
    assert spec.options["num_classes"] == 4 and spec.task.n_outputs == 4


def test_api_passes_explicit_none(tmp_path):
    """In Python None is a value (no clipping), not 'the preset's value' as a flag left out is."""
    import exactlens as el

    clipped = el.train("dyck1", epochs=1, strings_per_epoch=4, batch_size=4, test_strings=2)
    assert clipped["options"]["grad_clip"] == 1.0  # the shaped preset's default
    free = el.train("dyck1", epochs=1, strings_per_epoch=4, batch_size=4, test_strings=2, grad_clip=None)
    assert free["options"]["grad_clip"] is None
    assert "checkpoint" not in repr(free) and repr(free).startswith("dyck1 seed 0: 1 steps in ")


def test_cli_text_and_json_agree(tmp_path, capsys):
    from exactlens.cli import main

    argv = ["train", "first", "--out", str(tmp_path / "a"), *[f"--{k.replace('_', '-')}={v}" for k, v in TINY.items()]]
    assert main([*argv, "--positions", "first"]) == 2  # the preset 'first' offers no other positions
    assert "preset 'first' has no option 'positions'" in capsys.readouterr().err
    assert main([*argv, "--option", "lr=0.01", "--lr", "0.02", "--eval-every", "0"]) == 2  # neither silently wins
    assert "lr is given twice with two values (--lr 0.02 and --option lr=0.01)" in capsys.readouterr().err
    assert main([*argv, "--option", "lr=0.02", "--lr", "0.02", "--eval-every", "0"]) == 0  # the same value: one
    text = capsys.readouterr().out.strip()
    info = json.loads((tmp_path / "a" / "run.json").read_text())
    assert info["options"]["lr"] == 0.02 and info["options"]["eval_every"] == 0  # 0 is a value, not "not given"
    assert text == (f"first seed 0: 1 steps in {info['wall_s']:.1f} s; final test accuracy "
                    f"{info['final']['test_accuracy']:.4f}, test cross-entropy {info['final']['test_loss_bits']:.4f} "
                    f"bits/string; checkpoint {tmp_path / 'a'}")
    assert main(["train", "first", "--out", str(tmp_path / "b"), "--epochs", "0"]) == 2
    assert "--epochs takes an integer >= 1, got 0" in capsys.readouterr().err

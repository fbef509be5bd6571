"""The notebook-first API: `import exactlens as el`, the CLI's verbs as functions whose results show
themselves (to_dict = the CLI's --json object, _repr_html_, plot), and TransformerLens habits."""

from __future__ import annotations

import json

import pytest
import torch

import exactlens as el
from exactlens.cli import main


def cli_json(capsys, *argv: str) -> dict:
    assert main([*argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_the_verbs_are_there():
    for verb in ("build", "verify", "precision", "train", "diff", "hull", "report", "pairlogic"):
        assert callable(getattr(el, verb)), verb
    assert "pairlogic" in dir(el)
    with pytest.raises(AttributeError, match="verbs:"):
        el.no_such_verb  # noqa: B018


def test_verify_is_the_cli_object_and_shows_itself(capsys):
    result = el.verify("parity", lengths="2:6", strings=50)
    assert result.to_dict() == cli_json(capsys, "verify", "parity", "--lengths", "2:6", "--strings", "50")
    assert result["results"][0]["accuracy"] == 1.0  # a mapping, like the dict it holds
    page = result._repr_html_()
    assert "<table>" in page and "min accuracy" in page and "data:image/png;base64," in page
    assert "parity float32" in repr(result)
    assert result.plot().axes


def test_precision_train_diff_hull(tmp_path):
    assert el.precision("first", max_length=40).to_dict()["max_exact_length"] == 40
    trained = el.train("first", epochs=3, strings_per_epoch=20, test_strings=20, train_length=[1, 8],
                       out=tmp_path / "run")
    assert trained.model is trained.run.model and (tmp_path / "run" / "run.json").exists()
    assert "test_accuracy" in trained._repr_html_()
    result = el.diff(trained, "first", lengths=[2, 3], parts=("behaviour", "alignment"), das_steps=5,
                     html=tmp_path / "diff.html")
    assert (tmp_path / "diff.html").exists() and "agreement" in result._repr_html_()
    assert result.plot() is not None
    hull = el.hull("first")
    assert hull["layers"] and "unselectable" in hull._repr_html_()
    many = el.train("first", seeds=[0, 1], epochs=2, strings_per_epoch=10, test_strings=10)
    assert len(many.models) == 2 and many.plot() is not None
    with pytest.raises(el.ExactLensError, match=r"result\.models\[i\]"):
        el.diff(many, "first", lengths=[2])


def test_pairlogic_from_the_api():
    result = el.pairlogic(check="sm-solution2", categories=4, positions=6)
    assert result["exact"] is True and "exact" in result._repr_html_()
    with pytest.raises(el.ExactLensError, match="no option 'nonsense'"):
        el.pairlogic(nonsense=1)


def test_transformerlens_habits():
    model = el.build("first", dtype="float64")
    tokens = model.to_tokens(["0110", "1011"])
    assert model.to_str_tokens(tokens)[0] == ["[CLS]", "0", "1", "1", "0"]
    assert model.to_string(tokens) == ["0110", "1011"]
    assert model.to_str_tokens("10") == ["[CLS]", "1", "0"]
    direction = model.tokens_to_residual_directions(0)
    torch.testing.assert_close(direction, model.W_U[:, 0])
    _, cache = model.run_with_cache(model.to_tokens("1011"))
    stack = cache.decompose_resid()
    attributions = cache.logit_attrs(stack, tokens=torch.tensor([0]))
    assert attributions.shape[0] == stack.shape[0]  # direct logit attribution per component
    with pytest.raises(el.ExactLensError, match="readout"):
        model.tokens_to_residual_directions(3)


def test_help_of_train_lists_the_training_keywords():
    """``help(el.train)``: the package's text and the verb's, whose training options (flags on the command line,
    ``**options`` in Python) are each listed with their meaning."""
    import pydoc

    import exactlens as el
    from exactlens.train.options import OPTION_DOCS

    text = pydoc.render_doc(el.train, renderer=pydoc.plaintext)
    assert "Training comparable models" in text and "**options" in text
    missing = [name for name in OPTION_DOCS if f"{name}: " not in text]
    assert not missing, missing

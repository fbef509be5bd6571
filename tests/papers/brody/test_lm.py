"""Tests for the stdlib docstring corpus, the Brody Tables 1-2 character LM and the MAJORITY runs."""

from __future__ import annotations

import inspect
import json

import numpy as np
import pytest
import torch

from exactlens.analysis.hull import selectable_keys
from exactlens.errors import ExactLensError
from exactlens.model import ExactTransformer
from exactlens.papers.brody.corpus import char_corpus, stdlib_docstrings
from exactlens.papers.brody.lm import (
    LN_VARIANTS,
    as_float64,
    brody_tables,
    lm_config,
    lm_unselectable,
    quick_settings,
    train_char_lm,
    validation_windows,
)
from exactlens.papers.brody.majority_training import steps_to


@pytest.fixture(scope="module")
def corpus():
    return char_corpus()


@pytest.fixture(scope="module")
def tables(corpus):
    settings = quick_settings(steps=20, eval_every=10, n_ctx=24, batch_size=8)
    return brody_tables(("full", "no_scale", "none"), settings=settings, sequences=3, corpus=corpus)


# ---------------------------------------------------------------------------- corpus


def test_corpus_is_deterministic_and_holds_real_docstrings(corpus):
    again = char_corpus()
    assert again.sha256 == corpus.sha256 and torch.equal(again.ids, corpus.ids)
    # Independent of the collector: a docstring read straight from the module is in the text.
    assert inspect.cleandoc(json.dumps.__doc__) in corpus.text
    assert inspect.cleandoc(textwrap_doc()) in corpus.text
    assert len(corpus.text) > 100_000
    assert list(corpus.vocab) == sorted(set(corpus.text))
    assert corpus.decode(corpus.ids[:500]) == corpus.text[:500]
    assert torch.equal(corpus.encode("the json"), corpus.ids.new_tensor([corpus.vocab.index(c) for c in "the json"]))
    assert corpus.n_train + corpus.validation_ids.numel() == len(corpus.text)
    assert 0.85 < corpus.n_train / len(corpus.text) < 0.95
    info = corpus.info()
    assert json.loads(json.dumps(info)) == info and info["vocab_size"] == len(corpus.vocab)


def textwrap_doc() -> str:
    import textwrap

    return textwrap.dedent.__doc__


def test_corpus_rejects_bad_input(corpus):
    with pytest.raises(ExactLensError, match="cannot be imported"):
        stdlib_docstrings(["no_such_module_xyz"])
    with pytest.raises(ExactLensError, match="non-empty sequence"):
        stdlib_docstrings("json")
    with pytest.raises(ExactLensError, match="validation_fraction"):
        char_corpus(validation_fraction=1.0)
    with pytest.raises(ExactLensError, match="not in the corpus vocabulary"):
        corpus.encode("caf\u00e9\u4e2d")
    with pytest.raises(ExactLensError, match="validation text has"):
        validation_windows(corpus, 10_000, 64)


# ---------------------------------------------------------------------------- model and training


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_attention_input_geometry_of_each_variant(corpus, dtype):
    """Full LN puts every attention input on the sphere of radius sqrt(d) in 1-perp; no_scale only centres."""
    settings = quick_settings(dtype=dtype)
    tokens = validation_windows(corpus, 2, settings.n_ctx)[:, :-1]
    tol = 1e-5 if dtype == "float32" else 1e-10
    for variant in LN_VARIANTS:
        cfg = lm_config(len(corpus.vocab), variant, settings)
        assert cfg.attention_mask == "causal" and cfg.learned_positions and cfg.readout == "per_position"
        model = ExactTransformer(cfg).init_weights(seed=3).eval()
        _, cache = model.run_with_cache(tokens)
        for layer in range(cfg.n_layers):
            x = cache[f"blocks.{layer}.hook_resid_pre"].double()
            if variant == "none":
                assert f"blocks.{layer}.ln1.hook_normalized" not in cache
                continue
            y = cache[f"blocks.{layer}.ln1.hook_normalized"].double()
            centred = x - x.mean(-1, keepdim=True)
            assert y.sum(-1).abs().max() < tol * 10
            if variant == "full":  # radius sqrt(d) * sqrt(var / (var + eps)): eps shrinks low-variance rows
                var = centred.pow(2).mean(-1)
                radius = (cfg.d_model * var / (var + cfg.ln_eps)).sqrt()
                assert torch.allclose(y.norm(dim=-1), radius, rtol=tol * 10)
            else:
                assert torch.allclose(y, centred, atol=tol * float(x.abs().max()))


def test_training_is_seeded_and_learns(corpus):
    settings = quick_settings(steps=30, eval_every=10, n_ctx=16, batch_size=8)
    a = train_char_lm(corpus, "full", seed=1, settings=settings)
    b = train_char_lm(corpus, "full", seed=1, settings=settings)
    c = train_char_lm(corpus, "full", seed=2, settings=quick_settings(steps=10, eval_every=10, n_ctx=16, batch_size=8))
    strip = [{k: v for k, v in r.items() if k != "seconds"} for r in a.history]
    assert strip == [{k: v for k, v in r.items() if k != "seconds"} for r in b.history]
    assert a.history[0]["val_bits_per_char"] != c.history[0]["val_bits_per_char"]
    uniform = np.log2(len(corpus.vocab))
    assert a.history[-1]["val_bits_per_char"] < uniform - 1.0  # learned more than the uniform guess
    assert [r["step"] for r in a.history] == [10, 20, 30]


def test_float64_copy_computes_the_same_function(corpus):
    settings = quick_settings(steps=5)
    run = train_char_lm(corpus, "no_scale", seed=0, settings=settings)
    copy = as_float64(run.model)
    assert copy.cfg.dtype == "float64" and run.model.cfg.dtype == "float32" and copy.cfg.ln_scale is False
    tokens = validation_windows(corpus, 2, settings.n_ctx)[:, :-1]
    with torch.no_grad():
        assert torch.allclose(copy(tokens).float(), run.model(tokens), atol=1e-4)
    assert as_float64(copy) is copy


# ---------------------------------------------------------------------------- Tables 1-2


def test_full_ln_leaves_no_unselectable_attention_input(tables):
    """After full LN the keys lie on a sphere: distinct ones are all vertices of their hull (Theorem 1)."""
    full = next(r for r in tables["runs"] if r["variant"] == "full")
    for layer in full["hull"]["layers"]:
        assert layer["after_ln"]["n_unselectable_per_sequence"] == [0, 0, 0]
    assert full["percent"]["after_ln"] == [0.0] * 4


def test_projection_never_frees_a_key(tables, corpus):
    """no_scale: LN is x - mean x, a linear map, so a key in the hull of the others stays there: per
    sequence, after-LN counts >= before-LN counts; checked against a direct hull call on the activations."""
    run = next(r for r in tables["runs"] if r["variant"] == "no_scale")
    for layer in run["hull"]["layers"]:
        before = layer["before_ln"]["n_unselectable_per_sequence"]
        after = layer["after_ln"]["n_unselectable_per_sequence"]
        assert all(a >= b for a, b in zip(after, before, strict=True))
    assert run["percent"]["attention_input"] == run["percent"]["after_ln"]
    none = next(r for r in tables["runs"] if r["variant"] == "none")
    assert none["percent"]["after_ln"] == [None] * 4
    assert none["percent"]["attention_input"] == none["percent"]["before_ln"]


def test_lm_unselectable_matches_direct_hull_calls(corpus):
    settings = quick_settings(steps=5)
    run = train_char_lm(corpus, "no_scale", seed=0, settings=settings)
    res = lm_unselectable(run.model, corpus, sequences=2, n_positions=20)
    tokens = validation_windows(corpus, 2, 20)[:, :-1]
    _, cache = as_float64(run.model).run_with_cache(tokens)
    for layer in range(settings.n_layers):
        y = cache[f"blocks.{layer}.ln1.hook_normalized"].numpy()
        direct = [selectable_keys(y[s]).n_unselectable for s in range(2)]
        assert res["layers"][layer]["after_ln"]["n_unselectable_per_sequence"] == direct
    with pytest.raises(ExactLensError, match="n_positions"):
        lm_unselectable(run.model, corpus, n_positions=settings.n_ctx + 1)


def test_tables_result_is_json_ready(tables):
    assert json.loads(json.dumps(tables)) == tables
    assert tables["paper"]["table1"]["no_scale_attention_input"] == [51.0, 32.2, 34.7, 36.8]
    for run in tables["runs"]:
        assert len(run["percent"]["per_head"]) == 4 and all(len(h) == 2 for h in run["percent"]["per_head"])
        assert all(0.0 <= v <= 100.0 for layer in run["percent"]["per_head"] for v in layer)


def test_bad_settings_are_rejected(corpus):
    with pytest.raises(ExactLensError, match="variant"):
        lm_config(10, "rms")
    with pytest.raises(ExactLensError, match="steps"):
        quick_settings(steps=0)
    with pytest.raises(ExactLensError, match="dtype"):
        quick_settings(dtype="float16")
    with pytest.raises(ExactLensError, match="variants"):
        brody_tables(("full", "bogus"), corpus=corpus)


# ---------------------------------------------------------------------------- MAJORITY helpers


def test_steps_to_threshold():
    history = [
        {"step": 1, "test_accuracy": None},
        {"step": 2, "test_accuracy": 0.4},
        {"step": 5, "test_accuracy": 0.95},
        {"step": 9, "test_accuracy": 1.0},
    ]
    assert steps_to(history, 0.4) == 2
    assert steps_to(history, 0.9) == 5
    assert steps_to(history, 1.0) == 9
    assert steps_to(history[:3], 1.0) is None

"""The evaluation's cheap path (issue 44): the last layer at the readout position only and the attention-to-first
metric from each layer's queries and keys (Attention.pattern_rows) instead of hooked [query, key] patterns, which
forced the unfused attention. It must give what the full, pattern-hooked evaluation gives, to float32 rounding;
float64 keeps the old path (its bits: tests/train/test_bit_identical.py)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from exactlens.errors import ExactLensError
from exactlens.model.components import visible_keys
from exactlens.train import train_many
from exactlens.train.data import sample_batch
from exactlens.train.evaluation import evaluate, readout_only_for
from exactlens.train.loop import new_model, seed_generators
from exactlens.train.metrics import ATTENTION_TO_FIRST, Metric
from exactlens.train.presets import get_preset

# the evaluation as it was: every position of the last layer, the whole patterns hooked
OLD = dataclasses.replace(ATTENTION_TO_FIRST, hooks=ATTENTION_TO_FIRST.float64_hooks, query_positions=None)


@pytest.fixture(autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _model(task: str, seed: int = 0, fused: bool = True, **options):
    spec = get_preset(task).spec(dict(train_length=10, epochs=1, **options))
    model = new_model(spec, seed_generators(seed)["init"]).set_fused(fused)
    return spec, model


def _close(new: dict, old: dict) -> None:
    assert new["accuracy"] == old["accuracy"]
    assert new["loss_bits"] == pytest.approx(old["loss_bits"], rel=1e-5)
    assert new["test_attn_first"] == pytest.approx(old["test_attn_first"], rel=1e-4, abs=1e-7)


@pytest.mark.parametrize("task,options,length", [
    ("first", {}, (300, 300)),
    ("first", {"scaled": True}, (300, 300)),
    ("first", {}, (5, 40)),  # padded words of several lengths
    ("parity", {}, (2, 30)),
    ("one", {}, (20, 20)),
])
@pytest.mark.parametrize("fused", [True, False])
def test_cheap_evaluation_equals_the_full_hooked_one(task, options, length, fused):
    spec, model = _model(task, fused=fused, **options)
    assert readout_only_for(model, spec.metrics)
    batch = sample_batch(spec.task, 40, length, seed_generators(3)["test"], held_out=True)
    _close(evaluate(model, batch, spec.task, spec.metrics), evaluate(model, batch, spec.task, (OLD,)))


def test_a_trained_runs_final_test_is_the_old_evaluation_of_its_model_and_words():
    """Stacked float32 runs: each run's final record against the full, hooked evaluation of its trained model
    on its own test words (the run's test stream, drawn once)."""
    options = dict(epochs=4, train_length=12, test_length=200, test_strings=30, eval_every=0)
    runs = train_many("first", [0, 1, 2], **options)
    spec = get_preset("first").spec(options)
    for run in runs:
        words = sample_batch(spec.task, 30, (200, 200), seed_generators(run.seed)["test"], held_out=True)
        old = evaluate(run.model.set_fused(True), words, spec.task, (OLD,))
        final = run.final
        _close({"accuracy": final["test_accuracy"], "loss_bits": final["test_loss_bits"],
                "test_attn_first": final["test_attn_first"]}, old)


def test_float64_keeps_the_hooked_patterns_and_the_full_forward():
    spec, model = _model("first", dtype="float64")
    assert not readout_only_for(model, spec.metrics)
    assert ATTENTION_TO_FIRST.hooks_for(model)("blocks.0.attn.hook_pattern")
    assert not ATTENTION_TO_FIRST.hooks_for(model)("blocks.0.attn.hook_q")
    batch = sample_batch(spec.task, 10, (12, 12), seed_generators(1)["test"], held_out=True)
    assert evaluate(model, batch, spec.task, spec.metrics) == evaluate(model, batch, spec.task, (OLD,))


def test_readout_only_only_where_every_metric_reads_the_readout_row():
    _, model = _model("first")
    anything = Metric(("test_x",), lambda name: False, lambda m, b, c: {"test_x": 0.0})
    assert readout_only_for(model, ())
    assert not readout_only_for(model, (anything,))  # query_positions None: any row
    assert not readout_only_for(model, (dataclasses.replace(anything, query_positions=(0, 3)),))
    _, majority = _model("majority")
    assert majority.cfg.readout_position == 0 and readout_only_for(majority, ())
    model.cfg.readout_position = -1  # counted from each word's end: with metrics, no
    assert readout_only_for(model, ()) and not readout_only_for(model, (ATTENTION_TO_FIRST,))


@pytest.mark.parametrize("mask", ["none", "causal"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_pattern_rows_are_the_hooked_patterns_rows(mask, dtype):
    spec, model = _model("first", dtype="float64" if dtype == torch.float64 else "float32", fused=False)
    for block in model.blocks:
        block.attn.cfg.attention_mask = mask if isinstance(block.attn.cfg.attention_mask, str) else [mask] * 2
    batch = sample_batch(spec.task, 8, (3, 15), seed_generators(2)["test"], held_out=True)
    _, cache = model.run_with_cache(batch.tokens, batch.n_positions)
    n_pos = batch.tokens.shape[1]
    for layer, block in enumerate(model.blocks):
        allowed = visible_keys(mask, n_pos, batch.n_positions, True)
        rows = block.attn.pattern_rows(cache[f"blocks.{layer}.attn.hook_q"][:, 2:5],
                                       cache[f"blocks.{layer}.attn.hook_k"], batch.n_positions, allowed[:, :, 2:5])
        full = cache[f"blocks.{layer}.attn.hook_pattern"][:, :, 2:5]
        tol = 1e-12 if dtype == torch.float64 else 1e-6
        torch.testing.assert_close(rows, full, rtol=tol, atol=tol)


def test_attention_to_first_refuses_a_readout_row_other_than_0():
    spec, model = _model("first")
    batch = sample_batch(spec.task, 4, (6, 6), seed_generators(0)["test"], held_out=True)
    model.cfg.readout_position = 2
    _, cache = model.run_with_cache(batch.tokens, batch.n_positions, readout_only=True)
    with pytest.raises(ExactLensError, match="reads query position 0.*readout position 2"):
        ATTENTION_TO_FIRST.compute(model, batch, {k: v for k, v in cache.items() if k.endswith(("_q", "_k"))})

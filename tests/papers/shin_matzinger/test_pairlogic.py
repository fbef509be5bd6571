"""Pair-logic analysis (signatures, ablations, verdicts), §4 training and §3 stationary points, CLI."""

from __future__ import annotations

import json

import pytest
import torch

from exactlens.cli import main
from exactlens.errors import ExactLensError
from exactlens.model import ExactConfig, ExactTransformer
from exactlens.model.stacked import StackedRuns
from exactlens.papers.shin_matzinger import constructions as sm
from exactlens.papers.shin_matzinger import pairlogic as pl
from exactlens.papers.shin_matzinger import training as tsm
from exactlens.papers.shin_matzinger.task import PairGenerator, make_q
from exactlens.train.loop import new_model

TINY = {"categories": 3, "positions": 6, "batch": 100, "iterations": 3, "test_batch": 50}


def test_verdicts_of_the_constructions() -> None:
    q = make_q("normal", 5, 3)
    results = {
        name: pl.analyse(b(q, 8, dtype="float64"), q, batch=200)
        for name, b in [("1", sm.build_solution1), ("2", sm.build_solution2), ("3", sm.build_solution3)]
    }
    assert results["1"]["verdict"] == "ffn" and results["2"]["verdict"] == "attention"
    assert results["3"]["verdict"] == "attention"
    assert results["2"]["signatures"]["qk_category_q"] == pytest.approx(1.0)
    assert results["3"]["signatures"]["ov_category_q"] == pytest.approx(1.0)
    assert results["1"]["signatures"]["qk_position_shift"] == pytest.approx(1.0)
    assert results["2"]["signatures"]["ov_position_shift"] == pytest.approx(1.0)
    for r in results.values():
        a = r["ablations"]
        assert a["mse"] < 1e-20 and a["mse_without_attention"] > 0.5 * a["target_variance"]
        assert a["mse_linear_ffn"] > 0.5 * a["target_variance"]  # every solution needs the ReLU


def test_causal_verdicts_of_the_constructions() -> None:
    """Interchanges at the attention output: solution 1 moves X_(i-1) (the FFN combines), solution 2's
    attention output carries the pair's value; solution 3 moves a re-encoding of X_(i-1) (q_true's row),
    causally the flow of solution 1 although q_true sits in its value map (causal.py's docstring)."""
    q = make_q("normal", 5, 3)
    out = {}
    for name, b in [("1", sm.build_solution1), ("2", sm.build_solution2), ("3", sm.build_solution3)]:
        for dtype in ("float32", "float64"):
            out[name, dtype] = pl.analyse(b(q, 8, dtype=dtype), q, batch=200)
    for dtype in ("float32", "float64"):
        one, two, three = (out[n, dtype]["interchanges"] for n in "123")
        assert one["iia_previous"] == 1.0 and one["iia_value"] < 0.3
        assert two["iia_value"] == 1.0 and two["iia_previous"] < 0.3
        assert three["iia_previous"] == 1.0 and three["iia_value"] < 0.3
        assert all(r["iia_value_at_ffn"] == 1.0 for r in (one, two, three))
        assert [out[n, dtype]["causal_verdict"] for n in "123"] == ["ffn", "attention", "ffn"]
    untrained = new_model(tsm.pair_preset(tsm.PairTrainConfig(categories=5, positions=8)).spec({}),
                          torch.Generator().manual_seed(0))
    assert pl.analyse(untrained.eval(), q, batch=200)["causal_verdict"] in ("unlearned", "mixed")


def test_causal_rule() -> None:
    from exactlens.papers.shin_matzinger.causal import causal_verdict

    assert causal_verdict({"iia_value": 0.95, "iia_previous": 0.1}) == "attention"
    assert causal_verdict({"iia_value": 0.2, "iia_previous": 0.95}) == "ffn"
    assert causal_verdict({"iia_value": 0.05, "iia_previous": 0.02}) == "unlearned"
    assert causal_verdict({"iia_value": 0.6, "iia_previous": 0.6}) == "mixed"
    assert causal_verdict({"iia_value": None, "iia_previous": None}) == "unlearned"


def test_verdict_rule_and_consensus() -> None:
    sig = {"qk_category_q": 0.1, "ov_category_q": 0.1}
    base = {"mse": 1.0, "mse_without_attention": 2.0, "mse_linear_ffn": 2.0, "target_variance": 3.0}
    assert pl.verdict(base, sig) == "ffn"
    assert pl.verdict({**base, "mse_without_attention": 1.1}, sig) == "unlearned"
    assert pl.verdict(base, {**sig, "ov_category_q": 0.6}) == "attention"
    assert pl.verdict(base, {**sig, "qk_category_q": 0.3}) == "mixed"
    assert pl.verdict({**base, "mse_linear_ffn": 1.0}, sig) == "mixed"
    assert pl.consensus(["ffn", "ffn", "attention"]) == "ffn"
    assert pl.consensus(["ffn", "attention"]) == "mixed"
    with pytest.raises(ExactLensError):
        pl.consensus([])


def test_analysis_rejects_other_architectures() -> None:
    model = ExactTransformer(ExactConfig(d_model=4, n_layers=1, d_vocab=3, d_mlp=2))
    with pytest.raises(ExactLensError, match="Shin & Matzinger architecture"):
        pl.analyse(model, make_q("normal", 3))


def test_stacked_runs_match_the_model() -> None:
    """The many-runs path of the loop (StackedRuns) is the model's own forward on these models too."""
    q = make_q("normal", 3)
    batch = PairGenerator(q, 6, seed=1).batch(20)
    for norm in ("post", "none"):
        for weighting in ("none", "softmax"):
            spec = tsm.pair_preset(
                tsm.PairTrainConfig(**TINY, normalization=norm, weighting=weighting, dtype="float64")
            ).spec({})
            models = [new_model(spec, torch.Generator().manual_seed(s)) for s in (1, 2)]
            for model in models:
                with torch.no_grad():
                    model.embed.W_E.add_(0.3)  # not one-hot: nothing may assume it
            stacked = StackedRuns(models)
            tokens = batch.categories[None].expand(2, -1, -1)
            n_positions = torch.full(tokens.shape[:2], tokens.shape[2])
            got = stacked.readout(tokens, n_positions)
            for r, model in enumerate(models):
                assert torch.allclose(got[r], model.eval().readout(batch.categories), atol=1e-12, rtol=0)


def test_training_is_seeded_and_keeps_the_constraints() -> None:
    a = tsm.train_pairs(tsm.PairTrainConfig(**TINY, system="solution2", seed=1))
    b = tsm.train_pairs(tsm.PairTrainConfig(**TINY, system="solution2", seed=1))
    assert a.train_mse == b.train_mse and a.history == b.history
    assert a.history[0]["iteration"] == 0 and a.history[-1]["iteration"] == TINY["iterations"]
    assert len(a.history) >= TINY["iterations"] + 1
    masks = tsm.allowed_weights("solution2", 3, 6, a.config.hidden)
    attn = a.model.blocks[0].attn
    for name in ("W_Q", "W_K", "W_V"):
        weight = getattr(attn, name)[0]
        assert torch.all(weight[~masks[name]] == 0) and weight[masks[name]].abs().sum() > 0
    assert torch.all(a.model.blocks[0].mlp.W_in[~masks["W_in"]] == 0)
    assert torch.all(a.model.blocks[0].mlp.W_out[:, 1:] == 0)
    assert torch.equal(attn.W_O[0], torch.eye(9))
    lean = tsm.train_pairs(tsm.PairTrainConfig(**TINY, flavour="solution3", lean=10.0))
    free = tsm.train_pairs(tsm.PairTrainConfig(**TINY))
    def penalty(run):
        params = {name: p.detach() for name, p in run.model.named_parameters()}
        return float(tsm.lean_penalty(params, "solution3", 3, 6, run.config.hidden))

    assert penalty(lean) < penalty(free)
    with pytest.raises(ExactLensError, match="flavour"):
        tsm.PairTrainConfig(system="solution1", flavour="solution2")


def test_degenerate_points_are_stationary() -> None:
    """§3: without softmax, q = k = 0 (or q = v = 0) leaves q, k, v with zero gradient, with or
    without the normalization layer; with softmax the weights are uniform and v still moves."""
    for norm in ("none", "post"):
        cfg = tsm.PairTrainConfig(**TINY, normalization=norm)
        assert min(tsm.attention_gradients(cfg)[x] for x in "QKV") > 0
        for point in tsm.DEGENERATE_POINTS:
            grads = tsm.attention_gradients(cfg, point)
            assert grads["Q"] == grads["K"] == grads["V"] == 0.0 and grads["W_in"] > 0
    soft = tsm.attention_gradients(tsm.PairTrainConfig(**TINY, weighting="softmax"), "q=k=0")
    assert soft["Q"] == soft["K"] == 0.0 and soft["V"] > 0


def test_cli_pairlogic_json(capsys) -> None:
    assert (
        main(
            [
                "pairlogic",
                "--categories",
                "3",
                "--positions",
                "5",
                "--iterations",
                "2",
                "--batch",
                "60",
                "--seeds",
                "2",
                "--json",
            ]
        )
        == 0
    )
    out = json.loads(capsys.readouterr().out)
    assert len(out["runs"]) == 2 and out["consensus"] in pl.VERDICTS
    assert {"ablations", "signatures", "verdict"} <= set(out["runs"][0])
    assert main(["pairlogic", "--check", "sm-solution3", "--categories", "4", "--positions", "6", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["exact"] is True
    assert main(["pairlogic", "--check", "parity", "--json"]) == 2
    assert main(["verify", "sm-solution1"]) == 0  # default lengths start at the construction's shortest (2)


def test_grid_and_summary(tmp_path) -> None:
    grid = (("combined", "unconstrained"), ("solution3", "unconstrained"))
    records = tsm.train_grid(seeds=2, grid=grid, out=str(tmp_path), **{**TINY, "iterations": 1})
    assert len(records) == 4 and all("checkpoint" in r for r in records)
    summary = pl.summarize_runs(records, batch=40)
    assert set(summary) == {"combined/unconstrained", "system/solution3"}
    for row in summary.values():
        assert row["runs"] == 2 and sum(row["verdicts"].values()) == 2
        assert row["test_mse_min"] <= row["test_mse_mean"] <= row["test_mse_max"]

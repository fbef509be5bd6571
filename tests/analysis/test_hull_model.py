"""Tests for exactlens.analysis.hull.model, hull.random and the `hull` verb (Brody et al. 2023)."""

from __future__ import annotations

import argparse
import json

import numpy as np
import pytest
import torch

from exactlens.analysis.hull import layer_norm_geometric, selectable_keys
from exactlens.analysis.hull.model import hull_report, query_space, unselectable_by_layer
from exactlens.analysis.hull.random import random_keys
from exactlens.cli import build_parser
from exactlens.errors import ExactLensError
from exactlens.model import ExactConfig, ExactTransformer
from exactlens.model.export import transformer_lens_major
from exactlens.verbs.hull import format_hull_text

N_CTX = 12


def small_model(normalization: str = "pre", seed: int = 0) -> ExactTransformer:
    """Random pre-LN model, d_model 8, whose layer-0 residuals lie in a 2-D subspace.

    Every embedding and position row is a combination of two fixed vectors u, v, so the 12 points
    entering layer 0 are coplanar (many lie inside the hull of the others), while after LN they lie
    on a circle (all selectable when distinct).
    """
    cfg = ExactConfig(d_model=8, n_layers=2, d_vocab=5, n_heads=2, d_mlp=8, normalization=normalization,
                      positional_features=("learned",), n_ctx=N_CTX, dtype="float64")
    model = ExactTransformer(cfg).init_weights(seed=seed)
    gen = torch.Generator().manual_seed(seed + 1)
    uv = torch.randn(2, 8, generator=gen, dtype=torch.float64)
    with torch.no_grad():
        model.embed.W_E.copy_(0.3 * torch.randn(5, 2, generator=gen, dtype=torch.float64) @ uv)
        model.pos_embed.W_pos.copy_(torch.randn(N_CTX, 2, generator=gen, dtype=torch.float64) @ uv)
    return model.eval()


def batch(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, 5, (4, N_CTX), generator=gen)
    return tokens, torch.tensor([N_CTX, 9, 7, N_CTX])


def direct_fractions(vectors: torch.Tensor, n_positions: torch.Tensor) -> list[float]:
    return [selectable_keys(vectors[s, :n]).fraction_unselectable for s, n in enumerate(n_positions.tolist())]


def test_per_layer_fractions_match_a_direct_computation():
    model = small_model()
    tokens, n_pos = batch()
    res = unselectable_by_layer(model, tokens, n_positions=n_pos)
    _, cache = model.run_with_cache(tokens, n_positions=n_pos)
    assert res["n_sequences"] == 4 and res["n_positions"] == n_pos.tolist()
    assert res["attention_input"] == "after_ln" and res["model"]["normalization"] == "pre"
    assert json.loads(json.dumps(res)) == res  # JSON-ready
    for layer in range(2):
        entry = res["layers"][layer]
        assert entry["layer"] == layer and entry["attention_input"] == "after_ln"
        for field, hook in (("before_ln", f"blocks.{layer}.hook_resid_pre"),
                            ("after_ln", f"blocks.{layer}.ln1.hook_normalized")):
            expected = direct_fractions(cache[hook], n_pos)
            assert entry[field]["hook"] == hook
            assert entry[field]["fraction_per_sequence"] == pytest.approx(expected, abs=0)
            assert entry[field]["fraction_unselectable"] == pytest.approx(np.mean(expected))
        # W_Q [8, 4] has full rank 4 = d_head: every query direction is reachable, so per head the
        # answer is selectable_keys on the raw keys.
        for head in range(2):
            h = entry["per_head"][head]
            assert h["query_rank"] == 4 and not h["query_bias_outside_span"]
            expected = direct_fractions(cache[f"blocks.{layer}.attn.hook_k"][:, :, head], n_pos)
            assert h["fraction_per_sequence"] == pytest.approx(expected, abs=0)
    # Layer 0 sees coplanar points: Brody's problem is there before LN and gone after it.
    assert res["layers"][0]["before_ln"]["fraction_unselectable"] > 0.2


def test_after_ln_vectors_are_orthogonal_to_ones_and_all_selectable():
    model = small_model()
    tokens, n_pos = batch(1)
    _, cache = model.run_with_cache(tokens, n_positions=n_pos)
    for layer in range(2):
        normed = cache[f"blocks.{layer}.ln1.hook_normalized"]
        assert normed.sum(-1).abs().max() < 1e-12  # the hyperplane orthogonal to 1
    res = unselectable_by_layer(model, tokens, n_positions=n_pos)
    for entry in res["layers"]:
        assert entry["after_ln"]["fraction_unselectable"] == 0.0  # distinct points on a sphere


def test_layer_norm_makes_generic_random_keys_selectable():
    keys = np.random.default_rng(3).standard_normal((30, 3))
    assert selectable_keys(keys).n_unselectable > 0  # low d, no LN: some keys inside the hull
    assert selectable_keys(layer_norm_geometric(keys)).n_unselectable == 0  # exact at tol 1e-9


def test_rank_one_query_selects_at_most_the_two_extremes():
    model = small_model()
    gen = torch.Generator().manual_seed(5)
    a = torch.randn(8, 1, generator=gen, dtype=torch.float64)
    direction = torch.randn(1, 4, generator=gen, dtype=torch.float64)
    with torch.no_grad():
        model.blocks[0].attn.W_Q[0] = a @ direction  # rank 1
        model.blocks[0].attn.W_Q[1] = 0.0  # no query at all
        model.blocks[1].attn.W_Q[1] = a @ direction
        model.blocks[1].attn.b_Q[1] = torch.randn(4, generator=gen, dtype=torch.float64)  # outside the span
    tokens, n_pos = batch(2)
    res = unselectable_by_layer(model, tokens, n_positions=n_pos)
    _, cache = model.run_with_cache(tokens, n_positions=n_pos)
    h0, h1 = res["layers"][0]["per_head"]
    assert h0["query_rank"] == 1 and h0["dim"] == 1
    assert max(h0["n_selectable_per_sequence"]) <= 2
    unit = (direction / direction.norm()).reshape(-1)
    for s, n in enumerate(n_pos.tolist()):
        t = (cache["blocks.0.attn.hook_k"][s, :n, 0] @ unit).numpy()
        extremes = int(np.sum(t == t.max()) == 1) + int(np.sum(t == t.min()) == 1)
        assert h0["n_selectable_per_sequence"][s] == extremes == 2  # on a line: only the two ends
    assert h1["query_rank"] == 0 and h1["fraction_unselectable"] == 1.0  # every score ties
    g1 = res["layers"][1]["per_head"][1]
    assert g1["query_rank"] == 2 and g1["query_bias_outside_span"]


def test_query_space_numerical_rank_in_float32():
    w = (torch.randn(8, 1) @ torch.randn(1, 4)).to(torch.float32)
    basis, outside = query_space(w)
    assert basis.shape == (1, 4) and not outside
    basis, outside = query_space(w, torch.zeros(4))
    assert basis.shape == (1, 4) and not outside
    assert query_space(torch.zeros(8, 4))[0].shape == (0, 4)


@pytest.mark.export
@pytest.mark.skipif(transformer_lens_major() < 4, reason="TransformerBridge needs TransformerLens >= 4")
def test_bridge_export_gives_the_same_fractions():
    model = small_model()
    bridge = model.to_bridge()
    tokens = batch(4)[0][:3, :10]
    ours = unselectable_by_layer(model, tokens)
    theirs = unselectable_by_layer(bridge, tokens)
    assert theirs["model"]["class"] != "ExactTransformer" and theirs["attention_input"] == "after_ln"
    for a, b in zip(ours["layers"], theirs["layers"], strict=True):
        for field in ("before_ln", "after_ln"):
            assert b[field]["fraction_per_sequence"] == pytest.approx(a[field]["fraction_per_sequence"])
        for ha, hb in zip(a["per_head"], b["per_head"], strict=True):
            assert hb["query_rank"] == ha["query_rank"]
            assert hb["fraction_per_sequence"] == pytest.approx(ha["fraction_per_sequence"])
    with pytest.raises(ExactLensError, match="padded"):
        unselectable_by_layer(bridge, tokens, n_positions=torch.tensor([10, 8, 10]))


def test_random_keys_grid_trends():
    data = random_keys(ns=(4, 16, 64), ds=(3, 8), trials=10, seed=0)
    raw, ln = np.array(data["without_ln"]), np.array(data["with_ln"])
    assert raw.shape == ln.shape == (3, 2)
    assert np.all(np.diff(raw, axis=0) >= 0)  # grows with n
    assert np.all(np.diff(raw, axis=1) <= 0)  # shrinks with d
    assert raw[-1, 0] > raw[0, 0] and raw[-1, 0] > raw[-1, 1] and raw[-1, 0] > 0.5
    assert np.all(ln == 0.0)  # with LN (d >= 3) no unselectable key at relative tolerance 1e-9
    # d = 2: LN maps every key to one of two points, so almost all keys are duplicates.
    assert random_keys(ns=(8,), ds=(2,), trials=3)["with_ln"][0][0] > 0.9
    assert "without LN" in format_hull_text(random_keys(ns=(4, 8), ds=(3, 4), trials=2))


def hull_args(argv: list[str]) -> argparse.Namespace:
    return build_parser().parse_args(argv)


def test_cli_prints_one_json_object(capsys):
    args = hull_args(["hull", "first", "--json", "--seed", "1"])
    args.func(args)
    out = capsys.readouterr().out
    assert out.count("\n") == 1
    obj = json.loads(out)
    assert obj["target"]["name"] == "first" and obj["target"]["seed"] == 1
    assert obj["attention_input"] == "before_ln" and len(obj["layers"]) == 2
    assert all(entry["after_ln"] is None for entry in obj["layers"])
    args = hull_args(["hull", "first"])
    args.func(args)
    assert "before_ln" in capsys.readouterr().out
    args = hull_args(["hull", "no-such-construction", "--json"])
    with pytest.raises(ExactLensError, match="neither a checkpoint directory nor a construction"):
        args.func(args)
    with pytest.raises(ExactLensError, match="--tol"):
        args = hull_args(["hull", "first", "--tol", "2"])
        args.func(args)


def test_hull_report_on_a_checkpoint(tmp_path):
    small_model(normalization="none").save(tmp_path / "ckpt")
    res = hull_report(tmp_path / "ckpt", seed=3)
    assert res["target"]["kind"] == "checkpoint" and res["target"]["positions"] == [4, 8, N_CTX]
    assert res["n_positions"] == [4] * 4 + [8] * 4 + [N_CTX] * 4
    assert res["attention_input"] == "before_ln" and res["layers"][0]["after_ln"] is None


def test_default_lengths_start_at_a_constructions_shortest_word():
    """majority-per-position's words lead by 6, so they are at least 6 long: the default lengths (2, 4, 8)
    are raised to 6, 8; explicit lengths below it are refused by the task, naming the minimum."""
    result = hull_report("majority-per-position")
    assert result["target"]["word_lengths"] == [6, 8]
    with pytest.raises(ExactLensError, match="minimum 6"):
        hull_report("majority-per-position", lengths=[2])


def test_a_checkpoint_that_records_its_task_is_read_on_its_words(tmp_path):
    """A trained checkpoint's hull runs on its task's words as the model reads them (as a model object's
    does), at the positions asked for; positions no word fills are refused, naming the range."""
    from exactlens import tasks
    from exactlens.train import train

    run = train("first", epochs=1, strings_per_epoch=10, test_strings=10, out=tmp_path / "run")
    task = tasks.of_model(run.model)
    res = hull_report(run.checkpoint, seed=1)
    assert res["target"]["tokens"].startswith("words of task 'first'")
    assert res["target"]["positions"] == [4, 8, 16]
    assert res["n_positions"] == [4] * 4 + [8] * 4 + [16] * 4
    one = hull_report(run.checkpoint, seed=1, lengths=[5])
    assert one["n_positions"] == [5] * 4 and one["target"]["positions"] == [5]
    with pytest.raises(ExactLensError, match="hold no word of task 'first'"):
        hull_report(run.checkpoint, lengths=[task.n_specials])

"""Brody et al. Fig. 2-3 at the paper's shape: the margin task, the preset's parameters, the
per-position query angle, the stacked variant runs, the benchmark's --quick run, and the Tables 1-2
statistics over seeds."""

from __future__ import annotations

import importlib.util
import json
import math
import statistics
from collections import Counter
from pathlib import Path

import pytest
import torch

from exactlens import tasks
from exactlens.errors import ExactLensError
from exactlens.papers.brody.lm import table_cells
from exactlens.papers.brody.majority import FROZEN_AT_IDENTITY, PAPER_PARAMETERS, MarginMajority
from exactlens.papers.brody.majority_training import (
    QUICK_SETTINGS,
    first_step_at,
    merge_runs,
    paper_variant,
    summarize_paper_majority,
)
from exactlens.papers.brody.report import load_result
from exactlens.plugins import load_plugins
from exactlens.train import train_many
from exactlens.train.data import sample_batch
from exactlens.train.presets import get_preset

ROOT = Path(__file__).resolve().parents[3]
TINY = dict(epochs=4, strings_per_epoch=40, batch_size=20, test_strings=30, eval_every=2, lr=1e-2)


def _reference_margin(word: list[int]) -> tuple[int, int]:
    """(majority class, top count - second count) in plain Python."""
    counts = Counter(word)
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    second = ranked[1][1] if len(ranked) > 1 else 0
    return ranked[0][0], ranked[0][1] - second


@pytest.mark.parametrize(("k", "length", "margin"), [(20, 50, 6), (3, 6, 6), (4, 9, 1), (2, 7, 3)])
def test_margin_sampler_keeps_a_clear_majority(k, length, margin):
    task = MarginMajority(k, margin)
    words = task.sample(length, 400, torch.Generator().manual_seed(k + length))
    assert words.shape == (400, length) and int(words.min()) >= 0 and int(words.max()) < k
    targets = task.targets(words)
    for row, target in zip(words.tolist(), targets.tolist(), strict=True):
        cls, gap = _reference_margin(row)
        assert gap >= margin
        assert target == [cls] * length  # the majority at every position


def test_margin_sampler_leaves_clear_words_alone_and_varies():
    task = MarginMajority(20, 6)
    gen = torch.Generator().manual_seed(0)
    words = task.sample(50, 2000, gen)
    margins = task.margins(words)
    assert int(margins.min()) >= 6 and (margins > 6).any()  # not all pushed to exactly 6
    assert len({tuple(w) for w in words.tolist()}) == 2000
    assert set(task.targets(words)[:, 0].tolist()) == set(range(20))  # every class wins sometimes


def test_margin_task_is_registered_without_cls_and_rejects_bad_input():
    load_plugins()
    task = tasks.get("majority-margin", num_classes=5, min_margin=2)
    assert task.vocab == ("a", "b", "c", "d", "e") and task.kind == "prediction"
    assert task.params == {"num_classes": 5, "min_margin": 2, "per_position": True}
    assert tasks.from_spec(task.spec()).params == task.params
    with pytest.raises(ExactLensError, match="per_position"):
        MarginMajority(5, 2, per_position=False)
    with pytest.raises(ExactLensError, match="min_margin"):
        MarginMajority(20, 0)
    with pytest.raises(ExactLensError):
        MarginMajority(20, 6).sample(5, 3, torch.Generator())  # a word of 5 cannot lead by 6
    with pytest.raises(ExactLensError, match="min_margin"):
        train_many("majority-per-position", [0], train_length=4, test_length=4, min_margin=6, **TINY)


def test_preset_has_the_authors_shape():
    """584 (App. E.1) = embedding 160 + W_Q, W_K, W_V 192 + W_O and b_O 72 + LN2 16 + FFN 144; ours adds
    exactly the untied readout W_U (8 x 20 = 160)."""
    spec = get_preset("majority-per-position").spec({})
    cfg = spec.config
    assert (cfg.d_model, cfg.n_layers, cfg.n_heads, cfg.d_mlp, cfg.final_ln) == (8, 1, 1, 8, False)
    assert cfg.positional_features == () and spec.task.name == "majority-margin"
    opts = spec.options  # by default a CPU budget; the benchmark passes App. E.1's schedule explicitly
    assert (opts["batch_size"], opts["lr"], opts["lr_schedule"]) == (100, 1e-2, "constant")
    assert opts["epochs"] * opts["strings_per_epoch"] // opts["batch_size"] == 600
    runs = train_many("majority-per-position", [0], train_length=12, test_length=12, **TINY)
    model = runs[0].model
    trained = {n: p.numel() for n, p in model.named_parameters() if n not in FROZEN_AT_IDENTITY}
    assert sum(trained.values()) == PAPER_PARAMETERS + 160
    assert trained["unembed.W_U"] == 160 and trained["embed.W_E"] == 160


def test_frozen_parameters_stay_at_identity_through_training():
    runs = train_many("majority-per-position", [0, 1], train_length=12, test_length=12, **TINY)
    before = train_many("majority-per-position", [0, 1], train_length=12, test_length=12, **{**TINY, "lr": 1e-9})
    for run, ref in zip(runs, before, strict=True):
        params, moved = dict(run.model.named_parameters()), dict(ref.model.named_parameters())
        for name in FROZEN_AT_IDENTITY:
            expected = 1.0 if name.endswith("ln1.w") else 0.0
            assert torch.equal(params[name], torch.full_like(params[name], expected)), name
        assert not torch.allclose(params["blocks.0.attn.W_Q"], moved["blocks.0.attn.W_Q"])  # the rest trains


def _reference_angles(model, tokens: torch.Tensor) -> float:
    """Mean over words and positions of the angle between W_K q and the ones line, in float64 from the
    weights: LN (centred or not) without affine, q = n W_Q (b_Q frozen at 0)."""
    cfg = model.cfg
    x = model.embed.W_E.detach().double()[tokens]
    if cfg.ln_center:
        x = x - x.mean(-1, keepdim=True)
    n = x / torch.sqrt((x**2).mean(-1, keepdim=True) + cfg.ln_eps)
    wq, wk = model.blocks[0].attn.W_Q.detach().double()[0], model.blocks[0].attn.W_K.detach().double()[0]
    direction = (n @ wq) @ wk.T
    total, count = 0.0, 0
    for vec in direction.reshape(-1, cfg.d_model).tolist():
        cos = abs(sum(vec)) / (math.sqrt(sum(v * v for v in vec)) * math.sqrt(cfg.d_model))
        total += math.degrees(math.acos(min(cos, 1.0)))
        count += 1
    return total / count


@pytest.mark.parametrize("layer_norm", ["full", "scale_only"])
def test_query_angle_matches_a_reference(layer_norm):
    run = train_many("majority-per-position", [3], layer_norm=layer_norm, train_length=10, test_length=10,
                     **{**TINY, "test_strings": 25, "eval_every": 0})[0]
    spec = get_preset("majority-per-position").spec({"layer_norm": layer_norm, "train_length": 10, "test_length": 10})
    batch = sample_batch(spec.task, 25, (10, 10), torch.Generator().manual_seed(5), held_out=True)
    from exactlens.train.loop import evaluate

    measured = evaluate(run.model, batch, spec.task, spec.metrics)["test_query_angle_deg"]
    assert measured == pytest.approx(_reference_angles(run.model, batch.tokens), abs=1e-3)


def test_query_angle_is_zero_for_a_query_along_ones():
    run = train_many("majority-per-position", [0], train_length=10, test_length=10, **{**TINY, "epochs": 1})[0]
    attn = run.model.blocks[0].attn
    with torch.no_grad():  # q = n W_Q = (n . e1) e1, W_K maps e1 to the ones vector: W_K q is along 1
        attn.W_Q.zero_()
        attn.W_Q[0, 0, 0] = 1.0
        attn.W_K.zero_()
        attn.W_K[0, :, 0] = 1.0
    spec = get_preset("majority-per-position").spec({"train_length": 10, "test_length": 10})
    batch = sample_batch(spec.task, 20, (10, 10), torch.Generator().manual_seed(1), held_out=True)
    from exactlens.train.loop import evaluate

    assert evaluate(run.model, batch, spec.task, spec.metrics)["test_query_angle_deg"] < 0.1


def test_paper_variant_curves_and_bands():
    settings = dict(QUICK_SETTINGS, steps=4, eval_every=2, runs=3)
    v = paper_variant("full", settings)
    assert v["steps"] == [1, 2, 3, 4] and v["eval_steps"] == [2, 4] and v["seeds"] == [0, 1, 2]
    assert v["n_parameters"] == PAPER_PARAMETERS + 160
    for key in ("train_loss_nats", "test_accuracy", "query_angle_deg"):
        band, runs = v[key], [r[key] for r in v["per_run"]]
        for i, mean in enumerate(band["mean"]):
            column = [r[i] for r in runs]
            assert mean == pytest.approx(statistics.fmean(column))
            assert band["std"][i] == pytest.approx(statistics.stdev(column))
            assert band["min"][i] == min(column) and band["max"][i] == max(column)
    rows = summarize_paper_majority({"variants": [v]})
    assert rows[0]["final_test_accuracy"] == v["test_accuracy"]["mean"][-1] and rows[0]["runs"] == 3


def test_runs_of_other_seeds_merge_into_one_variant(tmp_path, capsys):
    """Seeds 0-1 and 2 trained apart and merged equal seeds 0-2 trained together (up to summation
    order); the benchmark's --combine merges per-variant files of one variant the same way."""
    settings = dict(QUICK_SETTINGS, steps=4, eval_every=2, runs=3)
    together = paper_variant("full", settings)
    apart = merge_runs([paper_variant("full", settings, seeds=[0, 1]), paper_variant("full", settings, seeds=[2])])
    assert apart["seeds"] == [0, 1, 2] and len(apart["per_run"]) == 3
    for key in ("train_loss_nats", "test_accuracy", "test_word_accuracy", "query_angle_deg"):
        for stat in ("mean", "std", "min", "max"):
            assert apart[key][stat] == pytest.approx(together[key][stat], abs=1e-5), (key, stat)
    with pytest.raises(ExactLensError, match="occurs twice"):
        merge_runs([together, together])
    with pytest.raises(ExactLensError, match="differ in 'layer_norm'"):
        merge_runs([together, paper_variant("scale_only", dict(settings, runs=1), seeds=[7])])
    bench = _benchmark("brody_majority")
    quick = ["--quick", "--variants", "full", "--runs", "1"]
    assert bench.main([*quick, "--out", str(tmp_path / "a")]) == 0
    assert bench.main([*quick, "--first-seed", "1", "--out", str(tmp_path / "b")]) == 0
    files = [str(tmp_path / d / "majority_full.json") for d in ("a", "b")]
    assert bench.main(["--combine", *files, "--out", str(tmp_path / "c")]) == 0
    data = json.loads((tmp_path / "c" / "majority.json").read_text())
    assert [v["seeds"] for v in data["variants"]] == [[0, 1]] and data["settings"]["runs"] == 2
    assert "2 runs per variant" in capsys.readouterr().out


def test_first_step_at():
    assert first_step_at([1, 2, 3], [0.2, None, 0.95], 0.9) == 3
    assert first_step_at([1, 2], [0.2, 0.3], 0.9) is None


def _benchmark(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_majority_benchmark_quick_writes_results(tmp_path, capsys):
    bench = _benchmark("brody_majority")
    assert bench.main(["--quick", "--out", str(tmp_path)]) == 0
    data = json.loads((tmp_path / "majority.json").read_text())
    assert [v["layer_norm"] for v in data["variants"]] == ["full", "scale_only"]
    assert data["settings"]["steps"] == QUICK_SETTINGS["steps"] and "--quick" in data["command"]
    assert (tmp_path / "majority.png").stat().st_size > 0
    out = capsys.readouterr().out
    assert "s per step" in out and "with projection" in out
    with pytest.raises(ExactLensError):  # existing outputs are kept without --overwrite
        bench.main(["--quick", "--out", str(tmp_path)])


def test_table_cells_mean_and_spread():
    def run(variant, seed, before, after):
        return {"variant": variant, "seed": seed, "history": [{"val_bits_per_char": 3.0 + seed}],
                "percent": {"before_ln": before, "after_ln": after,
                            "attention_input": [a if a is not None else b for a, b in zip(after, before, strict=True)]}}

    result = {"runs": [run("full", 0, [40.0, 20.0], [0.0, 0.0]), run("full", 1, [50.0, 30.0], [0.0, 1.0]),
                       run("full", 2, [45.0, 10.0], [0.0, 2.0]), run("none", 0, [5.0, 6.0], [None, None])]}
    cells = table_cells(result)
    first = cells["full"]["before_ln"][0]
    assert (first["mean"], first["min"], first["max"], first["n"]) == (45.0, 40.0, 50.0, 3)
    assert first["std"] == pytest.approx(statistics.stdev([40.0, 50.0, 45.0]))
    assert cells["full"]["after_ln"][1]["mean"] == pytest.approx(1.0)
    assert cells["full"]["val_bits_per_char"]["mean"] == pytest.approx(4.0)
    assert cells["none"]["after_ln"] == [None, None] and cells["none"]["before_ln"][0]["std"] == 0.0
    with pytest.raises(ExactLensError):
        table_cells({})


def test_committed_results_load_or_fail_clearly():
    for name in ("tables", "majority"):
        try:
            data = load_result(name)
        except ExactLensError as err:
            assert "benchmarks/brody_" in str(err)
        else:
            assert data["command"].startswith("PYTHONPATH=src python benchmarks/brody_") and data["date"]
    with pytest.raises(ExactLensError, match="unknown"):
        load_result("fig9")


def _context(tmp_path, quick: bool):
    from exactlens.viz.page import FULL, QUICK, ReportContext

    return ReportContext(out_dir=tmp_path, names=["majority"], quick=quick, settings=QUICK if quick else FULL)


def test_report_parts_quick_and_from_result_files(tmp_path, monkeypatch):
    """The quick report recomputes both parts; the full report renders the committed files (here: files
    written by the benchmarks' --quick runs, so that the test does not depend on what is committed)."""
    from exactlens.papers.brody import report

    ctx = _context(tmp_path / "quick", quick=True)
    for part in (report._tables_html, report._majority_html):
        html = part(ctx)
        assert "<table" in html and "failed" not in html
    assert not ctx.errors
    files = {}
    assert _benchmark("brody_majority").main(["--quick", "--out", str(tmp_path / "m")]) == 0
    files["majority"] = json.loads((tmp_path / "m" / "majority.json").read_text())
    assert _benchmark("brody_tables").main(["--quick", "--seeds", "0", "1", "--out", str(tmp_path / "t.json")]) == 0
    files["tables"] = json.loads((tmp_path / "t.json").read_text())
    assert set(files["tables"]["cells"]) == {"full", "no_scale"} and "hull" not in files["tables"]["runs"][0]
    monkeypatch.setattr(report, "load_result", files.__getitem__)
    ctx = _context(tmp_path / "full", quick=False)
    tables, majority = report._tables_html(ctx), report._majority_html(ctx)
    assert "±" in tables and "--quick" in tables and "with projection" in majority and "--quick" in majority
    assert (tmp_path / "full" / "figures" / "brody-majority.png").stat().st_size > 0

"""The exact ``majority-per-position`` construction (Brody et al. §4.1 on the task as the paper frames it,
``majority-margin``) and the task's enumeration of its own words: checked against a plain-Python majority,
exhaustively on short words and on random and closest words up to |w| = 2000, float32 and float64."""

from __future__ import annotations

import importlib.util
import itertools
from collections import Counter
from pathlib import Path

import pytest
import torch

import exactlens as el
from exactlens import tasks
from exactlens.analysis.verify import verify
from exactlens.errors import ExactLensError
from exactlens.model import ExactTransformer
from exactlens.papers.brody.majority import MarginMajority
from exactlens.train.checkpoints import read_checkpoints
from exactlens.train.presets import get_preset
from exactlens.train.registry import preset_names

ROOT = Path(__file__).resolve().parents[3]


def _reference(word: list[int], k: int) -> tuple[int, int]:
    """(majority class, its count minus the runner-up's), in plain Python."""
    counts = Counter(word)
    ranked = sorted(((counts.get(c, 0), -c) for c in range(k)), reverse=True)
    return -ranked[0][1], ranked[0][0] - ranked[1][0]


def _predictions(model, ids: torch.Tensor) -> torch.Tensor:
    task = tasks.of_model(model)
    return model(task.encode(ids).tokens).argmax(-1)


@pytest.mark.parametrize(("k", "margin"), [(2, 1), (3, 1), (3, 2), (4, 3)])
def test_all_words_are_exactly_the_words_with_the_margin(k, margin):
    task = MarginMajority(k, margin)
    for length in range(margin, 7):
        ours = {tuple(w) for w in task.all_words(length).tolist()}
        every = itertools.product(range(k), repeat=length)
        assert ours == {w for w in every if _reference(list(w), k)[1] >= margin}


@pytest.mark.parametrize(("k", "margin"), [(2, 1), (3, 2), (20, 6), (5, 1)])
def test_hard_words_lead_by_exactly_the_margin(k, margin):
    task = MarginMajority(k, margin)
    for length in range(margin, 15):
        hard = task.hard_words(length).tolist()
        assert hard and [k - 1] * length in hard
        gaps = [_reference(w, k)[1] for w in hard]
        assert min(gaps) >= margin
        if length >= margin + 2:  # the closest words the task has (two classes: the margin has |w|'s parity)
            assert min(gaps) == margin + ((length - margin) % 2 if k == 2 else 0)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize(("k", "margin"), [(2, 1), (3, 1), (4, 2)])
def test_exact_on_every_short_word(dtype, k, margin):
    model = el.build("majority-per-position", dtype=dtype, num_classes=k, min_margin=margin)
    task = tasks.of_model(model)
    assert task.name == "majority-margin" and task.params["min_margin"] == margin
    for length in range(margin, 8):
        ids = task.all_words(length)
        truth = torch.tensor([[_reference(w, k)[0]] * length for w in ids.tolist()])
        assert torch.equal(_predictions(model, ids), truth), (length, dtype)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_exact_on_long_random_and_closest_words(dtype):
    """The paper's task (20 classes, margin 6): the winner leads by >= 6/n, far above the rounding of a
    sum of n weights 1/n (measured float32 gap at n = 10,000: 5.9983e-4 for 6e-4)."""
    model = el.build("majority-per-position", dtype=dtype)
    task = tasks.of_model(model)
    for length in (50, 333, 2000):
        ids = torch.cat([task.sample(length, 12, torch.Generator().manual_seed(length)), task.hard_words(length)])
        truth = torch.tensor([[_reference(w, 20)[0]] * length for w in ids.tolist()])
        with torch.no_grad():
            logits = model(task.encode(ids).tokens)
        assert torch.equal(logits.argmax(-1), truth)
        top = logits.topk(2, -1).values
        assert float((top[..., 0] - top[..., 1]).min()) == pytest.approx(6 / length, rel=1e-3)


def test_the_logits_are_the_class_fractions_at_every_position():
    """Brody et al. §4.1's exact averaging: every position reads count_c / n (float64: to rounding)."""
    model = el.build("majority-per-position", dtype="float64", num_classes=4, min_margin=1)
    task = tasks.of_model(model)
    ids = torch.tensor([[3, 0, 3, 1, 3, 2, 3]])
    logits = model(task.encode(ids).tokens)[0]
    expected = torch.tensor([1, 1, 1, 4], dtype=torch.float64) / 7
    assert torch.allclose(logits, expected.expand(7, 4), atol=1e-15)


def test_verify_and_the_registry_agree_with_the_preset():
    model = el.build("majority-per-position")
    preset_task = get_preset("majority-per-position").spec({}).task
    assert tasks.of_model(model).spec() == preset_task.spec()  # the construction's defaults are the preset's task
    rows = verify("majority-per-position", lengths=[6, 7, 30], strings=50)["results"]
    assert [(r["accuracy"], r["per_position_accuracy"]) for r in rows] == [(1.0, 1.0)] * 3
    with pytest.raises(ExactLensError, match="min_margin"):
        el.build("majority-per-position", min_margin=0)


def test_the_formation_ablation_trains_with_the_exact_uniform_average(tmp_path):
    """benchmarks/formation_findings.py's ablation (docs/formation.md (b)): W_Q and W_K stay 0 through
    training, so every checkpoint's attention is exactly the construction's uniform average, while the rest
    of the model learns."""
    spec = importlib.util.spec_from_file_location("formation_findings", ROOT / "benchmarks" / "formation_findings.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.uniform_attention_runs(tmp_path, [0], quick=True)
    for variant in ("full", "scale_only"):
        steps = read_checkpoints(tmp_path / "runs" / f"majority-pp-uniform-{variant}" / "seed0")
        first, last = (ExactTransformer.load(c.path) for c in (steps[0], steps[-1]))
        for name in module.FROZEN_UNIFORM:
            assert float(dict(last.named_parameters())[name].detach().abs().max()) == 0.0
        assert not torch.equal(first.blocks[0].attn.W_V, last.blocks[0].attn.W_V)  # the values learn
        task = tasks.of_model(last)
        ids = task.sample(50, 4, torch.Generator().manual_seed(0))
        _, cache = last.run_with_cache(task.encode(ids).tokens)
        pattern = cache["blocks.0.attn.hook_pattern"]
        assert torch.allclose(pattern, torch.full_like(pattern, 1 / 50), atol=1e-6)
    assert "majority-per-position-uniform" not in preset_names()  # the script's preset is not left registered

"""Training any construction's task in its shape (exactlens.train.shaped) and the presets that
follow the papers' training (Brody's per-position MAJORITY, Shin & Matzinger's pairs)."""

import json

import pytest
import torch

from exactlens import tasks
from exactlens.analysis.diff import PARTS, diff
from exactlens.cli import main as cli_main
from exactlens.constructions import build, get, names
from exactlens.errors import ExactLensError
from exactlens.model import ExactTransformer
from exactlens.train import preset_names, train
from exactlens.train.presets import construction_names, get_preset
from exactlens.train.shaped import HARD_WEIGHTINGS, TASK_DEFAULTS, width_rule

NO_DAS = tuple(p for p in PARTS if p != "alignment")
TINY = dict(epochs=1, strings_per_epoch=16, batch_size=16, test_strings=16, eval_every=1)
SHAPED = construction_names()


def test_every_construction_name_trains() -> None:
    assert set(SHAPED) | set(preset_names()) >= set(names())
    assert set(SHAPED) & set(preset_names()) == set()  # a paper preset keeps its name
    assert {"dyck1", "dyck1-depth2", "dyck-k-D", "palindrome", "induction-recent", "induction-frequent",
            "sm-solution1"} <= set(SHAPED)


@pytest.mark.parametrize("name", SHAPED)
def test_shape_follows_the_construction(name: str) -> None:
    exact = build(name).cfg
    spec = get_preset(name).spec({})
    cfg = spec.config
    task = get(name).task_of()
    assert spec.task == task
    assert (cfg.n_layers, cfg.n_heads) == (exact.n_layers, exact.n_heads)
    assert cfg.per_layer("attention_mask") == exact.per_layer("attention_mask")
    assert cfg.per_layer("normalization") == exact.per_layer("normalization")
    assert cfg.per_layer("attn_length_scale") == exact.per_layer("attn_length_scale")
    assert cfg.positional_features == exact.positional_features
    assert cfg.readout_position == exact.readout_position
    assert (cfg.readout, cfg.d_vocab_out, cfg.vocab) == (task.readout, task.n_outputs, task.vocab)
    assert cfg.mlp_residual == exact.mlp_residual and cfg.ln_select == exact.ln_select
    trained = cfg.per_layer("attention_weighting")
    for built, learned in zip(exact.per_layer("attention_weighting"), trained, strict=True):
        assert learned == ("softmax" if built in HARD_WEIGHTINGS else built)
    replaced = cfg.metadata["shape"]["replaced"]
    assert ("attention_weighting" in replaced) == any(w in HARD_WEIGHTINGS for w in exact.per_layer(
        "attention_weighting"))
    d_model = TASK_DEFAULTS.get(task.name, {}).get("d_model", width_rule(exact)[0])
    assert (cfg.d_model, cfg.d_mlp) == (d_model, 4 * d_model if exact.d_mlp else 0)
    assert cfg.d_model >= 16 and cfg.d_model % cfg.n_heads == 0
    assert (cfg.d_mlp > 0) == (exact.d_mlp > 0)


def test_width_rule_and_explicit_widths() -> None:
    parity_ln = build("parity-ln").cfg  # d = 18, 2 heads
    assert width_rule(parity_ln) == (18, 72)
    assert width_rule(build("induction-recent").cfg) == (16, 0)  # no FFN in the construction: none trained
    spec = get_preset("dyck1").spec({"d_model": 40})
    assert (spec.config.d_model, spec.config.d_mlp) == (40, 160)  # d_mlp follows the given width
    spec = get_preset("dyck1").spec({"d_model": 40, "d_mlp": 7})
    assert spec.config.d_mlp == 7
    with pytest.raises(ExactLensError, match="multiple of its 2 heads"):
        get_preset("palindrome").spec({"d_model": 17})


def test_options_are_checked() -> None:
    with pytest.raises(ExactLensError, match="layer_norm='sideways'"):
        get_preset("dyck1").spec({"layer_norm": "sideways"})
    with pytest.raises(ExactLensError, match="no parameters"):
        get_preset("dyck-k-D").spec({"params": {"depth": 3}})
    with pytest.raises(ExactLensError, match="beyond its limit|exceeds|needs"):
        get_preset("sm-solution2").spec({"train_length": 80, "test_length": 80})
    with pytest.raises(ExactLensError, match="unknown training task 'nope'.*dyck1"):
        get_preset("nope")


def test_construction_parameters_fix_the_task() -> None:
    spec = get_preset("dyck-k-D").spec({"params": {"k": 2, "D": 2}})
    assert spec.task == get("dyck-k-D").task_of(k=2, D=2)
    assert spec.config.metadata["shape"]["construction_params"] == {"k": 2, "D": 2}


def test_layer_norm_choices() -> None:
    assert get_preset("dyck1").spec({"layer_norm": "pre"}).config.per_layer("normalization") == ("pre", "pre")
    post = get_preset("first-ln").spec({"layer_norm": "none"}).config
    assert post.per_layer("normalization") == ("none", "none")
    scale = get_preset("first-ln").spec({"layer_norm": "scale_only"}).config
    assert scale.per_layer("normalization") == ("post", "post") and not scale.ln_center


@pytest.mark.parametrize("name", ["dyck1", "induction-recent", "palindrome-hash", "sm-solution2", "first-log"])
def test_a_shaped_run_trains_saves_and_diffs(name: str, tmp_path) -> None:
    run = train(name, out=tmp_path / "run", seed=0, train_length=(2, 4), test_length=(2, 4), **TINY)
    info = json.loads((tmp_path / "run" / "run.json").read_text())
    assert info["shape"]["construction"] == name and info["task_spec"] == get(name).task_of().spec()
    loaded = ExactTransformer.load(tmp_path / "run")
    assert tasks.of_model(loaded) == get(name).task_of()
    result = diff(loaded, name, lengths=[2, 3], strings=8, parts=NO_DAS)
    assert 0.0 <= result["behaviour"]["agreement"] <= 1.0
    assert run.final["test_evaluated"]


def test_generic_defaults_are_registered_per_task() -> None:
    for task in ("dyck", "palindrome", "induction-recent", "induction-frequent"):
        assert task in TASK_DEFAULTS
    options = get_preset("dyck1").spec({}).options
    assert options["epochs"] * options["strings_per_epoch"] // options["batch_size"] >= 500


def test_cli_trains_a_construction(tmp_path, capsys) -> None:
    out = tmp_path / "dyck"
    code = cli_main(["train", "dyck1", "--out", str(out), "--epochs", "1", "--strings-per-epoch", "16",
                     "--batch-size", "16", "--test-strings", "16", "--train-length", "2:4", "--test-length", "2:4",
                     "--json"])
    assert code == 0
    info = json.loads(capsys.readouterr().out)
    assert info["shape"]["replaced"]["attention_weighting"]["trained"] == ["softmax", "softmax"]
    assert (out / "weights.pt").exists()


# ---- Brody et al. §4.1: MAJORITY predicted at every position ------------------------------


def test_majority_per_position_targets_match_the_reference() -> None:
    task = tasks.get("majority", num_classes=4, per_position=True)
    assert task.kind == "prediction" and task.readout == "per_position"
    gen = torch.Generator().manual_seed(0)
    ids = task.sample(7, 50, gen)
    words = task.decode(ids)
    assert task.targets(ids).tolist() == [task.target(w) for w in words]
    assert task.target("aabbbcc") == [1] * 7  # the paper's example: b at every position
    variable = task.variable("counts")
    assert torch.equal(variable.counterfactual(ids, ids), task.targets(ids))
    assert tasks.get("majority").params == {"num_classes": 20, "allow_ties": False}  # old configs read the same


def test_majority_per_position_preset_trains() -> None:
    run = train("majority-per-position", seed=0, num_classes=4, train_length=9, test_length=9, **TINY)
    assert run.model.cfg.readout == "per_position" and run.model.cfg.d_model == 8
    assert run.final["test_per_position_accuracy"] is not None
    assert run.model.cfg.task["params"]["per_position"] is True


# ---- Shin & Matzinger §4: the pairlogic runs as checkpoints ---------------------------------


def test_pairs_preset_writes_a_checkpoint_diff_reads(tmp_path) -> None:
    run = train("pairs", out=tmp_path / "p", seed=0, epochs=2, strings_per_epoch=64, test_strings=32,
                system="solution2", categories=4, train_length=6, test_length=6)
    assert run.model.cfg.d_mlp == max(16, 10)  # max(N^2, N + M)
    loaded = ExactTransformer.load(tmp_path / "p")
    result = diff(loaded, "sm-solution2", lengths=[6], strings=8, parts=("behaviour",),
                  params={"categories": 4, "positions": 6})
    assert result["behaviour"]["trained_mse"] is not None and result["behaviour"]["exact_mse"] < 1e-10
    with pytest.raises(ExactLensError, match="one fixed M"):
        train("pairs", epochs=1, train_length=(4, 6), test_length=6)

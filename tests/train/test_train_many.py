"""train_many: R runs trained as one stacked computation equal R single trainings."""

import json

import pytest
import torch

from exactlens.errors import ExactLensError
from exactlens.model import ExactTransformer, StackedRuns
from exactlens.train import train, train_many
from exactlens.train.loop import new_model, seed_generators
from exactlens.train.presets import get_preset

SMALL = dict(epochs=4, eval_every=2, test_strings=20, test_length=(3, 15), dtype="float64")
CASES = [
    ("first", dict(train_length=(2, 12), batch_size=25)),  # variable lengths, 4 steps per epoch
    ("first", dict(train_length=6, scaled=True)),
    ("parity", dict(train_length=8, test_length=8)),
    ("majority", dict(strings_per_epoch=60, test_strings=30, train_length=9, test_length=9, layer_norm="scale_only")),
]


def _compare(single, grouped):
    for a, b in zip(single, grouped, strict=True):
        assert a.seed == b.seed
        for (name, p), q in zip(a.model.named_parameters(), b.model.parameters(), strict=True):
            torch.testing.assert_close(q, p, atol=1e-10, rtol=1e-10, msg=name)
        assert len(a.history) == len(b.history)
        for ra, rb in zip(a.history, b.history, strict=True):
            for key, value in ra.items():
                if key == "wall_s" or value is None:
                    assert key == "wall_s" or rb[key] is None, key
                else:
                    assert rb[key] == pytest.approx(value, abs=1e-9, rel=1e-9), key


@pytest.mark.parametrize("task,options", CASES, ids=[f"{t}-{i}" for i, (t, _) in enumerate(CASES)])
def test_runs_trained_together_equal_single_runs(task, options):
    opts = {**SMALL, **options}
    seeds = [0, 3, 7]
    single = [train(task, seed=s, **opts) for s in seeds]
    grouped = train_many(task, seeds, **opts)
    _compare(single, grouped)
    # the runs really differ from each other (a shared-parameter bug would make them equal)
    w0, w1 = (r.model.blocks[0].attn.W_Q for r in grouped[:2])
    assert not torch.allclose(w0, w1)


def test_lbfgs_runs_train_one_at_a_time_and_equal_single_runs():
    opts = {**SMALL, "train_length": 5, "optimizer": "lbfgs", "lr": 0.5, "epochs": 3}
    single = [train("first", seed=s, **opts) for s in (1, 2)]
    grouped = train_many("first", [1, 2], **opts)
    assert grouped[0].info["trained_with"] == {"seeds": [1, 2], "stacked": False, "optimizer": "lbfgs"}
    _compare(single, grouped)


def test_stacked_forward_and_gradients_match_each_model():
    spec = get_preset("parity").spec({"dtype": "float64", "scaled": True})
    models = [new_model(spec, seed_generators(s)["init"]).set_fused(False) for s in (4, 5)]
    stacked = StackedRuns(models)
    lang = spec.task
    gen = torch.Generator().manual_seed(0)
    tokens = torch.stack([lang.encode(lang.sample(6, 3, gen)).tokens for _ in models])
    n_positions = torch.tensor([[7, 5, 6], [7, 7, 3]])  # |w| = 6 plus [CLS]: 7 positions, some rows cut
    out = stacked.readout(tokens, n_positions)
    out.square().sum().backward()
    for r, model in enumerate(models):
        want = model.readout(tokens[r], n_positions[r])
        torch.testing.assert_close(out[r].detach(), want.detach(), atol=1e-12, rtol=0)
        want.square().sum().backward()
        for name, p in model.named_parameters():
            if p.grad is not None and p.numel():
                torch.testing.assert_close(stacked.params[name].grad[r], p.grad, atol=1e-10, rtol=0, msg=name)


def test_checkpoints_per_seed_and_bad_seeds(tmp_path):
    runs = train_many("first", [2, 5], out=tmp_path, epochs=2, train_length=4, test_length=4, test_strings=5)
    for run in runs:
        folder = tmp_path / f"seed{run.seed}"
        assert run.checkpoint == folder
        info = json.loads((folder / "run.json").read_text())
        assert info["seed"] == run.seed
        assert info["trained_with"] == {"seeds": [2, 5], "stacked": True, "optimizer": "adam"}
        assert len((folder / "history.jsonl").read_text().splitlines()) == 2
        loaded = ExactTransformer.load(folder)
        for p, q in zip(loaded.parameters(), run.model.parameters(), strict=True):
            assert torch.equal(p, q)
    with pytest.raises(ExactLensError, match="distinct"):
        train_many("first", [1, 1], epochs=1)
    with pytest.raises(ExactLensError, match="at least one seed"):
        train_many("first", [], epochs=1)
    with pytest.raises(ExactLensError, match="one configuration"):
        preset = get_preset("first")
        a = ExactTransformer(preset.spec({}).config)
        b = ExactTransformer(preset.spec({"scaled": True}).config)
        StackedRuns([a, b])


def test_cli_trains_several_seeds_together(tmp_path, capsys):
    from exactlens.cli import main as cli_main

    out = tmp_path / "cli"
    args = ["train", "first", "--out", str(out), "--epochs", "2", "--train-length", "4", "--test-strings", "5"]
    args += ["--dtype", "float64"]  # (float32 runs agree only to ~1e-4: Adam magnifies rounding in tiny gradients)
    assert cli_main([*args, "--test-length", "4", "--seeds", "3:4", "--json"]) == 0
    reply = json.loads(capsys.readouterr().out)
    assert [r["seed"] for r in reply["runs"]] == [3, 4]
    single = train("first", seed=4, epochs=2, train_length=4, test_length=4, test_strings=5, dtype="float64")
    loaded = ExactTransformer.load(out / "seed4")
    for p, q in zip(loaded.parameters(), single.model.parameters(), strict=True):
        torch.testing.assert_close(p, q, atol=1e-10, rtol=1e-10)
    assert cli_main([*args, "--seeds", "2,x"]) == 2
    assert "--seeds takes LO:HI" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # --seed and --seeds exclude each other (argparse)
        cli_main([*args, "--seed", "1", "--seeds", "1:2"])

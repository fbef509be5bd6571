"""Training: presets, seeds, padding, checkpoints, history schema, the CLI."""

import json
import math

import pytest
import torch

from exactlens.cli import main as cli_main
from exactlens.constructions import build
from exactlens.errors import ExactLensError
from exactlens.model import ExactTransformer
from exactlens.tasks import kinds
from exactlens.train import HISTORY_FIELDS, KIND_FIELDS, preset_names, train
from exactlens.train.data import assemble, sample_batch
from exactlens.train.loop import new_model, seed_generators
from exactlens.train.presets import get_preset

TINY = dict(epochs=3, train_length=6, test_length=8, test_strings=20, eval_every=2)


def _model(task, seed=0, **options):
    spec = get_preset(task).spec(options)
    model = new_model(spec, seed_generators(seed)["init"]).set_fused(False)
    return model, spec.task, spec.options


@pytest.mark.parametrize("task,construction", [("first", "first"), ("parity", "parity")])
def test_chiang_presets_copy_the_exact_solution_architecture(task, construction):
    exact = build(construction).cfg
    model, _, _ = _model(task)
    cfg = model.cfg
    assert (cfg.n_layers, cfg.n_heads, cfg.positional_features) == (
        exact.n_layers,
        exact.n_heads,
        exact.positional_features,
    )
    assert (cfg.d_model, cfg.d_mlp, cfg.normalization, cfg.ln_eps) == (16, 64, "post", 1e-5)
    assert cfg.vocab == exact.vocab and cfg.readout == "sigmoid" and cfg.readout_position == 0
    scaled, _, _ = _model(task, scaled=True)
    assert set(scaled.cfg.per_layer("attn_length_scale")) == {"log_n"}


def test_cli_lists_every_preset(capsys):
    assert {"first", "parity", "one", "majority"} <= set(preset_names())
    assert cli_main(["list", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert {p["name"] for p in listed["presets"]} == set(preset_names())


def test_pytorch_default_init_distributions():
    model, _, _ = _model("first", d_model=64, d_mlp=256)
    model.requires_grad_(False)
    d = 64
    w_e = model.embed.W_E
    assert 0.7 < float(w_e.detach().std()) < 1.3  # N(0, 1)
    for name in ("W_Q", "W_K", "W_V"):
        w = getattr(model.blocks[0].attn, name)
        bound = math.sqrt(6 / (4 * d))  # Xavier over the packed [3d, d] in_proj
        assert float(w.abs().max()) <= bound and float(w.abs().max()) > 0.9 * bound
    assert float(model.blocks[0].mlp.W_out.abs().max()) <= 1 / math.sqrt(256)
    assert torch.all(model.blocks[0].attn.b_Q == 0) and torch.all(model.blocks[0].ln1.w == 1)


def test_same_seed_same_run_different_seed_different_run():
    a = train("first", seed=3, **TINY)
    b = train("first", seed=3, **TINY)
    c = train("first", seed=4, **TINY)
    strip = [{k: v for k, v in r.items() if k != "wall_s"} for r in a.history]
    assert strip == [{k: v for k, v in r.items() if k != "wall_s"} for r in b.history]
    for (name, p), q in zip(a.model.state_dict().items(), b.model.state_dict().values(), strict=True):
        assert torch.equal(p, q), name
    assert not torch.equal(a.model.embed.W_E, c.model.embed.W_E)


def test_evaluation_frequency_does_not_change_training():
    a = train("first", seed=1, **dict(TINY, eval_every=1))
    b = train("first", seed=1, **dict(TINY, eval_every=0))
    assert [r["train_loss_bits"] for r in a.history] == [r["train_loss_bits"] for r in b.history]
    assert torch.equal(a.model.blocks[1].attn.W_Q, b.model.blocks[1].attn.W_Q)


@pytest.mark.parametrize("task", ["first", "parity", "one"])
def test_padded_batch_gives_the_per_length_loss_and_gradients(task):
    model, lang, _ = _model(task, dtype="float64", scaled=True)
    gen = torch.Generator().manual_seed(0)
    groups = [lang.sample(length, 3, gen) for length in (2, 5, 9)]
    padded = assemble(lang, groups)
    assert padded.padded and padded.tokens.shape == (9, 10)

    def loss_and_grads(batches, weights):
        model.zero_grad()
        total = sum(
            w * kinds.loss(lang, model.readout(b.tokens, b.n_positions), b.targets, b.n_positions).mean()
            for b, w in zip(batches, weights, strict=True)
        )
        total.backward()
        return float(total.detach()), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    loss_pad, grad_pad = loss_and_grads([padded], [1.0])
    loss_sep, grad_sep = loss_and_grads([assemble(lang, [g]) for g in groups], [3 / 9] * 3)
    assert loss_pad == pytest.approx(loss_sep, rel=1e-12)
    assert grad_pad.keys() == grad_sep.keys()
    for name in grad_pad:
        torch.testing.assert_close(grad_pad[name], grad_sep[name], rtol=1e-10, atol=1e-12, msg=name)


def test_variable_lengths_are_drawn_from_the_range():
    lang = get_preset("first").task_of({})
    batch = sample_batch(lang, 400, (3, 7), torch.Generator().manual_seed(0))
    assert set(batch.lengths.tolist()) == {3, 4, 5, 6, 7}
    assert torch.equal(batch.n_positions, batch.lengths + 1)
    first_symbol = batch.tokens[:, 1]  # position 0 is CLS
    assert torch.equal(batch.targets.bool(), first_symbol == 1)


def test_short_first_run_beats_chance():
    run = train("first", seed=0, epochs=60, train_length=10, test_length=10, test_strings=400, eval_every=0)
    final = run.final
    assert final["test_accuracy"] > 0.85, final
    assert final["test_loss_bits"] < run.history[0]["train_loss_bits"]


def test_checkpoint_reloads_to_identical_outputs_and_history_schema(tmp_path):
    run = train("first", out=tmp_path / "run", seed=0, **TINY)
    assert run.checkpoint == tmp_path / "run"
    loaded = ExactTransformer.load(run.checkpoint)
    tokens = get_preset("first").task_of({}).tokenize(["1011", "0", "111000"])
    torch.testing.assert_close(
        loaded(tokens.tokens, tokens.n_positions), run.model(tokens.tokens, tokens.n_positions), rtol=0, atol=0
    )
    lines = (run.checkpoint / "history.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    assert records == json.loads(json.dumps(run.history))
    assert len(records) == TINY["epochs"]
    for rec in records:
        # the generic fields, the kind's (none for membership), the preset's metric, the evaluation flag
        assert set(rec) == {*HISTORY_FIELDS, *KIND_FIELDS["membership"], "test_attn_first", "test_query_angle_deg",
                            "test_evaluated"}
        assert rec["test_query_angle_deg"] is None  # kept null for readers of older records
        assert rec["strings_seen"] == 100 * rec["epoch"] and rec["step"] == rec["epoch"]
        evaluated = rec["epoch"] % 2 == 0 or rec["epoch"] == TINY["epochs"]
        assert rec["test_evaluated"] == evaluated and (rec["test_accuracy"] is not None) == evaluated
        if evaluated:
            assert 0 <= rec["test_accuracy"] <= 1 and rec["test_loss_bits"] > 0 and rec["test_attn_first"] > 0
    info = json.loads((run.checkpoint / "run.json").read_text())
    assert info["seed"] == 0 and info["options"]["train_length"] == [6, 6] and info["final"] == records[-1]
    assert info["task_spec"] == {"name": "first", "kind": "membership", "params": {}}
    assert loaded.cfg.task == info["task_spec"] and info["trained_with"]["optimizer"] == "adam"


def test_batch_size_one_is_one_step_per_string():
    run = train("first", seed=0, epochs=2, strings_per_epoch=4, batch_size=1, train_length=(2, 5), **_tests())
    assert [r["step"] for r in run.history] == [4, 8]
    with pytest.raises(ExactLensError, match="must divide"):
        train("first", epochs=1, strings_per_epoch=10, batch_size=3)


def _tests():
    return dict(test_length=5, test_strings=5)


def test_majority_preset_records_the_query_angle():
    run = train("majority", seed=0, epochs=3, strings_per_epoch=64, test_strings=32, train_length=12, test_length=12)
    cfg = run.model.cfg
    assert (cfg.n_layers, cfg.d_model, cfg.d_vocab_out, cfg.normalization, cfg.d_mlp) == (1, 8, 20, "pre", 0)
    final = run.final
    assert 0 <= final["test_query_angle_deg"] <= 90 and final["test_attn_first"] is None
    assert run.info["task_spec"]["kind"] == "classification"
    assert run.history[0]["lr"] > run.history[-1]["lr"]  # linear schedule
    scale_only = train("majority", seed=0, epochs=1, strings_per_epoch=8, test_strings=8, layer_norm="scale_only")
    assert scale_only.model.cfg.ln_center is False
    assert (
        train("majority", epochs=1, strings_per_epoch=8, test_strings=8, layer_norm="none").model.cfg.normalization
        == "none"
    )


@pytest.mark.parametrize(
    "options,message",
    [
        (dict(lr=0), "lr"),
        (dict(epochs=0), "epochs"),
        (dict(train_length=(5, 2)), "lo <= hi"),
        (dict(train_length="10"), "train_length"),
        (dict(layer_norm="both"), "layer_norm"),
        (dict(positions="first"), "positions"),
        (dict(num_classes=3), r"preset 'first' has no option 'num_classes' \(it accepts only None\)"),
        (dict(learning_rate=1e-3), "unknown training options"),
    ],
)
def test_bad_options_raise(options, message):
    with pytest.raises(ExactLensError, match=message):
        train("first", **options)


def test_unknown_task_and_seed():
    with pytest.raises(ExactLensError, match="unknown training task"):
        train("dyck")
    with pytest.raises(ExactLensError, match="seed"):
        train("first", seed=-1)


def test_cli_train_json(tmp_path, capsys):
    out = tmp_path / "cli"
    code = cli_main(
        [
            "train",
            "first",
            "--out",
            str(out),
            "--epochs",
            "2",
            "--train-length",
            "1:4",
            "--test-length",
            "6",
            "--test-strings",
            "10",
            "--json",
        ]
    )
    assert code == 0
    info = json.loads(capsys.readouterr().out)
    assert info["options"]["train_length"] == [1, 4] and info["steps"] == 2
    assert ExactTransformer.load(out).cfg.model_name == "trained-first"
    assert cli_main(["train", "first", "--out", str(out), "--train-length", "x"]) == 2


def test_query_angle_is_the_query_direction_on_the_normalized_keys():
    """Independent check: the CLS score of key j is a function of LN's normalized vector n_j;
    its gradient with respect to n_j is the query's direction in that space (w * W_K q)."""
    from exactlens.tasks import get as get_task
    from exactlens.train.loop import evaluate

    run = train("majority", seed=1, epochs=2, strings_per_epoch=32, test_strings=16, train_length=9, test_length=9)
    model = run.model.double()
    with torch.no_grad():  # a gain far from 1, so that leaving it out would show
        model.blocks[0].ln1.w.copy_(torch.linspace(0.2, 3.0, model.cfg.d_model, dtype=torch.float64))
    lang = get_task("majority")
    batch = sample_batch(lang, 6, (9, 9), torch.Generator().manual_seed(0))
    captured = {}

    def keep_normalized(tensor, hook):
        tensor.retain_grad()
        captured["n"] = tensor
        return tensor

    def keep_scores(tensor, hook):
        captured["scores"] = tensor

    model.run_with_hooks(
        batch.tokens,
        n_positions=batch.n_positions,
        fwd_hooks=[("blocks.0.ln1.hook_normalized", keep_normalized), ("blocks.0.attn.hook_attn_scores", keep_scores)],
    )
    angles = []
    for row in range(6):
        key = 3  # any key position: the score's gradient in n_key is the same direction
        grad = torch.autograd.grad(captured["scores"][row, 0, 0, key], captured["n"], retain_graph=True)[0][row, key]
        cos = grad.sum().abs() / (grad.norm() * math.sqrt(model.cfg.d_model))
        angles.append(float(torch.rad2deg(torch.arccos(cos.clamp(max=1.0)))))
    expected = sum(angles) / len(angles)
    metrics = get_preset("majority").metrics
    assert evaluate(model, batch, lang, metrics)["test_query_angle_deg"] == pytest.approx(expected, abs=1e-6)

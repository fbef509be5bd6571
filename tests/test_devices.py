"""Devices (exactlens.devices): names, the errors for devices that are not there, and the plumbing.

On the CPU: ``device="cpu"`` (and ``"auto"`` on a machine without an accelerator) gives exactly the
results of no device for build, verify, precision, train (one run and stacked runs), diff and hull, and
records the device in the JSON. A device that is not there is a one-line error naming those that are.
The model's forward is checked to create every tensor on its input's device: it runs with torch's
default device set to "meta", where a tensor created without a device lands on "meta" and mixing it
with the CPU input raises.

On a CUDA machine the GPU tests compare the CPU and the GPU: float64 results equal to float64 rounding
(decisions identical), float32 within float32 rounding. Without CUDA they are skipped, saying so.
"""

from __future__ import annotations

import contextlib
import math

import pytest
import torch

import exactlens as el
from exactlens import constructions, tasks
from exactlens.analysis.verify import precision, verify
from exactlens.cli import main
from exactlens.devices import available_devices, device_name, resolve_device
from exactlens.errors import ExactLensError
from exactlens.model import ExactTransformer
from exactlens.model.stacked import SingleRun, StackedRuns
from exactlens.train import train, train_many
from exactlens.train.data import assemble
from exactlens.train.presets import get_preset

CUDA = torch.cuda.is_available()
MPS = getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available()
needs_cuda = pytest.mark.skipif(not CUDA, reason="no CUDA device: the GPU path is not tested on this machine")
TINY = dict(epochs=3, strings_per_epoch=16, batch_size=8, test_strings=16, train_length=[1, 6], test_length=6,
            eval_every=0)


# ---- names -------------------------------------------------------------------------------------


def test_names_resolve():
    assert resolve_device(None) == torch.device("cpu")
    cpu = torch.device("cpu")
    assert resolve_device("cpu") == resolve_device(" CPU ") == resolve_device(cpu) == cpu
    auto = resolve_device("auto")
    expected = "cuda" if CUDA else ("mps" if MPS else "cpu")
    assert auto.type == expected and device_name(auto) in available_devices()
    assert resolve_device("auto", "float64").type != "mps"  # MPS has no float64


@pytest.mark.parametrize("name", ["gpu", "cuda:x", "cpu:0", "tpu", "", 3])
def test_unknown_devices_are_refused(name):
    with pytest.raises(ExactLensError, match="device"):
        resolve_device(name)


@pytest.mark.skipif(CUDA, reason="this machine has CUDA: asking for it is not an error here")
def test_cuda_without_cuda_names_what_is_there():
    for name in ("cuda", "cuda:0", "cuda:3"):
        with pytest.raises(ExactLensError, match=r"not available on this machine .*available: cpu"):
            resolve_device(name)


@needs_cuda
def test_a_cuda_index_beyond_the_gpus_is_refused():
    with pytest.raises(ExactLensError, match="no such CUDA device"):
        resolve_device(f"cuda:{torch.cuda.device_count()}")


def test_mps_is_refused_where_absent_or_for_float64():
    with pytest.raises(ExactLensError, match="mps"):
        resolve_device("mps", "float64" if MPS else "float32")


@pytest.mark.skipif(CUDA, reason="this machine has CUDA: --device cuda works here")
def test_cli_device_not_there_is_one_line(capsys):
    for argv in (["verify", "parity", "--lengths", "2", "--device", "cuda", "--json"],
                 ["train", "first", "--out", "never-written", "--device", "cuda", "--json", "--epochs", "1"],
                 ["hull", "--device", "cuda"]):
        assert main(argv) == 2
        captured = capsys.readouterr()
        assert captured.out == ""
        lines = captured.err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("exactlens: error: device 'cuda' is not available"), lines
        assert "available: cpu" in lines[0]


def test_cli_unknown_device_is_one_line(capsys):
    assert main(["verify", "parity", "--lengths", "2", "--device", "gpu", "--json"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and "unknown device 'gpu'" in captured.err and "cpu, cuda, mps, auto" in captured.err


# ---- the same results on the CPU, and the device recorded ---------------------------------------


def test_build_on_cpu_is_the_default_build():
    for name in ("parity", "palindrome-hash", "sm-solution2", "dyck1-depth2"):
        plain, placed = constructions.build(name, dtype="float64"), el.build(name, dtype="float64", device="cpu")
        assert placed.device == torch.device("cpu")
        assert plain.state_dict().keys() == placed.state_dict().keys()
        assert all(torch.equal(v, placed.state_dict()[k]) for k, v in plain.state_dict().items())


def test_verify_and_precision_record_the_device_and_match():
    base = verify("first", [1, 2, 5], strings=64, dtype="float32")
    assert base["device"] == "cpu"
    for device in ("cpu", "auto"):
        if device == "auto" and resolve_device("auto").type != "cpu":
            continue  # compared with the CPU within rounding by the GPU tests below
        assert verify("first", [1, 2, 5], strings=64, dtype="float32", device=device) == base
    api = el.verify("first", lengths=[1, 2, 5], strings=64, device="cpu")
    assert api.to_dict() == base
    frontier = precision("first-flawed", dtype="float64", max_length=20, strings=8, params={"c": 2.0})
    assert frontier == precision("first-flawed", dtype="float64", max_length=20, strings=8, params={"c": 2.0},
                                 device="cpu")
    assert frontier["device"] == "cpu"


def _same_runs(a, b) -> None:
    assert [r["train_loss_bits"] for r in a.history] == [r["train_loss_bits"] for r in b.history]
    assert {k: v for k, v in a.final.items() if k != "wall_s"} == {k: v for k, v in b.final.items() if k != "wall_s"}
    assert all(torch.equal(v, b.model.state_dict()[k]) for k, v in a.model.state_dict().items())


def test_training_on_cpu_matches_and_records_the_device():
    plain = train("first", seed=1, **TINY)
    placed = train("first", seed=1, device="cpu", **TINY)
    _same_runs(plain, placed)
    assert plain.info["device"] == placed.info["device"] == "cpu"
    many = train_many("first", [1, 2], device="cpu", **TINY)  # the stacked runs
    assert [r.info["device"] for r in many] == ["cpu", "cpu"]
    assert many[0].model.device == torch.device("cpu")
    # each stacked run is its single run (up to summation order)
    assert many[0].final["test_accuracy"] == pytest.approx(plain.final["test_accuracy"], abs=1 / 16)


def test_lbfgs_training_on_cpu_matches():
    from exactlens.papers.shin_matzinger.training import PairTrainConfig, train_pairs

    cfg = PairTrainConfig(categories=3, positions=4, batch=20, iterations=3, test_batch=20, seed=0)
    plain, placed = train_pairs(cfg), train_pairs(cfg, device="cpu")
    assert plain.history == placed.history and plain.test_mse == placed.test_mse


def test_diff_and_hull_on_cpu_match():
    from exactlens.analysis.diff import diff
    from exactlens.analysis.hull.model import hull_report

    trained = train("first", seed=0, **TINY).model
    options = dict(lengths=[1, 2, 4], strings=8, parts=("behaviour", "probes", "attention", "weights",
                                                         "interventions"))
    plain = diff(trained, "first", **options)  # no device: where the trained model is
    placed = el.diff(trained, "first", device="cpu", **options).to_dict()
    for result in (plain, placed):
        result.pop("seconds")
    assert plain == placed and plain["settings"]["device"] == "cpu"
    assert trained.device == torch.device("cpu")
    hull = el.hull("first", device="cpu").to_dict()
    assert hull["device"] == "cpu" and hull == hull_report("first")


# ---- the forward creates its tensors on the input's device ---------------------------------------


@contextlib.contextmanager
def default_device_meta():
    """Tensors created without a device land on "meta"; mixing them with CPU tensors raises."""
    torch.set_default_device("meta")
    try:
        yield
    finally:
        torch.set_default_device("cpu")


def test_the_meta_check_catches_a_tensor_made_without_a_device():
    n_positions = torch.tensor([2, 3])
    with default_device_meta(), pytest.raises(RuntimeError, match="meta"):
        _ = torch.arange(3).unsqueeze(0) < n_positions.unsqueeze(1)


def _batches(name: str, model: ExactTransformer, seed: int):
    """An unpadded batch and a padded one (two lengths) of words the construction answers."""
    task = tasks.of_model(model)
    low, high = constructions.get(name).length_range(model)
    low = max(2, low)
    longer = low + 3 if high is None else min(low + 3, high)
    short = task.sample(low, 3, torch.Generator().manual_seed(seed))
    long = task.sample(longer, 3, torch.Generator().manual_seed(seed + 1))
    return task.encode(short), assemble(task, [short, long])


# Every construction, but of the tracr programs one (each compiles with tracr for ~9 s; they are
# ExactTransformers like the rest, converted by one routine).
FORWARD_NAMES = [n for n in constructions.names() if "tracr" not in constructions.get(n).tags or n == "tracr-length"]


@pytest.mark.parametrize("name", FORWARD_NAMES)
def test_every_construction_runs_on_the_inputs_device(name):
    model = constructions.build(name, dtype="float64")
    plain, padded = _batches(name, model, 0)
    want = model.readout(plain.tokens), model.readout(padded.tokens, padded.n_positions)
    with default_device_meta():
        got = model.readout(plain.tokens), model.readout(padded.tokens, padded.n_positions)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def test_training_runs_forward_on_the_inputs_device():
    spec = get_preset("first").spec(dict(TINY))
    models = []
    for seed in (0, 1):
        model = ExactTransformer(spec.config)
        model.init_weights(seed)
        models.append(model.train().set_fused(True))
    batch = assemble(spec.task, [spec.task.sample(3, 4, torch.Generator().manual_seed(0)),
                                 spec.task.sample(5, 4, torch.Generator().manual_seed(1))])
    tokens, n_positions = batch.tokens.expand(2, -1, -1), batch.n_positions.expand(2, -1)
    for runs, k in ((StackedRuns(models), 2), (SingleRun(models[0]), 1)):
        want = runs.readout(tokens[:k], n_positions[:k])
        with default_device_meta():
            got = runs.readout(tokens[:k], n_positions[:k])
        assert torch.equal(got, want)


@pytest.mark.parametrize("preset", ["first", "majority", "induction-recent", "pairs"])  # one task of each kind
def test_losses_and_scores_compute_on_the_inputs_device(preset):
    """What training and evaluation compute from a model's outputs (loss, decisions, scores, per-position
    masks) creates its tensors on the outputs' device."""
    from exactlens.train.data import sample_batch
    from exactlens.train.loop import evaluate, run_losses, stack_batches

    options = {"pairs": dict(categories=3, train_length=4, test_length=4, strings_per_epoch=8, test_strings=8,
                             epochs=1)}.get(preset, dict(TINY))
    spec = get_preset(preset).spec(options)
    model = ExactTransformer(spec.config)
    model.init_weights(0)
    if spec.prepare is not None:
        spec.prepare(model, spec.options)
    runs = StackedRuns([model])
    batch = sample_batch(spec.task, 8, spec.options["train_length"], torch.Generator().manual_seed(0))
    tokens, n_positions, targets = stack_batches([batch])
    outputs = runs.readout(tokens, n_positions).detach()
    want = run_losses(spec.task, outputs, targets, n_positions), evaluate(model, batch, spec.task, spec.metrics)
    with default_device_meta():
        got = run_losses(spec.task, outputs, targets, n_positions), evaluate(model, batch, spec.task, spec.metrics)
    assert all(torch.equal(a, b) for a, b in zip(got[0], want[0], strict=True)) and got[1] == want[1]


# ---- the GPU path (CUDA only) --------------------------------------------------------------------


def _close(a: float | None, b: float | None, rel: float) -> bool:
    return (a is None and b is None) or (a is not None and b is not None and math.isclose(a, b, rel_tol=rel,
                                                                                            abs_tol=rel))


@needs_cuda
@pytest.mark.parametrize("name", ["parity", "first-log-ln", "palindrome-hash", "majority", "dyck1-depth2",
                                  "induction-frequent", "sm-solution2"])
def test_gpu_outputs_match_the_cpu(name):
    for dtype, rel in (("float64", 1e-12), ("float32", 1e-5)):
        cpu, gpu = el.build(name, dtype=dtype, device="cpu"), el.build(name, dtype=dtype, device="cuda")
        assert gpu.device.type == "cuda"
        plain, padded = _batches(name, cpu, 3)
        for batch in (plain, padded):
            want = cpu.readout(batch.tokens, batch.n_positions)
            got = gpu.readout(batch.tokens, batch.n_positions)  # CPU tokens move to the model's device
            assert got.device.type == "cuda"
            torch.testing.assert_close(got.cpu(), want, rtol=rel, atol=rel * float(want.abs().max().clamp(min=1)))


@needs_cuda
def test_gpu_verify_matches_the_cpu():
    for dtype, rel in (("float64", 1e-12), ("float32", 1e-4)):
        cpu = verify("first", [1, 2, 5, 9], strings=128, dtype=dtype, device="cpu")
        gpu = verify("first", [1, 2, 5, 9], strings=128, dtype=dtype, device="cuda")
        assert gpu["device"].startswith("cuda")
        for a, b in zip(cpu["results"], gpu["results"], strict=True):
            assert a["accuracy"] == b["accuracy"]  # the same decisions
            assert _close(a["cross_entropy_bits"], b["cross_entropy_bits"], rel)
            assert _close(a["min_abs_logit"], b["min_abs_logit"], rel)


@needs_cuda
def test_gpu_training_matches_the_cpu():
    for dtype, rel in (("float64", 1e-9), ("float32", 1e-3)):
        cpu = train("first", seed=0, dtype=dtype, device="cpu", **TINY)
        gpu = train("first", seed=0, dtype=dtype, device="cuda", **TINY)
        assert gpu.info["device"].startswith("cuda") and gpu.model.device.type == "cuda"
        for a, b in zip(cpu.history, gpu.history, strict=True):
            assert _close(a["train_loss_bits"], b["train_loss_bits"], rel)
        many = train_many("first", [0, 1], dtype=dtype, device="cuda", **TINY)  # stacked runs on the GPU
        assert _close(many[0].final["test_loss_bits"], cpu.final["test_loss_bits"], max(rel, 1e-6))


@needs_cuda
def test_gpu_diff_and_hull_match_the_cpu():
    trained = train("first", seed=0, dtype="float64", **TINY).model
    options = dict(lengths=[1, 2, 4], strings=8, parts=("behaviour", "probes", "interventions", "alignment"),
                   das_steps=5, alignment_pairs=8)
    cpu = el.diff(trained, "first", device="cpu", **options).to_dict()
    gpu = el.diff(trained, "first", device="cuda", **options).to_dict()
    assert trained.device.type == "cpu"  # the caller's model is copied to the GPU, not moved
    assert gpu["settings"]["device"].startswith("cuda")
    assert cpu["behaviour"]["rows"] == gpu["behaviour"]["rows"]
    for a, b in zip(cpu["probes"]["features"], gpu["probes"]["features"], strict=True):
        assert _close(a["best_r2"], b["best_r2"], 1e-6)
    hull_cpu, hull_gpu = el.hull("first", device="cpu").to_dict(), el.hull("first", device="cuda").to_dict()
    assert [layer["before_ln"] for layer in hull_cpu["layers"]] == [layer["before_ln"] for layer in hull_gpu["layers"]]


@needs_cuda
def test_gpu_pairlogic_check():
    result = el.pairlogic(check="sm-solution2", categories=4, positions=6, batch=32, device="cuda")
    assert result["exact"] and result["device"].startswith("cuda")


@needs_cuda
def test_gpu_idle_units_copy_matches():
    """The alignment's copy without idle FFN units (exactlens.model.idle) stays on the GPU and computes the same."""
    from exactlens.model.idle import without_idle_units

    for dtype in ("float64", "float32"):
        model = el.build("tracr-shuffle_dyck", dtype=dtype, device="cuda")
        lean = without_idle_units(model)
        assert lean.cfg.d_mlp == 16 and lean.device.type == "cuda"
        task = tasks.of_model(model)
        words = task.encode(task.sample(5, 500, torch.Generator().manual_seed(0))).tokens
        with torch.no_grad():
            torch.testing.assert_close(lean(words), model(words), rtol=0, atol=0)


@needs_cuda
@pytest.mark.parametrize("name", ["tracr-hist", "parity-ln-eta", "tracr-dedup"])
def test_gpu_stacked_swaps_match(name):
    """The exact variables' swaps run stacked on the GPU give each variable's own answers, and a self-diff's
    verdicts on the GPU are the CPU's."""
    from exactlens.analysis.diff.alignment.variables import counterfactuals, exact_variables
    from exactlens.analysis.diff.runs import make_side, run_both

    model = el.build(name, dtype="float64", device="cuda")
    side = make_side(model, {}, tasks.reader(model), model.cfg.readout_position, True)
    runs = run_both(tasks.of_model(model), [3, 4, 5], 64, 0, side, side)
    features = el.diff(model, name, lengths=[3, 4, 5], parts=("probes",), untrained_baseline=False).to_dict()
    variables = exact_variables(side, features["probes"]["features"], runs)[0]
    gen = torch.Generator().manual_seed(0)
    for run in runs:
        b, s = torch.randint(len(run.ids), (40,), generator=gen), torch.randint(len(run.ids), (40,), generator=gen)
        alone = [v.counterfactual(run, b, s) for v in variables]
        assert all(torch.equal(x, y) for x, y in zip(alone, counterfactuals(variables, run, b, s), strict=True))
    options = dict(lengths=[3, 4, 5], parts=("alignment",), das_steps=10, untrained_baseline=False)
    cpu, gpu = (el.diff(name, name, device=d, **options).to_dict()["summary"]["verdicts"] for d in ("cpu", "cuda"))
    assert {k: (v["verdict"], v["site"]) for k, v in cpu.items()} == {k: (v["verdict"], v["site"]) for k, v in
                                                                       gpu.items()}

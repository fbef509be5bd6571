"""Bad input and faults: nothing half-written, nothing silently replaced, no tracebacks, no NaN
passed as a result, impossible sizes refused up front (README "Errors and safety").

Faults are real where the machine allows: SIGINT to a running `exactlens train`, a file-size limit
(`ulimit -f`) while a checkpoint is written over a good one, a path whose parent is a file. Tests
that need an unwritable directory skip when running as root (root writes anywhere)."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from exactlens.analysis.hull import selectable_keys
from exactlens.analysis.verify import precision, verify
from exactlens.cli import main
from exactlens.constructions import get
from exactlens.errors import ExactLensError
from exactlens.model import ExactConfig, ExactTransformer, components
from exactlens.outputs import PARTIAL_TAG, check_output, staged, write_text
from exactlens.train import train

ROOT = Path(__file__).resolve().parents[1]
TINY = {"epochs": 2, "strings_per_epoch": 10, "test_strings": 10}


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every file under folder with its bytes (what "left exactly as it was" compares)."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def leftovers(parent: Path) -> list[str]:
    return [p.name for p in parent.iterdir() if PARTIAL_TAG in p.name or ".replaced-" in p.name]


def strict_json(text: str):
    def refuse(token):
        raise AssertionError(f"non-strict JSON token {token}")

    return json.loads(text, parse_constant=refuse)


def run_cli(*argv: str, timeout: float = 120):
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    return subprocess.run([sys.executable, "-m", "exactlens.cli", *argv], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout, env=env)


def assert_one_line_error(proc, *needles: str, code: int = 2) -> None:
    assert proc.returncode == code, (proc.returncode, proc.stderr[-2000:])
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.startswith("exactlens:")]
    assert lines, proc.stderr
    for needle in needles:
        assert needle in lines[-1], lines[-1]


# ---- the staging mechanism -------------------------------------------------------------------


def test_staged_directory_appears_only_when_complete(tmp_path):
    target = tmp_path / "out"
    with staged(target) as tmp:
        (tmp / "a.txt").write_text("a")
        assert not target.exists(), "the target must not exist while it is written"
        assert tmp.parent == tmp_path and PARTIAL_TAG in tmp.name
    assert snapshot(target) == {"a.txt": b"a"}
    assert leftovers(tmp_path) == []


@pytest.mark.parametrize("fault", [RuntimeError("boom"), KeyboardInterrupt(), OSError(28, "No space left on device")])
def test_a_fault_while_writing_leaves_the_target_as_it_was(tmp_path, fault):
    target = tmp_path / "out"
    target.mkdir()
    (target / "old.txt").write_text("old")
    before = snapshot(target)
    with pytest.raises(type(fault)), staged(target, overwrite=True) as tmp:
        (tmp / "new.txt").write_text("half")
        raise fault
    assert snapshot(target) == before
    assert leftovers(tmp_path) == []
    # and a fault when nothing was there: nothing appears
    with pytest.raises(type(fault)), staged(tmp_path / "fresh") as tmp:
        raise fault
    assert not (tmp_path / "fresh").exists()


def test_existing_output_is_refused_without_overwrite_and_replaced_whole_with_it(tmp_path):
    target = tmp_path / "out"
    target.mkdir()
    (target / "old.txt").write_text("old")
    with pytest.raises(ExactLensError, match=r"already exists.*--overwrite"):
        with staged(target):
            raise AssertionError("the body must not run: the check comes first")
    with staged(target, overwrite=True) as tmp:
        (tmp / "new.txt").write_text("new")
    assert snapshot(target) == {"new.txt": b"new"}, "the old content must not be mixed with the new"
    (tmp_path / "empty").mkdir()
    with staged(tmp_path / "empty") as tmp:  # an empty directory is not "something already there"
        (tmp / "x").write_text("x")
    assert snapshot(tmp_path / "empty") == {"x": b"x"}


def test_file_outputs(tmp_path):
    path = tmp_path / "sub" / "page.html"
    write_text(path, "one")
    assert path.read_text() == "one"
    with pytest.raises(ExactLensError, match="already exists"):
        write_text(path, "two")
    write_text(path, "two", overwrite=True)
    assert path.read_text() == "two"
    with pytest.raises(ExactLensError, match="is a directory"):
        write_text(tmp_path / "sub", "x", overwrite=True)
    assert leftovers(tmp_path / "sub") == []


def test_unusable_paths_are_refused_before_any_work(tmp_path):
    (tmp_path / "afile").write_text("x")
    with pytest.raises(ExactLensError, match="is a file, not a directory"):
        check_output(tmp_path / "afile" / "out")
    with pytest.raises(ExactLensError, match="empty"):
        check_output("")
    if os.geteuid() != 0:
        locked = tmp_path / "locked"
        locked.mkdir()
        locked.chmod(0o500)
        try:
            with pytest.raises(ExactLensError, match="not writable"):
                check_output(locked / "out")
        finally:
            locked.chmod(0o700)


# ---- checkpoints and training runs -----------------------------------------------------------


def test_save_refuses_to_replace_and_refuses_nan(tmp_path):
    model = get("first").make()
    model.save(tmp_path / "ck")
    before = snapshot(tmp_path / "ck")
    with pytest.raises(ExactLensError, match="already exists"):
        model.save(tmp_path / "ck")
    broken = get("first").make()
    with torch.no_grad():
        broken.blocks[0].attn.W_Q[0, 0, 0] = float("nan")
    with pytest.raises(ExactLensError, match="NaN or inf"):
        broken.save(tmp_path / "ck", overwrite=True)
    assert snapshot(tmp_path / "ck") == before
    model.save(tmp_path / "ck", overwrite=True)
    ExactTransformer.load(tmp_path / "ck")


WRITE_BIG_CHECKPOINT = """
import resource, sys
from exactlens.model import ExactConfig, ExactTransformer
resource.setrlimit(resource.RLIMIT_FSIZE, (200_000, 200_000))  # ulimit -f: files up to 200 kB
cfg = ExactConfig(d_model=128, n_layers=2, n_heads=2, d_mlp=512, d_vocab=4, d_vocab_out=1)
ExactTransformer(cfg).init_weights(seed=0).save(sys.argv[1], overwrite=True)
"""


@pytest.mark.skipif(sys.platform != "linux", reason="RLIMIT_FSIZE semantics checked on Linux")
def test_a_full_disk_while_saving_keeps_the_old_checkpoint(tmp_path):
    """A checkpoint larger than the file-size limit written over a good one: the write fails, the old
    checkpoint loads unchanged and no partial directory is left."""
    get("first").make().save(tmp_path / "ck")
    before = snapshot(tmp_path / "ck")
    proc = subprocess.run([sys.executable, "-c", WRITE_BIG_CHECKPOINT, str(tmp_path / "ck")], capture_output=True,
                          text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
    assert proc.returncode != 0, "the write must fail under the file-size limit"
    assert snapshot(tmp_path / "ck") == before
    ExactTransformer.load(tmp_path / "ck")
    assert leftovers(tmp_path) == []


def test_train_writes_a_complete_run_and_refuses_an_existing_one(tmp_path):
    run = train("first", out=tmp_path / "run", **TINY)
    assert run.checkpoint == tmp_path / "run"
    assert sorted(snapshot(tmp_path / "run")) == ["config.json", "history.jsonl", "run.json", "weights.pt"]
    before = snapshot(tmp_path / "run")
    with pytest.raises(ExactLensError, match="already exists"):
        train("first", out=tmp_path / "run", **TINY)
    assert snapshot(tmp_path / "run") == before
    again = train("first", out=tmp_path / "run", overwrite=True, seed=1, **TINY)
    assert json.loads((again.checkpoint / "run.json").read_text())["seed"] == 1
    assert leftovers(tmp_path) == []


def test_training_stops_at_the_first_non_finite_loss_and_saves_nothing(tmp_path):
    with pytest.raises(ExactLensError, match=r"non-finite at step \d+|became non-finite by step \d+"):
        train("first", out=tmp_path / "run", lr=1e30, **TINY)
    assert not (tmp_path / "run").exists()
    assert leftovers(tmp_path) == []
    for bad in ({"lr": float("inf")}, {"ln_eps": float("inf")}, {"lr": float("nan")}, {"grad_clip": -1.0}):
        with pytest.raises(ExactLensError, match="finite number"):
            train("first", **bad, **TINY)


def _wait_for(proc: subprocess.Popen, text: str, timeout: float = 120) -> str:
    """Read the child's stderr (bytes, as it comes) until ``text`` appears."""
    seen = b""
    end = time.monotonic() + timeout
    fd = proc.stderr.fileno()
    while time.monotonic() < end:
        ready, _, _ = select.select([fd], [], [], 0.1)
        if ready:
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            seen += chunk
            if text.encode() in seen:
                return seen.decode()
        elif proc.poll() is not None:
            break
    raise AssertionError(f"never saw {text!r}; stderr so far: {seen[-2000:]!r}")


@pytest.mark.parametrize("existing", [False, True])
def test_ctrl_c_during_training_leaves_the_target_as_it_was(tmp_path, existing):
    target = tmp_path / "run"
    if existing:
        train("first", out=target, **TINY)
    before = snapshot(target) if existing else None
    argv = ["train", "first", "--out", str(target), "--epochs", "100000", "--strings-per-epoch", "10",
            "--test-strings", "10", "--eval-every", "1", "--test-length", "20", "--overwrite"]  # within the work limit
    # A shell starts background jobs with SIGINT ignored, and children inherit that (Python then installs no
    # KeyboardInterrupt handler): give the child the default disposition, as a terminal would.
    proc = subprocess.Popen([sys.executable, "-m", "exactlens.cli", *argv], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        _wait_for(proc, "epoch 3/")  # training is under way, history records written
        proc.send_signal(signal.SIGINT)
        _, err_bytes = proc.communicate(timeout=60)
        err = err_bytes.decode()
    finally:
        proc.kill()
    assert proc.returncode == 130, err[-2000:]
    assert "Traceback" not in err and "interrupted" in err
    if existing:
        assert snapshot(target) == before
    else:
        assert not target.exists()
    assert leftovers(tmp_path) == []


# ---- the CLI's promise -----------------------------------------------------------------------


def test_cli_filesystem_errors_are_one_line(tmp_path):
    (tmp_path / "afile").write_text("x")
    proc = run_cli("train", "first", "--out", str(tmp_path / "afile" / "run"), "--epochs", "1")
    assert_one_line_error(proc, "is a file, not a directory")
    proc = run_cli("diff", "first-flawed", "--against", "first", "--lengths", "2", "--html",
                   str(tmp_path / "afile" / "page.html"))
    assert_one_line_error(proc, "is a file, not a directory")
    assert "diff: ran" not in proc.stderr, "the page must be checked before the diff is computed"
    (tmp_path / "report").mkdir()
    (tmp_path / "report" / "index.html").write_text("old")
    proc = run_cli("report", "first", "--quick", "--out", str(tmp_path / "report"))
    assert_one_line_error(proc, "already exists", "--overwrite")
    assert (tmp_path / "report" / "index.html").read_text() == "old"


def test_cli_prints_the_json_before_writing_optional_files(tmp_path, monkeypatch, capsys):
    import exactlens.viz.diff_page as diff_cli  # the verb imports it when it runs

    def full_disk(*args, **kwargs):
        raise OSError(28, "No space left on device", str(tmp_path / "page.html"))

    monkeypatch.setattr(diff_cli, "write_diff_page", full_disk)
    code = main(["diff", "first-flawed", "--against", "first", "--lengths", "2", "--parts", "behaviour", "--json",
                 "--html", str(tmp_path / "page.html")])
    out, err = capsys.readouterr()
    assert code == 2
    assert strict_json(out)["summary"]["agreement"] is not None, "the computed result must not be lost"
    assert "No space left on device" in err and "Traceback" not in err


def test_cli_memory_and_interrupt_errors_are_one_line(monkeypatch, capsys):
    import exactlens.analysis.verify as verify_cli  # the verb imports it when it runs

    for fault, code, text in ((MemoryError(), 2, "out of memory"),
                              (RuntimeError("DefaultCPUAllocator: can't allocate memory"), 2, "out of memory"),
                              (KeyboardInterrupt(), 130, "interrupted")):
        def raise_fault(*args, fault=fault, **kwargs):
            raise fault

        monkeypatch.setattr(verify_cli, "verify", raise_fault)
        assert main(["verify", "parity", "--lengths", "2"]) == code
        err = capsys.readouterr().err
        assert text in err and "Traceback" not in err
    with pytest.raises(KeyboardInterrupt):  # --debug shows the real thing
        main(["--debug", "verify", "parity", "--lengths", "2"])
    with pytest.raises(RuntimeError):  # a bug (not memory) is never hidden
        monkeypatch.setattr(verify_cli, "verify", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("a bug")))
        main(["verify", "parity", "--lengths", "2"])


# ---- no NaN passed as a result ---------------------------------------------------------------


def test_verify_never_reads_a_decision_from_non_finite_outputs():
    result = verify("parity", [3, 4], params={"c": 1e308})
    for row in result["results"]:
        assert row["accuracy"] is None and row["non_finite_words"] == row["strings"]
    proc = run_cli("verify", "parity", "--param", "c=1e308", "--lengths", "3", "--json")
    assert_one_line_error(proc, "NaN or infinite outputs")
    assert strict_json(proc.stdout)["results"][0]["accuracy"] is None


def test_a_config_with_non_finite_numbers_is_refused():
    for field in ("ln_eps", "hard_tie_tolerance"):
        with pytest.raises(ExactLensError, match=f"{field} must be a finite number"):
            ExactConfig(d_model=4, n_layers=1, n_heads=1, d_vocab=3, **{field: float("inf")})


# ---- sizes -----------------------------------------------------------------------------------


def test_impossible_sizes_are_refused_up_front():
    start = time.perf_counter()
    with pytest.raises(ExactLensError, match="work limit"):
        verify("parity", [10_000_000], strings=1)
    with pytest.raises(ExactLensError, match="work limit"):  # each length alone would pass the per-call check
        precision("parity", max_length=300_000)
    with pytest.raises(ExactLensError, match="memory limit"):
        ExactTransformer(ExactConfig(d_model=200_000, n_layers=2, n_heads=1, d_mlp=800_000, d_vocab=3))
    with pytest.raises(ExactLensError, match="work limit"):
        selectable_keys(np.zeros((1_000_000, 4)))
    assert time.perf_counter() - start < 5, "refusals must not start the work"


def test_a_checkpoint_too_big_for_memory_is_refused_before_allocation(tmp_path):
    folder = tmp_path / "ck"
    folder.mkdir()
    cfg = ExactConfig(d_model=8, n_layers=1, n_heads=1, d_vocab=3).to_dict()
    cfg.update(d_model=200_000, d_mlp=800_000)
    (folder / "config.json").write_text(json.dumps(cfg))
    (folder / "weights.pt").write_bytes(b"")
    with pytest.raises(ExactLensError, match="memory limit"):
        ExactTransformer.load(folder)


def test_the_memory_limit_can_be_set(monkeypatch):
    model = get("parity").make()
    monkeypatch.setenv("EXACTLENS_MEMORY_LIMIT", "1M")
    ids = torch.zeros(64, 2000, dtype=torch.long)
    with pytest.raises(ExactLensError, match=r"memory limit of 1\.0 MiB.*fewer words"):
        model(ids)
    monkeypatch.setenv("EXACTLENS_MEMORY_LIMIT", "lots")
    with pytest.raises(ExactLensError, match="is not a size"):
        model(ids[:1, :4])


@pytest.mark.parametrize("name", ["parity", "first-log", "dyck1", "induction-recent", "palindrome-hash", "one"])
def test_attention_in_query_blocks_gives_the_same_values(name, monkeypatch):
    """Long inputs are computed a block of queries at a time (what lets verify run 10^5 positions):
    the same numbers as the one-block computation, for masks, hard attention and length scaling."""
    construction = get(name)
    model = construction.make(dtype="float64")
    task = construction.lang()
    n = max(construction.min_length if hasattr(construction, "min_length") else 1, 24)
    ids = task.sample(n, 8, torch.Generator().manual_seed(0))
    tokens = task.encode(ids).tokens
    whole = model(tokens)
    monkeypatch.setattr(components, "QUERY_CHUNK_BYTES", 64)  # a few queries per block
    blocked = model(tokens)
    torch.testing.assert_close(blocked, whole, rtol=0, atol=1e-12, equal_nan=True)


# ---- smaller ---------------------------------------------------------------------------------


def test_float_symbol_ids_are_refused_not_truncated():
    task = get("parity").lang()
    with pytest.raises(ExactLensError, match="integer tensor"):
        task.encode(torch.tensor([[0.5, 1.0]]))


@pytest.mark.parametrize("factor", [1e300, 1e-300, 1e-318])
def test_hull_is_scale_invariant_at_the_ends_of_float64(factor):
    rng = np.random.default_rng(0)
    keys = rng.normal(size=(30, 3))
    keys = np.vstack([keys, keys[:5].mean(0, keepdims=True)])  # one key inside the hull
    reference = selectable_keys(keys)
    scaled = selectable_keys(keys * factor)
    assert (scaled.selectable == reference.selectable).all()
    assert scaled.n_unselectable >= 1
    picked = scaled.selectable
    assert (np.linalg.norm(scaled.queries[picked], axis=1) > 0).all(), "a selectable key needs a nonzero query"
    assert (scaled.margins[picked] > 0).all()
    np.testing.assert_allclose(scaled.margins[picked] / factor, reference.margins[picked], rtol=1e-3)


def test_a_directory_named_like_a_construction(tmp_path, monkeypatch):
    from exactlens.analysis.diff import diff

    monkeypatch.chdir(tmp_path)
    (tmp_path / "first").mkdir()  # not a checkpoint: the name still means the construction
    assert diff("first", "first", lengths=[2], parts=("behaviour",))["trained"]["kind"] == "construction"
    get("first").make().save(tmp_path / "first", overwrite=True)
    with pytest.raises(ExactLensError, match=r"both a construction and a checkpoint.*\./first"):
        diff("first", "first", lengths=[2], parts=("behaviour",))
    assert diff("./first", "first", lengths=[2], parts=("behaviour",))["trained"]["kind"] == "checkpoint"


def test_checkpoint_errors_name_the_problem(tmp_path):
    get("first").make().save(tmp_path / "ck")
    (tmp_path / "ck" / "config.json").write_text(json.dumps({**json.loads((tmp_path / "ck" / "config.json")
                                                              .read_text()), "positional_features": 5}))
    with pytest.raises(ExactLensError, match=r"config\.json.*(does not describe a model|positional)"):
        ExactTransformer.load(tmp_path / "ck")
    (tmp_path / "ck" / "config.json").unlink()
    (tmp_path / "ck" / "config.json").mkdir()
    with pytest.raises(ExactLensError, match=r"config\.json"):
        ExactTransformer.load(tmp_path / "ck")


class _Payload:
    def __reduce__(self):
        return (os.system, ("touch PWNED",))


def test_a_malicious_pickle_is_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    get("first").make().save(tmp_path / "ck")
    torch.save({"x": _Payload()}, tmp_path / "ck" / "weights.pt")
    with pytest.raises(ExactLensError, match="weights_only"):
        ExactTransformer.load(tmp_path / "ck")
    assert not (tmp_path / "PWNED").exists()

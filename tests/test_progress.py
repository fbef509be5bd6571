"""Progress bars: tqdm on stderr where a person can see them, never with --quiet, never on stdout."""

from __future__ import annotations

import io
import json
import os

import pytest

from exactlens import progress
from exactlens.cli import main


class FakeTerminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture
def bars(monkeypatch):
    """Every bar made, with its settings (the real tqdm still runs, disabled, so loops behave)."""
    made = []
    real = progress.tqdm

    def recording(iterable=None, **kwargs):
        made.append(kwargs)
        return real(iterable, **{**kwargs, "disable": True})

    monkeypatch.setattr(progress, "tqdm", recording)
    yield made
    progress.set_quiet(False)


def test_when_a_bar_shows(monkeypatch):
    progress.set_quiet(False)
    assert progress.shows(5) is None, "None: tqdm's rule (shown on a terminal)"
    assert progress.shows(1) is True, "no bar for a single item"
    progress.set_quiet(True)
    assert progress.shows(5) is True
    progress.set_quiet(False)
    monkeypatch.setenv("EXACTLENS_QUIET", "1")
    assert progress.shows(5) is True
    monkeypatch.delenv("EXACTLENS_QUIET")
    assert progress.tqdm(range(3), file=io.StringIO(), disable=progress.shows(3)).disable, \
        "off a terminal (a pipe, a CI log) tqdm shows nothing"
    shown = progress.tqdm(range(3), file=FakeTerminal(), disable=progress.shows(3))
    assert not shown.disable


def test_long_loops_have_bars_on_stderr(bars, capsys):
    from exactlens.train import train

    train("first", epochs=3, strings_per_epoch=10, test_strings=10)
    assert main(["verify", "parity", "--lengths", "2:5", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["name"] == "parity", "--json: stdout is one JSON object"
    descriptions = [b["desc"] for b in bars]
    assert "train first" in descriptions and "verify" in descriptions
    assert all(b["file"] is progress.sys.stderr for b in bars)


def test_quiet_turns_every_bar_off(bars):
    assert main(["--quiet", "verify", "parity", "--lengths", "2:5"]) == 0
    assert progress.is_quiet()
    assert bars and all(b["disable"] is True for b in bars)


# ---- Jupyter: the widget only with ipywidgets, else text, never tqdm.auto's "IProgress not found" ----


def test_which_bar_where():
    from tqdm.notebook import tqdm as widget_bar
    from tqdm.std import tqdm as text_bar

    assert progress.bar_class(jupyter=True, widgets=True) is widget_bar
    assert progress.bar_class(jupyter=True, widgets=False) is text_bar, "no ipywidgets: text, not a broken widget"
    assert progress.bar_class(jupyter=False, widgets=True) is text_bar, "a terminal gets text"
    assert not progress.JUPYTER and progress.tqdm is text_bar, "pytest is no Jupyter kernel"
    progress.set_quiet(False)
    assert progress.shows(5, jupyter=True) is False, "Jupyter: shown although its stderr is no terminal"
    assert progress.shows(5, jupyter=False) is None
    assert progress.shows(1, jupyter=True) is True


KERNEL_CELL = """
import warnings
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    from exactlens import progress
    for _ in progress.bar(range(3), desc="jupyter-bar-check"):
        pass
print(progress.JUPYTER, progress.widgets_installed(), type(progress.bar(range(3), desc="x")).__module__)
print("warnings:", [str(w.message) for w in caught])
with warnings.catch_warnings(record=True) as auto:
    warnings.simplefilter("always")
    import tqdm.auto
print("tqdm.auto warnings:", [str(w.message) for w in auto])
"""


@pytest.mark.notebook
def test_a_jupyter_kernel_gets_a_bar_and_no_warning(tmp_path, monkeypatch):
    """In a real kernel (this interpreter, through nbclient): the bar is the widget where ipywidgets
    is installed, else text on stderr, and importing exactlens.progress warns nothing; tqdm.auto in
    the same kernel shows what is avoided (its "IProgress not found" warning without ipywidgets)."""
    import json
    import sys
    from pathlib import Path

    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    spec_dir = tmp_path / "jupyter" / "kernels" / "python3"
    spec_dir.mkdir(parents=True)
    argv = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    (spec_dir / "kernel.json").write_text(json.dumps({"argv": argv, "display_name": "test", "language": "python"}))
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
    monkeypatch.setenv("PYTHONPATH", str(Path(__file__).resolve().parents[1] / "src"))
    monkeypatch.setenv("PYDEVD_DISABLE_FILE_VALIDATION", "1")
    monkeypatch.delenv("EXACTLENS_QUIET", raising=False)
    nb = nbformat.v4.new_notebook()
    nb.cells.append(nbformat.v4.new_code_cell(KERNEL_CELL))
    nbclient.NotebookClient(nb, timeout=120, kernel_name="python3").execute()
    outputs = nb.cells[0].outputs
    stdout = "".join(o["text"] for o in outputs if o.get("name") == "stdout").splitlines()
    stderr = "".join(o["text"] for o in outputs if o.get("name") == "stderr")
    jupyter, widgets, module = stdout[0].split()
    assert jupyter == "True"
    assert stdout[1] == "warnings: []", stdout[1]
    if widgets == "True":
        assert module == "tqdm.notebook"
    else:
        assert module == "tqdm.std"
        assert "jupyter-bar-check:" in stderr and "0/3" in stderr, f"no text bar on the kernel's stderr: {stderr!r}"
        assert "IProgress not found" in stdout[2], "tqdm.auto no longer warns here: the check above proves nothing"


# ---- training: a bar with rate, time left and the latest figures; lines only where no bar shows ----


class SizedTerminal(FakeTerminal):
    """A terminal with a file descriptor (the size is monkeypatched)."""

    def fileno(self) -> int:
        return 2


def on_terminal(monkeypatch) -> FakeTerminal:
    """From here on stderr is a terminal: bars show (tqdm's own rule), drawn into the buffer returned.
    (Called in the test itself: pytest sets its own sys.stderr again between a fixture and the test.)"""
    screen = FakeTerminal()
    monkeypatch.setattr(progress.sys, "stderr", screen)
    monkeypatch.delenv("EXACTLENS_QUIET", raising=False)
    progress.set_quiet(False)
    return screen


@pytest.fixture
def postfixes(monkeypatch):
    """Every set_postfix of every bar, in order (the real bar still draws)."""
    seen = []

    class Recording(progress.text_bar):
        def set_postfix(self, ordered_dict=None, refresh=True, **kwargs):
            seen.append((self.desc, dict(ordered_dict or {}, **kwargs)))
            super().set_postfix(ordered_dict, refresh=refresh, **kwargs)

    monkeypatch.setattr(progress, "tqdm", Recording)
    return seen


def test_training_bar_shows_rate_time_left_and_the_latest_figures(monkeypatch, postfixes):
    terminal = on_terminal(monkeypatch)
    from exactlens.train import train

    run = train("first", epochs=4, strings_per_epoch=10, test_strings=10, eval_every=2)
    drawn = terminal.getvalue()
    assert "train first" in drawn and "epoch/s" in drawn, "the rate"
    assert "0/4 [00:00<" in drawn, "elapsed<time left"
    last = postfixes[-1][1]
    final = run.history[-1]
    assert last == {"loss_bits": f"{final['train_loss_bits']:.4f}", "acc": f"{final['train_accuracy']:.3f}",
                    "test_acc": f"{final['test_accuracy']:.3f}"}
    assert "test_acc" not in postfixes[0][1], "no test figure before the first evaluation"
    assert not progress.showing(), "the bar is closed after training"


def test_several_seeds_show_the_mean_of_the_runs(monkeypatch, postfixes):
    on_terminal(monkeypatch)
    from exactlens.train import train_many

    runs = train_many("first", [0, 1], epochs=2, strings_per_epoch=10, test_strings=10)
    desc, last = postfixes[-1]
    assert desc == "train first (2 seeds, mean)"
    for key, field, form in (("loss_bits", "train_loss_bits", "{:.4f}"), ("test_acc", "test_accuracy", "{:.3f}")):
        assert last[key] == form.format(sum(r.history[-1][field] for r in runs) / 2)


def test_lbfgs_has_a_bar_per_seed(monkeypatch, postfixes):
    terminal = on_terminal(monkeypatch)
    from exactlens.train import train

    run = train("first", optimizer="lbfgs", epochs=3, strings_per_epoch=10, test_strings=10, seed=4)
    assert postfixes and all(desc == "train first seed 4" for desc, _ in postfixes)
    assert postfixes[-1][1]["loss_bits"] == f"{run.history[-1]['train_loss_bits']:.4f}"
    assert "iter/s" in terminal.getvalue()


def test_cli_prints_evaluation_lines_only_where_no_bar_shows(tmp_path, capsys, monkeypatch):
    args = ["train", "first", "--epochs", "4", "--eval-every", "2", "--strings-per-epoch", "10", "--test-strings",
            "10"]
    assert main([*args, "--out", str(tmp_path / "log")]) == 0  # stderr is captured: no terminal, no bar
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("first seed 0 epoch")]
    assert [line.split(":")[0] for line in lines] == ["first seed 0 epoch 2/4", "first seed 0 epoch 4/4"]
    screen = on_terminal(monkeypatch)
    assert main([*args, "--out", str(tmp_path / "terminal")]) == 0
    assert "train first" in screen.getvalue(), "the bar"
    assert "first seed 0 epoch" not in screen.getvalue() + capsys.readouterr().err, "the bar replaces the lines"


def test_printing_while_a_bar_shows_clears_and_redraws_it(monkeypatch):
    terminal = on_terminal(monkeypatch)
    shown = progress.bar(range(3), desc="outer")
    assert progress.showing()
    before = len(terminal.getvalue())
    with progress.printing_around_bars():
        terminal.write("a line\n")
    after = terminal.getvalue()[before:]
    assert after.index("a line") > 0 and "outer" in after.split("a line")[1], "cleared before, redrawn after"
    shown.close()
    assert not progress.showing()


def test_a_terminal_without_a_size_gets_a_fixed_one(monkeypatch):
    """A pseudo-terminal that reports 0 x 0 (script, some CI runners): tqdm would draw nothing there."""
    monkeypatch.setattr(progress.os, "get_terminal_size", lambda fd=None: os.terminal_size((0, 0)))
    monkeypatch.setenv("COLUMNS", "100")
    monkeypatch.setenv("LINES", "30")
    assert progress._width(SizedTerminal()) == {"ncols": 100, "nrows": 30}
    monkeypatch.setattr(progress.os, "get_terminal_size", lambda fd=None: os.terminal_size((120, 40)))
    assert progress._width(SizedTerminal()) == {"dynamic_ncols": True}
    assert progress._width(io.StringIO()) == {"dynamic_ncols": True}, "no file descriptor: tqdm decides"
    monkeypatch.setattr(progress.sys, "stderr", SizedTerminal())
    monkeypatch.setattr(progress.os, "get_terminal_size", lambda fd=None: os.terminal_size((0, 0)))
    progress.set_quiet(False)
    made = progress.bar(range(3), desc="sized")
    assert made.ncols == 100 and made.nrows == 30
    made.close()
def test_one_message_helper_on_stderr(capsys):
    from exactlens.cli import common
    from exactlens.viz import page

    progress.say("step done")
    progress.say("hidden", quiet=True)
    out, err = capsys.readouterr()
    assert out == "" and err == "step done\n", "messages go to stderr only, none when quiet"
    assert common.progress is progress.say and page.progress is progress.say, "one helper, re-exported"

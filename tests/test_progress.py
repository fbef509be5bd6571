"""Progress bars: tqdm on stderr where a person can see them, never with --quiet, never on stdout."""

from __future__ import annotations

import io
import json

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


def test_one_message_helper_on_stderr(capsys):
    from exactlens.cli import common
    from exactlens.viz import page

    progress.say("step done")
    progress.say("hidden", quiet=True)
    out, err = capsys.readouterr()
    assert out == "" and err == "step done\n", "messages go to stderr only, none when quiet"
    assert common.progress is progress.say and page.progress is progress.say, "one helper, re-exported"

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

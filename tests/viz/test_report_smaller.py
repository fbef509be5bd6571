"""The full report's stated smaller settings: a construction whose discovery rows run at fewer words per length says
so, with the reason, on the circuit-discovery section, in its rows and in the section's data."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from exactlens.analysis.circuit import evaluate
from exactlens.analysis.circuit.evaluate import catalogue
from exactlens.viz import circuit_sections
from exactlens.viz.page import build_report


def test_a_smaller_discovery_setting_is_stated_on_the_page(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(circuit_sections, "SMALLER", {"one": {"words": 8}})
    monkeypatch.setattr(circuit_sections, "SMALLER_WHY", "a test's reason")
    calls = []

    def spy(names, **options):  # the catalogue as it is, its settings recorded
        calls.append((tuple(names), options["words"], options["span"]))
        return catalogue(names, **options)

    monkeypatch.setattr(evaluate, "catalogue", spy)
    index = build_report(["one", "first"], tmp_path / "r", builders=[circuit_sections.discovery_sections], jobs=1)
    page = index.read_text(encoding="utf-8")
    assert "Stated smaller setting: <b>one</b> at 8 words per length (the others 32): a test&#x27;s reason" in page \
        or "Stated smaller setting: <b>one</b> at 8 words per length (the others 32): a test's reason" in page
    assert "one (8 words)" in page and "first (" not in page
    data = json.loads((tmp_path / "r" / "data" / "circuit_discovery.json").read_text(encoding="utf-8"))
    assert data["settings"]["smaller"] == {"one": {"words": 8, "reason": "a test's reason"}}
    words = {(r["construction"], r["words"]) for r in data["rows"]}
    assert words == {("one", 8), ("first", 32)}, words
    assert sorted(calls) == [(("first",), 32, 4), (("one",), 8, 4)], calls


def test_the_quick_report_states_no_smaller_setting(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(circuit_sections, "SMALLER", {"one": {"words": 8}})
    index = build_report(["one"], tmp_path / "r", quick=True, builders=[circuit_sections.discovery_sections], jobs=1)
    assert "Stated smaller setting" not in index.read_text(encoding="utf-8")
    data = json.loads((tmp_path / "r" / "data" / "circuit_discovery.json").read_text(encoding="utf-8"))
    assert data["settings"]["smaller"] == {} and {r["words"] for r in data["rows"]} == {16}

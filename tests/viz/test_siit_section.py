"""The report's "Known circuits on trained weights" section (exactlens.viz.siit_sections): a SIIT-trained
FIRST beside a plain run and the exact weights."""

from __future__ import annotations

import json
import re

from exactlens.viz.page import build_report
from exactlens.viz.siit_sections import QUICK_METHODS, siit_sections


def test_known_circuits_section(tmp_path) -> None:
    index = build_report(["first"], tmp_path / "r", quick=True, builders=[siit_sections])
    out = index.parent
    html = index.read_text(encoding="utf-8")
    assert "Known circuits on trained weights" in html and "Discovery on trained weights" in html
    for link in re.findall(r'(?:src|href)="([^"#]+)"', html):
        assert (out / link).is_file(), link
    assert (out / "figures" / "siit-attention-exact.png").is_file()
    assert (out / "figures" / "siit-attention-siit.png").is_file()
    data = json.loads((out / "data" / "known-circuits.json").read_text(encoding="utf-8"))
    assert set(data["siit"]["measured"]["interchange"]) == {"I[w_i=1 & i=1]", "s"}
    assert [row["method"] for row in data["discovery"]] == list(QUICK_METHODS)
    row = data["discovery"][0]
    assert row["exact"]["edge_auroc"] is not None and row["SIIT"]["edge_auroc"] is not None
    # the plain run is measured with the SIIT run's mapping: the same variables and components
    assert set(data["plain"]["interchange"]) == set(data["siit"]["measured"]["interchange"])
    assert set(data["plain"]["resample_decision_change"]) == set(data["siit"]["measured"]["resample_decision_change"])
    report = json.loads((out / "data" / "report.json").read_text(encoding="utf-8"))
    assert report["errors"] == [] and report["settings"]["known_circuits"]["methods"] == list(QUICK_METHODS)


def test_no_section_without_first(tmp_path) -> None:
    index = build_report(["one"], tmp_path / "r", quick=True, builders=[siit_sections])
    assert "Known circuits on trained weights" not in index.read_text(encoding="utf-8")

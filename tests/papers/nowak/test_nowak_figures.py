"""Nowak et al. Fig. 2 data, the signal-vs-rounding table and the report section (small settings)."""

from __future__ import annotations

from pathlib import Path

import pytest

from exactlens.errors import ExactLensError
from exactlens.papers.nowak.figures import fig2_data, plot_fig2, signal_and_rounding
from exactlens.papers.nowak.report import nowak_sections
from exactlens.viz.page import QUICK, ReportContext


def test_fig2_data_shape_and_the_faithful_cliff(tmp_path):
    data = fig2_data(max_length=50, strings=16)
    assert data["lengths"] == list(range(1, 51))
    assert set(data["curves"]) == {
        f"{c} / {d}" for c in ("palindrome", "palindrome-robust") for d in ("float32", "float64")
    }
    for curve in data["curves"].values():
        assert len(curve["accuracy"]) == 50 and all(0.0 <= a <= 1.0 for a in curve["accuracy"])
    # exact up to the paper's 37 in every curve; the faithful float32 curve breaks before 50 (2^-n vs rounding)
    assert all(min(c["accuracy"][:37]) == 1.0 for c in data["curves"].values())
    assert data["curves"]["palindrome / float32"]["first_error_length"] is not None
    assert data["curves"]["palindrome-robust / float32"]["first_error_length"] is None
    png = plot_fig2(data, tmp_path / "fig.png")
    assert png.stat().st_size > 1000


def test_signal_and_rounding_rows():
    rows = signal_and_rounding([10, 60], "float32")
    assert rows[0]["largest_palindrome_abs_s"] < rows[0]["threshold"] < rows[0]["smallest_negative_abs_s"]
    assert rows[1]["largest_palindrome_abs_s"] >= rows[1]["threshold"]  # past the float32 cliff


def test_fig2_bad_input():
    with pytest.raises(ExactLensError, match="max_length must be an integer >= 1"):
        fig2_data(max_length=0)
    with pytest.raises(ExactLensError, match="strings must be an integer >= 1"):
        fig2_data(strings=0)


def test_report_section(tmp_path: Path):
    ctx = ReportContext(out_dir=tmp_path, names=["palindrome"], quick=True, settings=QUICK)
    sections = nowak_sections(ctx)
    assert len(sections) == 1 and not ctx.errors
    assert "precision cliff" in sections[0].html and (tmp_path / "figures" / "nowak_fig2.png").exists()
    assert nowak_sections(ReportContext(out_dir=tmp_path, names=["parity"], quick=True, settings=QUICK)) == []

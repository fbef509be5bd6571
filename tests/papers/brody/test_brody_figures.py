"""Brody et al. (2023) Fig. 1c/1d plot."""

from exactlens.papers.brody.figures import fig1_data, plot_fig1


def test_plot_fig1_writes_a_png(tmp_path):
    data = fig1_data(ns=(4, 8), ds=(3, 4), trials=2)
    path = plot_fig1(data, tmp_path / "fig1.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

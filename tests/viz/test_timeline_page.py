"""The timeline's figure, IIA strip and page, from a hand-made timeline result (the agreed JSON shape)."""

from __future__ import annotations

import math
import re

import pytest

from exactlens.errors import ExactLensError
from exactlens.viz.timeline import (
    checkpoint_table,
    events,
    iia_strip_figure,
    pick_checkpoints,
    timeline_figure,
    timeline_html,
    variables,
    write_timeline_page,
)


def _checkpoint(step: int, iia: float | None, accuracy: float | None) -> dict:
    ci = None if iia is None else [max(0.0, iia - 0.1), min(1.0, iia + 0.05)]
    return {
        "step": step, "epoch": step, "accuracy": accuracy, "agreement": accuracy, "long_accuracy": None,
        "probes": {"first_symbol": {"r2": iia, "site": "blocks.0.hook_resid_post"}},
        "verdicts": {
            "first_symbol": {"verdict": "computed" if iia and iia > 0.9 else "not found",
                             "site": "blocks.0.hook_resid_post", "position": "cls", "dim": 1, "iia": iia,
                             "iia_ci": ci, "changed_pairs": 40, "lift": iia, "random_iia_p95": 0.3},
            "answer": {"verdict": None, "site": None, "position": None, "dim": None, "iia": None, "iia_ci": None,
                       "changed_pairs": 0, "lift": None, "random_iia_p95": None},
        },
        "attention": {"tv_distance": {"L0H0": 0.5}, "cls_to_first": 0.2},
        "circuit_overlap": None if step == 0 else 0.5, "seconds": 1.5,
    }


@pytest.fixture
def timeline() -> dict:
    rows = [_checkpoint(0, 0.1, 0.5), _checkpoint(3, 0.5, 0.7), _checkpoint(30, 0.97, 0.995),
            _checkpoint(300, None, 1.0)]
    return {"kind": "timeline", "against": "first", "lengths": [4, 8], "long_lengths": [32],
            "checkpoints": rows,
            "events": {"variables": {"first_symbol": {"step": 30, "site": "blocks.0.hook_resid_post"},
                                     "answer": None},
                       "behaviour": 30, "long_behaviour": None, "circuit": 3,
                       "order": "first_symbol computed at step 30, with accuracy 0.99 at step 30"}}


def _lines(fig) -> list:
    return [line for ax in fig.axes for line in ax.get_lines()]


def test_figure_plots_every_metric_on_a_step_axis_that_shows_step_0(timeline: dict) -> None:
    fig = timeline_figure(timeline)
    top, bottom = fig.axes[:2]
    assert top.get_xscale() == "symlog" and bottom.get_xscale() == "symlog"
    assert top.get_xlim()[0] < 0 <= 300 < top.get_xlim()[1]  # step 0 and the last step are inside
    labels = [t.get_text() for t in top.get_legend().get_texts()]
    assert any("accuracy at |w| in [4, 8]" in t for t in labels) and any("agreement" in t for t in labels)
    assert not any("[32]" in t for t in labels)  # long accuracy is null everywhere: no curve, not zeros
    iia = next(line for line in bottom.get_lines() if line.get_label() == "first_symbol: IIA")
    y = list(iia.get_ydata())
    assert y[:3] == [0.1, 0.5, 0.97] and math.isnan(y[3])  # a null is a gap
    assert len(bottom.collections) >= 1  # the interval band
    # the events: a vertical line at each step that has one, labelled with it
    verticals = {tuple(line.get_xdata()) for line in top.get_lines() if len(set(line.get_xdata())) == 1}
    assert (30, 30) in verticals and (3, 3) in verticals
    notes = [t.get_text() for t in top.texts]
    assert any("first_symbol computed" in t and "step 30" in t for t in notes)
    assert any("circuit overlap final" in t for t in notes)
    assert not any("long accuracy" in t for t in notes)


def test_events_and_variables_are_read_robustly(timeline: dict) -> None:
    assert variables(timeline) == ["first_symbol", "answer"]
    assert [(s, label) for s, label, _ in events(timeline)] == [
        (3, "circuit overlap final"), (30, "first_symbol computed"), (30, "accuracy >= 0.99")]
    empty = {"kind": "timeline", "against": "first", "checkpoints": [], "events": None}
    assert events(empty) == [] and variables(empty) == []
    fig = timeline_figure(empty)  # nothing to draw is a picture that says so, not a crash
    assert any("no alignment verdicts" in t.get_text() for t in fig.axes[1].texts)
    assert iia_strip_figure(empty) is None


def test_strip_has_one_heat_map_per_checkpoint(timeline: dict) -> None:
    fig = iia_strip_figure(timeline)
    maps = [ax for ax in fig.axes if ax.get_title().startswith("step ")]
    assert [ax.get_title() for ax in maps] == ["step 0", "step 3", "step 30", "step 300"]
    grid = maps[2].images[0].get_array()
    assert grid[0, 0] == pytest.approx(0.97) and grid.mask[1, 0]  # 'answer' has no site: not measured
    # per-site rows where the timeline kept them
    timeline["checkpoints"][0]["alignment"] = [
        {"variable": "first_symbol", "site": "blocks.1.hook_resid_post", "iia_changed": 0.4},
        {"variable": "first_symbol", "site": "blocks.0.hook_resid_post", "iia_changed": 0.2},
        {"variable": "first_symbol", "site": "blocks.0.hook_resid_post", "iia_changed": None},  # not fit there
        {"variable": "first_symbol", "site": "blocks.1.hook_resid_post", "iia_changed": 0.1}]  # another position
    fig = iia_strip_figure(timeline)
    first = next(ax for ax in fig.axes if ax.get_title() == "step 0")
    assert [t.get_text() for t in first.get_xticklabels()] == ["0.resid_post", "1.resid_post"]
    assert list(first.images[0].get_array()[0]) == [0.2, 0.4]
    assert len([ax for ax in iia_strip_figure(timeline, most=2).axes if ax.get_title().startswith("step")]) == 2


def test_table_and_fragment(timeline: dict) -> None:
    text = checkpoint_table(timeline)
    assert text.count("<tr>") == 5 and "[0.87, 1.00]" in text and "–" in text
    page = timeline_html(timeline, "f/timeline.png", None, [("step 0", "f/a b.html")])
    assert 'src="f/timeline.png"' in page and "IIA per checkpoint" not in page
    assert "first_symbol computed at step 30" in page and "Not reached within the checkpoints: answer" in page
    assert 'src="f/a b.html"' in page
    timeline["against"] = "<script>"
    assert "<script>" not in timeline_html(timeline)


def test_pick_checkpoints() -> None:
    assert pick_checkpoints(0) == [] and pick_checkpoints(1) == [0] and pick_checkpoints(2) == [0, 1]
    assert pick_checkpoints(9) == [0, 4, 8]


def test_page_is_written_with_its_figures_and_attention_views(timeline: dict, tmp_path) -> None:
    from exactlens.constructions import get

    model = get("first").make()
    page = write_timeline_page(timeline, tmp_path / "t.html", [(0, model), (30, model), (300, model)])
    folder = tmp_path / "t_files"
    assert sorted(p.name for p in folder.iterdir()) == ["attention", "iia_strip.png", "timeline.png"]
    assert sorted(p.name for p in (folder / "attention").iterdir()) == [
        "exact.html", "step00000000.html", "step00000030.html", "step00000300.html"]
    html = page.read_text(encoding="utf-8")
    for link in re.findall(r'(?:src|href)="([^"]+)"', html):
        assert (tmp_path / link).is_file(), link
    view = (folder / "attention" / "step00000030.html").read_text(encoding="utf-8")
    assert "CLS" in view and "CircuitsVis" in view
    with pytest.raises(ExactLensError):  # an existing page is refused, and nothing is touched
        write_timeline_page(timeline, page)
    assert page.read_text(encoding="utf-8") == html
    write_timeline_page(timeline, page, overwrite=True)  # without models: no views
    assert not (folder / "attention").exists()


def test_figure_and_page_of_a_real_timeline(tmp_path) -> None:
    """A real (tiny) timeline: a FIRST run with three checkpoints against the exact ``first``; DAS left out
    (its cost), so the strip has nothing to draw and says so by being absent."""
    from exactlens.analysis.timeline import timeline
    from exactlens.train import train

    run = train("first", seed=0, epochs=3, strings_per_epoch=40, batch_size=20, train_length=[1, 6],
                test_length=12, test_strings=10, eval_every=0, lr=3e-3, checkpoints="0,2,6")
    data = timeline(run, "first", lengths=[2, 4], strings=6, long_lengths=[12], quiet=True, device="cpu",
                    parts=["behaviour", "attention", "circuit"])
    fig = timeline_figure(data)
    top = fig.axes[0]
    curves = {line.get_label(): list(line.get_xdata()) for line in top.get_lines()}
    assert curves["accuracy at |w| in [2, 4]"] == [0, 2, 6] and curves["accuracy at |w| in [12]"] == [0, 2, 6]
    assert "circuit overlap (edge Jaccard)" in curves
    assert iia_strip_figure(data) is None  # no alignment part: no verdicts
    page = write_timeline_page(data, tmp_path / "real.html", run.checkpoints)
    views = sorted(p.name for p in (tmp_path / "real_files" / "attention").iterdir())
    assert views == ["exact.html", "step00000000.html", "step00000002.html", "step00000006.html"]
    text = page.read_text(encoding="utf-8")
    assert text.count("<tr>") == 1 + 3 and data["events"]["order"].split(";")[0] in text


def test_el_timeline_writes_its_page_and_plots(tmp_path) -> None:
    """``el.timeline(..., html=FILE)`` (``exactlens timeline RUN --against NAME --html FILE``) on a run directory:
    the page with attention views of the first, middle and last checkpoint; ``.plot()`` is the timeline figure;
    an existing page is refused before any work."""
    import exactlens as el

    el.train("first", out=tmp_path / "run", seed=0, epochs=4, strings_per_epoch=40, batch_size=20,
             train_length=[1, 6], test_length=12, test_strings=10, eval_every=0, checkpoints="0,1,3,8")
    page = tmp_path / "page.html"
    result = el.timeline(str(tmp_path / "run"), "first", lengths=[2, 4], strings=6, device="cpu", html=page,
                         parts=["behaviour", "attention"])
    views = sorted(p.name for p in (tmp_path / "page_files" / "attention").iterdir())
    assert views == ["exact.html", "step00000000.html", "step00000001.html", "step00000008.html"]  # (4 - 1) // 2
    assert page.read_text(encoding="utf-8").count("<tr>") == 1 + 4
    fig = result.plot()
    assert fig.axes[0].get_xscale() == "symlog"
    with pytest.raises(ExactLensError, match="exists"):
        el.timeline(str(tmp_path / "run"), "first", lengths=[2], strings=6, device="cpu", html=page,
                    parts=["behaviour"])

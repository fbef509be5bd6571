"""The report's "Circuit formation" section: one timeline per task kind whose construction the report covers."""

from __future__ import annotations

import json
import re

from exactlens.viz.formation_sections import RUNS, checkpoint_steps, formation_sections, total_steps
from exactlens.viz.page import build_report


def test_checkpoint_steps_and_the_runs_train_with_adam() -> None:
    assert checkpoint_steps(200) == [0, 30, 200] and checkpoint_steps(1) == [0, 1]
    assert {spec.kind for spec in RUNS} == {"membership", "classification", "prediction", "regression"}
    for spec in RUNS:  # checkpoints are Adam steps: every run has some
        assert total_steps(spec.train_name, spec.options) >= 10


def test_section_of_one_task_kind(tmp_path) -> None:
    index = build_report(["first"], tmp_path / "r", quick=True, builders=[formation_sections])
    out = index.parent
    html = index.read_text(encoding="utf-8")
    assert "Circuit formation" in html and "membership" in html and "classification:" not in html
    data = json.loads((out / "data" / "formation-membership.json").read_text(encoding="utf-8"))
    assert [c["step"] for c in data["checkpoints"]] == checkpoint_steps(30)  # the quick run's 30 steps
    for link in re.findall(r'(?:src|href)="([^"#]+)"', html):
        assert (out / link).is_file(), link
    assert (out / "figures" / "formation-membership" / "timeline.png").is_file()
    assert len(list((out / "attention" / "formation-membership").glob("*.html"))) == 4  # 3 checkpoints + exact
    report = json.loads((out / "data" / "report.json").read_text(encoding="utf-8"))
    assert report["errors"] == [] and report["settings"]["formation"]["runs"] == {"membership": "first"}

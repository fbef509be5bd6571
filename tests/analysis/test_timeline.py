"""Circuit formation (exactlens.analysis.timeline, ``exactlens timeline``): the events from checkpoint rows,
the request built from the diff's, timelines of a run directory, a train result and a user's TransformerLens 4
checkpoints, and the refusals. The formation test on an untrained and an exact checkpoint (and warm start
against a cold fit) is slow."""

from __future__ import annotations

import copy
import dataclasses
import json

import pytest
import torch

import exactlens as el
from exactlens import tasks
from exactlens.analysis.diff import diff
from exactlens.analysis.diff.request import DiffRequest
from exactlens.analysis.timeline import TimelineRequest, timeline
from exactlens.analysis.timeline.events import events
from exactlens.cli import main
from exactlens.constructions import build
from exactlens.errors import ExactLensError
from exactlens.model import ExactTransformer
from exactlens.train import train, train_many

TINY = dict(epochs=3, strings_per_epoch=40, test_strings=20, dtype="float64")
QUICK = dict(lengths=[2, 3], strings=8, parts=("behaviour", "probes", "attention"))


def _row(step: int, accuracy: float, computed: bool, jaccard: float | None = None, lower: float = 0.95) -> dict:
    verdict = {"verdict": "computed" if computed else "not found", "site": "blocks.0.hook_mlp_out",
               "iia_ci": [lower if computed else 0.1, 1.0]}
    return {"step": step, "accuracy": accuracy, "long_accuracy": accuracy - 0.5, "verdicts": {"w1": verdict},
            "circuit_overlap": None if jaccard is None else {"edge_jaccard": jaccard}}


def test_events_are_the_first_step_from_which_a_condition_holds() -> None:
    rows = [_row(0, 0.5, False, 0.1), _row(10, 0.995, True, 0.5), _row(20, 0.9, False, 0.5),
            _row(40, 0.999, True, 0.8), _row(80, 1.0, True, 0.8)]
    found = events(rows, [64])
    assert found["variables"]["w1"] == {"step": 40, "site": "blocks.0.hook_mlp_out", "how": "computed"}  # not at 10
    assert found["behaviour"] == 40 and found["long_behaviour"] is None and found["circuit"] == 40
    assert found["order"].startswith("w1 computed at step 40, with accuracy 0.99, with circuit overlap")
    assert "never by the last checkpoint: length generalisation (accuracy 0.99 at lengths 64)" in found["order"]
    # a "computed" verdict whose interval's lower end is below 0.9 is not yet the event
    assert events([_row(0, 1.0, True, lower=0.85)])["variables"]["w1"] is None
    assert events([_row(0, 1.0, True), _row(5, 1.0, False)])["variables"]["w1"] is None
    # no overlap with the exact circuit at the end dates nothing (it would "settle" at step 0)
    none = events([_row(0, 0.5, False, 0.0), _row(10, 1.0, True, 0.0)])
    assert none["circuit"] is None and none["circuit_final_edge_jaccard"] == 0
    assert none["order"].endswith("the discovered circuit shares no edge with the exact one at the last checkpoint")
    # a metric no checkpoint measured (its part not asked for) is "not measured", never "never"
    unasked = [{**_row(0, 0.0, False, 0.5), "accuracy": None}, {**_row(10, 0.0, False, 0.5), "accuracy": None}]
    quiet = events(unasked, [64])
    assert quiet["behaviour"] is None and quiet["not_measured"] == ["behaviour"]
    never = "never by the last checkpoint: w1 computed, length generalisation (accuracy 0.99 at lengths 64);"
    assert never in quiet["order"]
    assert quiet["order"].endswith("; not measured: accuracy 0.99") and "never by the last checkpoint: accuracy" \
        not in quiet["order"]
    assert found["not_measured"] == []


def test_a_variable_that_is_the_answer_is_dated_where_it_reaches_the_readout() -> None:
    """FIRST's first symbol is the answer at [CLS]: its event is the first checkpoint from which it is there
    with the answer (interval's lower end >= 0.9), at the site where the answer arrives."""
    def row(step: int, verdict: str, lower: float, arrival: str | None) -> dict:
        line = {"verdict": verdict, "site": None, "iia_ci": [lower, 1.0], "answer_arrival": arrival}
        return {"step": step, "accuracy": 1.0, "verdicts": {"first symbol": line}}

    rows = [row(0, "model does not solve the task", 0.0, None),
            row(52, "indistinguishable from the answer", 0.83, "blocks.1.hook_attn_out"),
            row(139, "indistinguishable from the answer", 0.93, "blocks.1.hook_attn_out"),
            row(373, "indistinguishable from the answer", 0.93, "blocks.1.hook_attn_out")]
    found = events(rows)["variables"]["first symbol"]
    assert found == {"step": 139, "site": "blocks.1.hook_attn_out", "how": "arrives with the answer"}
    assert "first symbol at the readout with the answer (blocks.1.hook_attn_out) at step 139" in events(rows)["order"]
    assert events(rows[:2])["variables"]["first symbol"] is None  # [0.83, 1]: not yet
    no_site = [row(0, "indistinguishable from the answer", 0.95, None)]
    assert events(no_site)["variables"]["first symbol"] is None


def test_the_request_is_the_diffs_fields_with_the_timelines() -> None:
    from exactlens.analysis.diff.request import DiffOptions

    shared = {f.name: f for f in dataclasses.fields(DiffOptions)}
    own = {f.name: f for f in dataclasses.fields(TimelineRequest)}
    redeclared = {"target", "lengths", "parts", "untrained_baseline"}  # the timeline's own default or help
    assert issubclass(TimelineRequest, DiffOptions) and issubclass(DiffRequest, DiffOptions)
    assert list(own)[:len(shared)] == list(shared)  # every diff option, in the diff's order
    for name, f in shared.items():
        if name not in redeclared:
            assert own[name].metadata["option"] == f.metadata["option"], name
    assert {n for n in shared if own[n].metadata["option"] != shared[n].metadata["option"]} == redeclared
    assert own["untrained_baseline"].default is False and "alignment" in own["parts"].default
    assert {"long_lengths", "das_warm_steps", "steps", "model"} <= set(own)


def test_a_run_directory_through_the_command_line_and_a_train_result(tmp_path, capsys) -> None:
    result = el.train("first", out=tmp_path / "run", checkpoints="log:3", train_length=[1, 4], test_length=6, **TINY)
    steps = [c.step for c in result.run.checkpoints]
    assert main(["timeline", str(tmp_path / "run"), "--against", "first", "--lengths", "2,3", "--strings", "8",
                 "--parts", "behaviour,probes,attention", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    rows = data["checkpoints"]
    assert [r["step"] for r in rows] == steps and data["run"]["kind"] == "run directory"
    settings = data["settings"]
    assert settings["long_lengths"] == [6] and settings["long_lengths_source"] == "the run's test length"
    for row in rows:
        assert 0.0 <= row["accuracy"] <= 1.0 and 0.0 <= row["long_accuracy"] <= 1.0
        assert row["verdicts"] is None and "alignment part was not asked for" in row["reasons"]["verdicts"]
        assert row["circuit_overlap"] is None and "circuit" in row["reasons"]["circuit_overlap"]
        assert set(row["attention"]["tv_distance"]) and row["attention"]["cls_to_first"] is not None
        assert {"r2", "site"} <= set(next(iter(row["probes"].values())))
    assert rows[-1]["training"]["test_accuracy"] is not None  # what training recorded at that step
    # a train result: its checkpoints in memory, its training lengths the default
    again = el.timeline(result, "first", strings=8, parts=("behaviour",), long_lengths=[5])
    assert again["settings"]["lengths"] == [1, 2, 3, 4] and again["settings"]["lengths_source"] == \
        "the run's training lengths"
    assert [r["accuracy"] for r in again["checkpoints"]] == pytest.approx(
        [r["accuracy"] for r in el.timeline(str(tmp_path / "run"), "first", lengths=[1, 2, 3, 4], strings=8,
                                            parts=("behaviour",), long_lengths=[5])["checkpoints"]])
    text = again.text()
    assert text.count("\n  step ") == len(steps) and "order: " in text


def _native_bridge() -> object:
    pytest.importorskip("transformer_lens.model_bridge.sources")
    from transformer_lens.config import TransformerBridgeConfig
    from transformer_lens.model_bridge.sources import boot_native

    cfg = TransformerBridgeConfig(d_model=16, d_head=8, n_heads=2, n_layers=1, n_ctx=12, d_vocab=3, d_vocab_out=1,
                                  d_mlp=16, act_fn="relu", normalization_type="LN", attention_dir="bidirectional",
                                  architecture="TransformerLensNative", seed=0)
    return boot_native(cfg)


def _train_first_at_cls(model: object, steps: int) -> None:
    first = tasks.get("first")
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(0)
    opt = torch.optim.Adam(model.parameters(), 1e-2)
    for step in range(steps):
        ids = first.sample(1 + step % 8, 32, gen)
        logit = model(first.encode(ids).tokens)[:, 0, 0]
        loss = torch.nn.functional.binary_cross_entropy_with_logits(logit, first.targets(ids).to(logit.dtype))
        opt.zero_grad()
        loss.backward()
        opt.step()


def test_a_users_transformer_lens_4_checkpoints() -> None:
    model = _native_bridge()
    kept = [copy.deepcopy(model).eval()]
    _train_first_at_cls(model.train(), 150)
    kept.append(copy.deepcopy(model).eval())
    data = el.timeline(kept, "first", steps=[0, 150], lengths=[2, 4, 8], strings=16, parts=("behaviour",),
                       long_lengths=[10])
    rows = data["checkpoints"]
    assert [r["step"] for r in rows] == [0, 150] and data["trained"]["kind"] == "foreign"
    assert rows[0]["accuracy"] < 0.9 <= rows[1]["accuracy"]
    assert data["events"]["behaviour"] in (150, None) and json.dumps(data.to_dict(), allow_nan=False)


def _corrupt(directory) -> None:
    (directory / "weights.pt").write_bytes(b"not a torch file")


@pytest.mark.parametrize("case", ["empty", "no checkpoints", "another task", "unreadable", "state dict",
                                  "steps", "seeds"])
def test_bad_input_is_one_line_and_writes_nothing(case, tmp_path, capsys) -> None:
    exact = build("first", dtype="float64")
    parity_dir = tmp_path / "parity"
    if case == "empty":
        run, match = [], "at least one checkpoint"
    elif case == "no checkpoints":
        train("first", out=tmp_path / "plain", **TINY)
        run, match = str(tmp_path / "plain"), "no checkpoints.*--checkpoint-every"
    elif case == "another task":
        train("parity", out=parity_dir, epochs=1, strings_per_epoch=8, test_strings=4)
        run, match = [exact, str(parity_dir)], "checkpoint 1 \\(step 1\\).*different tasks"
    elif case == "unreadable":
        train("first", out=tmp_path / "run", checkpoint_every=2, **TINY)
        _corrupt(sorted((tmp_path / "run" / "checkpoints").glob("step*"))[0])
        run, match = str(tmp_path / "run"), "^the checkpoint at step 0 \\(.*\\) is unreadable"
    elif case == "state dict":
        run, match = [exact.state_dict()], "state dict: give model="
    elif case == "steps":
        run, match = [exact, exact], "steps= must increase"
    else:
        train_many("first", [0, 1], out=tmp_path / "seeds", checkpoint_every=2, **TINY)
        run, match = str(tmp_path / "seeds"), "several seeds' runs: give one of seed0, seed1"
    before = sorted(p.name for p in tmp_path.rglob("*"))
    with pytest.raises(ExactLensError, match=match) as caught:
        timeline(run, "first", **QUICK, html=tmp_path / "page.html", **({"steps": [3, 3]} if case == "steps" else {}))
    assert "\n" not in str(caught.value)
    if isinstance(run, str):  # the command line: exit status 2, one line on stderr, nothing on stdout
        assert main(["timeline", run, "--against", "first", "--lengths", "2,3", "--strings", "8", "--json",
                     "--html", str(tmp_path / "page.html")]) == 2
        out, err = capsys.readouterr()
        errors = [line for line in err.splitlines() if "error" in line]
        assert out == "" and len(errors) == 1 and errors[0].startswith("exactlens: error: "), err
    assert sorted(p.name for p in tmp_path.rglob("*")) == before  # no page, no half-written views folder


def test_state_dicts_fill_a_template() -> None:
    exact = build("first", dtype="float64")
    untrained = ExactTransformer(exact.cfg.replace(residual_labels=None)).init_weights(seed=3).eval()
    data = timeline([untrained.state_dict(), exact.state_dict()], "first", model=untrained, steps=[0, 5], **QUICK)
    assert [r["accuracy"] for r in data["checkpoints"]] == [pytest.approx(data["checkpoints"][0]["accuracy"]), 1.0]
    assert data["events"]["behaviour"] == 5


def test_the_circuit_overlap_of_the_construction_itself_is_one_with_or_without_post_ln() -> None:
    """A mapping check: FIRST's construction and its post-LN twin (first-ln: the same circuit, each component
    followed by a norm) both have the exact circuit. The post-LN model's every edge passes through a norm that
    the construction lacks, so compared edge by edge they share nothing (``edge_jaccard_direct`` 0); between
    components (norm chains joined) they are the same circuit: the timeline's edge Jaccard is 1 for both."""
    models = [build("first", dtype="float64"), build("first-ln", dtype="float64", eps=1e-5)]
    rows = timeline(models, "first", steps=[0, 1], lengths=[3, 4], strings=8, parts=("circuit",))["checkpoints"]
    for row in rows:
        overlap = row["circuit_overlap"]
        assert overlap["edge_comparison"] == "between components"
        assert overlap["edge_jaccard"] == 1.0 and overlap["node_jaccard"] == 1.0, overlap
        assert overlap["shared_edges"] == ["L0.MLP->L1.H0", "L1.H0->output", "embed->L0.MLP"]
        assert overlap["exact_only"] == [] and overlap["found_only"] == []
    assert [r["circuit_overlap"]["edge_jaccard_direct"] for r in rows] == [1.0, 0.0]


def test_untrained_then_exact_checkpoints_and_a_warm_start_reaching_the_cold_fits_verdicts() -> None:
    """The issue's checks at a default-run size (the slow test below also dates the variable event, which
    needs more DAS pairs for an interval above 0.9): step 0 untrained, steps 100 and 200 the exact
    construction. The first symbol is not computed at step 0 and computed at 100 and 200; behaviour's event is
    step 100; step 100's fits are cold (every fit its full steps), step 200's warm-started from step 100's
    subspaces with a third of the steps, on the same model: the same verdicts and sites."""
    exact = build("first", dtype="float64")
    untrained = ExactTransformer(exact.cfg.replace(residual_labels=None)).init_weights(seed=3).eval()
    data = timeline([untrained, exact, exact], "first", steps=[0, 100, 200], lengths=[5, 6],
                    parts=("behaviour", "alignment"), das_max_dim=1, das_steps=12, das_warm_steps=4,
                    alignment_pairs=48)  # 11 changed test pairs (32: 6, "too few pairs")
    rows = data["checkpoints"]
    first = [r["verdicts"]["first symbol"] for r in rows]
    assert first[0]["verdict"] == "model does not solve the task" and rows[0]["accuracy"] < 0.9
    assert first[1]["verdict"] == first[2]["verdict"] == "computed"
    assert data["events"]["behaviour"] == 100
    cold, warm = rows[1]["alignment"], rows[2]["alignment"]
    # the same model: the earlier subspace may tie its own fitted version (then the unfitted one is kept)
    assert {(r["init"].removesuffix(", unfitted"), r["fit_steps"]) for r in warm} == {("warm start", 4)}
    assert all(r["init"] != "warm start" and r["fit_steps"] == 12 for r in cold)
    assert {k: (v["verdict"], v["site"]) for k, v in rows[2]["verdicts"].items()} == \
        {k: (v["verdict"], v["site"]) for k, v in rows[1]["verdicts"].items()}


@pytest.mark.slow
def test_an_untrained_then_exact_run_forms_the_circuit_and_warm_starts_agree_with_cold_fits() -> None:
    """Step 0 untrained, steps 100 and 200 the exact construction: the first symbol is not computed at step
    0 and computed from step 100 (the event); step 200's DAS starts from step 100's subspaces with a quarter
    of the steps and reaches the verdicts of a cold fit of the same model."""
    exact = build("first", dtype="float64")
    untrained = ExactTransformer(exact.cfg.replace(residual_labels=None)).init_weights(seed=3).eval()
    options = dict(lengths=[3, 4, 5, 6], parts=("behaviour", "alignment"), das_max_dim=1, das_steps=60,
                   alignment_pairs=128)
    data = timeline([untrained, exact, exact], "first", steps=[0, 100, 200], **options)
    first = [r["verdicts"]["first symbol"] for r in data["checkpoints"]]
    assert first[0]["verdict"] == "model does not solve the task"
    assert first[1]["verdict"] == "computed" and first[1]["iia_ci"][0] >= 0.9
    assert data["events"]["variables"]["first symbol"] == {"step": 100, "site": "blocks.0.hook_mlp_out",
                                                           "how": "computed"}
    # the position-resolved first symbol (the AND label at position 1) is dated where the first FFN writes it
    assert data["events"]["variables"]["I[w_i=1 & i=1]@1"] == {"step": 100, "site": "blocks.0.hook_mlp_out",
                                                               "how": "computed", "position_index": 1}
    assert data["events"]["behaviour"] == 100
    cold = diff(exact, "first", untrained_baseline=False, **options)["summary"]["verdicts"]
    warm = data["checkpoints"][2]["verdicts"]
    assert {k: v["verdict"] for k, v in warm.items()} == {k: v["verdict"] for k, v in cold.items()}
    assert {k: v["site"] for k, v in warm.items()} == {k: v["site"] for k, v in cold.items()}


def test_the_page_and_the_headline_say_not_measured_for_a_part_not_asked_for() -> None:
    """A timeline run with --parts attention,circuit has no accuracy: the page must not list it as "not
    reached", and the command line's headline says "not measured" rather than null."""
    from exactlens.verbs.timeline import headline
    from exactlens.viz.timeline import events_html

    rows = [{"step": s, "accuracy": None, "long_accuracy": a, "verdicts": {}, "circuit_overlap": {"edge_jaccard": 0.5}}
            for s, a in ((0, 0.2), (5, 1.0))]
    data = {"events": events(rows, [20]), "checkpoints": rows, "exact": {"name": "first"}, "run": {"checkpoints": 2}}
    page = events_html(data)
    assert "Not reached" not in page and "Not measured (its part was not asked for): accuracy &gt;= 0.99" in page
    assert dict(headline(data))["accuracy 0.99 from step"] == "not measured"
    assert dict(headline(data))["long lengths 0.99 from step"] == 5

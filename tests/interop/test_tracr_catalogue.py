"""The catalogue's RASP programs (exactlens.interop.tracr.catalogue) against plain-Python functions of
their tasks, on every word of every length; verify, diff and discovery on them; and undefined outputs
(RASP None) left out wherever they are, by every analysis alike."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

pytest.importorskip("tracr")

from exactlens import constructions, tasks  # noqa: E402
from exactlens.interop.tracr import catalogue, library  # noqa: E402
from exactlens.tasks.base import UNDEFINED  # noqa: E402

NAMES = [entry["name"] for entry in catalogue.catalogue()]


# ---- the tasks in plain Python (None: undefined) ---------------------------------------------------------------


def trend(w: list) -> list:
    return [("up" if w[i + 1] > w[i] else "down" if w[i + 1] < w[i] else "same") if i + 1 < len(w) else None
            for i in range(len(w))]


def count_token(w: list) -> list:
    return [w.count("a")] * len(w)


def dedup(w: list) -> list:
    return [x if i == 0 or x != w[i - 1] else None for i, x in enumerate(w)]


def count_greater(w: list) -> list:
    return [sum(y > x for y in w) for x in w]


def max_element(w: list) -> list:
    return [max(w)] * len(w)


def neighbour_sum(w: list) -> list:
    return [None if i == 0 else w[i] + w[i - 1] for i in range(len(w))]


def most_frequent(w: list) -> list:
    counts = Counter(w)
    best = min(counts, key=lambda x: (-counts[x], x))
    return [best] * len(w)


PAIRS = {"aa": "x", "ab": "y", "ac": "z", "ba": "z", "bb": "x", "bc": "x", "ca": "y", "cb": "z", "cc": "y"}


def pair_lookup(w: list) -> list:
    return [None if i == 0 else PAIRS[w[i - 1] + w[i]] for i in range(len(w))]


REFERENCE = {f.__name__: f for f in (trend, count_token, dedup, count_greater, max_element, neighbour_sum,
                                     most_frequent, pair_lookup)}


def encoded(task, outputs: list) -> list:
    """Reference outputs -> class indices (UNDEFINED for None)."""
    return [UNDEFINED if v is None else task.classes.index(str(v)) for v in outputs]


# ---- the programs compute their tasks ----------------------------------------------------------------------------


def test_catalogue_is_registered_and_listed():
    assert set(NAMES) == set(REFERENCE)
    listed = set(constructions.names())
    for name in NAMES:
        assert f"tracr-{name}" in listed and name in library.program_names()
        assert tasks.info(f"tracr-{name}")["kind"] == "prediction"


@pytest.mark.parametrize("name", NAMES)
def test_program_is_its_task_on_every_word(name):
    """tracr's evaluator (target) and this package's (targets) equal the plain-Python task on every word of
    lengths 1..max_seq_len, undefined positions included."""
    task = tasks.get(f"tracr-{name}")
    for length in range(1, task.max_length + 1):
        ids = task.all_words(length)
        targets = task.targets(ids)
        for row, got in zip(ids, targets, strict=True):
            values = [task.values[int(i)] for i in row]
            expected = REFERENCE[name](values)
            assert got.tolist() == encoded(task, expected), (name, values)
            word = [task.alphabet[int(i)] for i in row]
            assert task.target(word) == [None if v == UNDEFINED else v for v in encoded(task, expected)]


def _one_compile(names, slow=()) -> list:
    """``names`` (and ``slow``, marked slow) as parameters in the xdist group of their program, the group of
    tests/interop/test_tracr.py: a worker compiles a program once (exactlens.interop.tracr.library caches it
    per process), so the tests that compile it go to one worker."""
    return [pytest.param(n, marks=[pytest.mark.xdist_group(f"tracr-{n}"), *([pytest.mark.slow] if n in slow else [])])
            for n in [*names, *slow]]


@pytest.mark.parametrize("name", _one_compile(NAMES))
def test_verify_is_exact_at_every_defined_position(name):
    """The compiled model, decided at the target positions only, is right on every word (verify is exhaustive
    up to max_seq_len)."""
    from exactlens.analysis.verify import verify

    result = verify(f"tracr-{name}", range(1, 6), strings=100)
    assert all(row["exhaustive"] and row["accuracy"] == 1.0 for row in result["results"]), result["results"]


def test_undefined_positions_are_no_targets_wherever_they_are():
    """trend (last position), dedup (the middle), neighbour_sum (the first): the mask given the targets leaves
    out exactly the reference's None entries, while the compiled model does answer there."""
    for name, word in (("trend", [1, 3, 2, 2]), ("dedup", list("abba")), ("neighbour_sum", [0, 3, 1, 2])):
        task = tasks.get(f"tracr-{name}")
        ids = torch.tensor([[task.values.index(v) for v in word]])
        mask = task.target_mask(torch.tensor([len(word)]), len(word), task.targets(ids))
        assert mask[0].tolist() == [v is not None for v in REFERENCE[name](word)]
        assert task.target_mask(torch.tensor([len(word)]), len(word)).all()  # without targets: the old mask
        model = constructions.build(f"tracr-{name}")
        decisions = task.decide(model.readout(task.encode(ids).tokens), task.encode(ids).n_positions)
        assert decisions.shape == ids.shape  # a decision at every position, undefined ones too


SMALL_DAS = ["--das-steps", "10", "--das-max-dim", "1", "--alignment-pairs", "16", "--no-untrained-baseline"]
"""DAS sized to what the self-diff checks: that every part runs with undefined outputs (the alignment's pairs,
fits and scores read only target positions) and the copies agree, not how well DAS aligns. Subspace size 1
(and a variable's own), 16 test pairs a variable, no untrained baseline (the same fit on another model): 24 s
of CPU for dedup instead of 51 s (one process with its imports, load ~11, 2026-11-28). The slow programs keep
the full-size DAS of before (default sizes, untrained baseline), so -m slow still runs it on undefined outputs."""
SLOW_SELF_DIFF = ("neighbour_sum", "pair_lookup")


@pytest.mark.parametrize("name", _one_compile(["trend", "dedup", "max_element"],  # the end, the middle, no class
                                              slow=SLOW_SELF_DIFF))                 # under a swap
def test_self_diff_runs_with_undefined_outputs(name, capsys):
    """`exactlens diff tracr-NAME --against tracr-NAME --lengths 2:4 --strings 16` with a small DAS (SMALL_DAS)
    runs, in process, and the two copies agree everywhere (max_element: its interventions give outputs that
    are no class, below)."""
    import json

    from exactlens.cli import main

    das = ["--das-steps", "10"] if name in SLOW_SELF_DIFF else SMALL_DAS
    assert main(["diff", f"tracr-{name}", "--against", f"tracr-{name}", "--lengths", "2:4", "--strings", "16",
                 *das, "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)["summary"]
    assert summary["agreement"] == summary["per_position_agreement"] == summary["exact_accuracy"] == 1.0


def test_per_position_agreement_leaves_out_lengths_without_targets():
    """detect_pattern has no target at length 2 (was counted as agreement 0: 0.883 over 2:4)."""
    import exactlens as el

    data = el.diff("tracr-detect_pattern", "tracr-detect_pattern", lengths=[2, 3, 4], strings=16,
                   parts=("behaviour",), untrained_baseline=False).to_dict()
    rows = {r["length"]: r for r in data["behaviour"]["rows"]}
    assert rows[2]["per_position_agreement"] is None and rows[3]["per_position_agreement"] == 1.0
    assert data["behaviour"]["per_position_agreement"] == 1.0


def test_discovery_reads_only_target_positions():
    """The divergence of discovery ignores a change at an undefined position (trend's last) and sees one at
    a target position."""
    from exactlens.analysis.circuit.ablation import per_position_truth
    from exactlens.analysis.circuit.discovery import divergence, evidence

    model = constructions.build("tracr-trend")
    task = tasks.of_model(model)
    ids = task.all_words(3)
    batch = task.encode(ids)
    clean = evidence(model, model.select_readout(model(batch.tokens), batch.n_positions), batch.n_positions)
    truth = per_position_truth(task, ids, clean.device)
    for position, moved in ((3, False), (2, True)):  # token positions: BOS, then symbols 0..2
        patched = clean.clone()
        patched[:, position] = patched[:, position].flip(-1)
        with torch.no_grad():
            found = float(divergence(model, clean, patched, batch.n_positions, truth))
        assert (found > 1e-6) == moved, (position, found)


def test_numerical_program_with_an_undefined_output():
    """A numerical program whose first output is None (the previous token's value): NaN targets there, left
    out by verify's scores and loss and by the diff's behaviour and DAS units (regression)."""
    import exactlens as el
    from exactlens import constructions as registry
    from exactlens.interop.tracr import deps, register_program

    rasp = deps.rasp()
    register_program("test-previous", lambda: rasp.numerical(rasp.Map(lambda x: x, catalogue.shifted(rasp.tokens, 1)))
                     .named("previous"), (1, 2, 3), 4, kind="regression")
    try:
        task = tasks.get("tracr-test-previous")
        ids = task.all_words(3)
        targets = task.targets(ids)
        assert targets[:, 0].isnan().all() and not targets[:, 1:].isnan().any()
        result = el.verify("tracr-test-previous", lengths=range(1, 5), strings=100).to_dict()
        assert all(row["accuracy"] == 1.0 and row["cross_entropy_bits"] is None for row in result["results"])
        data = el.diff("tracr-test-previous", "tracr-test-previous", lengths=[2, 3, 4], strings=64,
                       parts=("behaviour", "alignment"), das_steps=5, alignment_pairs=16,
                       untrained_baseline=False).to_dict()
        assert data["behaviour"]["agreement"] == 1.0 and data["behaviour"]["exact_mse"] < 1e-10
        # NaN answers counted as units made the exact model itself "not solve the task" (alignment.score.units);
        # 64 words: the designed pairs need test words enough to hold changed pairs (16 gave 6 test pairs a length)
        verdicts = {v["verdict"] for v in data["summary"]["verdicts"].values()}
        assert "model does not solve the task" not in verdicts and "computed" in verdicts, verdicts
    finally:  # leave the registries as they were for other tests
        library.PROGRAMS.pop("test-previous", None)
        dict.pop(tasks.registry.TASKS, "tracr-test-previous", None)
        dict.pop(registry.REGISTRY, "tracr-test-previous", None)


def test_an_intervention_without_a_class_is_undefined():
    """max_element with its counts set so that two different tokens count as the largest: RASP averages them
    (2.5), which is no class: undefined there (it stopped the diff before), while a word stays an error."""
    task = tasks.get("tracr-max_element")
    above = next(v for v in task.variables() if v.name.startswith("above"))
    ids = torch.tensor([[1, 2]])  # the word 2 3: counts of greater tokens 1, 0
    assert above.values(ids).tolist() == [[1, 0]]
    assert above.intervene(ids, torch.tensor([[0, 0]])).tolist() == [[UNDEFINED, UNDEFINED]]
    # tokens 1 and 3 selected: RASP's mean is 2.0, a class, but the compiled categorical aggregate outputs half of
    # each one-hot code, no class: undefined too (the self-diff's task variable `above` failed at 0.69 before)
    ids = torch.tensor([[0, 2]])  # the word 1 3
    assert above.intervene(ids, torch.tensor([[0, 0]])).tolist() == [[UNDEFINED, UNDEFINED]]
    assert above.intervene(ids, torch.tensor([[1, 0]])).tolist() == [[2, 2]]  # only 3 selected: class index 2
    dedup = tasks.get("tracr-dedup")
    slot = next(v for v in dedup.variables() if v.name.startswith("slot"))
    ids = torch.tensor([[0, 1]])  # ab: both positions start a run; setting both slots to 0 selects a and b
    same = slot.intervene(ids, torch.stack([slot.values(ids)[0, :1].repeat(2)]))
    assert same.tolist()[0][0] == UNDEFINED


def test_timeline_agrees_on_undefined_outputs():
    """The timeline over two checkpoints of the exact trend model (its last output undefined) scores every
    word right and finds the exact circuit, as verify, diff and discover do."""
    import exactlens as el

    exact = constructions.build("tracr-trend", dtype="float64")
    data = el.timeline([exact, exact], "tracr-trend", steps=[0, 1], lengths=[2, 3, 4], strings=16,
                       parts=("behaviour", "circuit"))
    rows = data["checkpoints"]
    assert [r["accuracy"] for r in rows] == [1.0, 1.0]
    assert all(r["circuit_overlap"]["edge_jaccard"] == 1.0 for r in rows), rows[0]["circuit_overlap"]


def test_the_task_verb_shows_an_undefined_target_as_none():
    import exactlens as el

    example = el.task("tracr-trend").to_dict()["example"]
    assert example["target"][-1] is None and None not in example["target"][:-1]

"""The circuit read off a compiled RASP program's weights against the program's own graph: every
dependency of the RASP graph (a query, key or value read of an Aggregate, an MLP's input) is an edge
of the weight-derived circuit, and every other circuit edge carries only features that are the same
for every word (tracr's "one" direction and the BOS indicator that its attention always reads). Ablating
every edge outside the circuit changes no decision, and every RASP dependency matters alone except those
whose selector's predicate ignores that side (UNNECESSARY). All twenty registered programs (seventeen slow:
the library's and the catalogue's, exactlens.interop.tracr.catalogue)."""

from __future__ import annotations

import pytest

pytest.importorskip("tracr")

from exactlens.analysis.circuit.ablation import check_circuit, mark_constant  # noqa: E402
from exactlens.analysis.circuit.discovery import discover  # noqa: E402
from exactlens.analysis.circuit.evaluate import word_batches  # noqa: E402
from exactlens.analysis.circuit.scoring import score_discovery  # noqa: E402
from exactlens.analysis.circuit.truth import derive_circuit  # noqa: E402
from exactlens.constructions.registry import build  # noqa: E402

PROGRAMS = ("tracr-frac_prevs", "tracr-hist", "tracr-sort_unique")
SLOW_PROGRAMS = ("tracr-count_less_freq", "tracr-detect_pattern", "tracr-length", "tracr-pair_balance",
                 "tracr-reverse", "tracr-shuffle_dyck", "tracr-shuffle_dyck2", "tracr-sort", "tracr-sort_freq",
                 "tracr-trend", "tracr-count_token", "tracr-dedup", "tracr-count_greater", "tracr-max_element",
                 "tracr-neighbour_sum", "tracr-most_frequent", "tracr-pair_lookup")
UNNECESSARY = {  # RASP dependencies that no ablation alone can see, each for a reason in the program
    # make_length: Select(tokens, tokens, TRUE) reads query and key but its predicate ignores both
    "tracr-length": {"embed->L0.H0.q", "embed->L0.H0.k"},
    "tracr-reverse": {"embed->L0.H0.q", "embed->L0.H0.k"},  # opp_idx = length - indices - 1
    "tracr-shuffle_dyck": {"embed->L0.H0.q", "embed->L0.H0.k"},  # its length
    "tracr-shuffle_dyck2": {"embed->L0.H0.q", "embed->L0.H0.k"},
    # make_count_less_freq: Select(hist, hist, lambda key, query: key <= n) ignores the query
    "tracr-count_less_freq": {"L0.MLP->L1.H0.q"},
    "tracr-count_token": {"embed->L0.H0.q"},  # Select(tokens, tokens, key == "a") ignores the query
    # catalogue.value_where_zero: Select(counts, counts, key == 0) ignores the query
    "tracr-max_element": {"L0.MLP->L1.H0.q"},
    # and, measured (not derived), the key read of `better` (score > score) alone: no decision changes
    "tracr-most_frequent": {"L1.MLP->L2.H0.k", "L2.MLP->L3.H0.q"},
}
HEAD_ROLES = {"query": "q", "key": "k", "value": "v"}


def rasp_edges(model) -> set[str]:
    """Edges (qkv granularity names) of the RASP graph recorded in cfg.metadata["tracr"]: each dependency
    of a SOp on another (its role says which input of the computing head: query, key, value; an MLP's
    input), the edges between the blocks of one SOp (a SelectorWidth is a head and then an MLP reading
    it), and the output SOp's blocks into the output."""
    meta = model.cfg.metadata["tracr"]
    by_sop = {s["label"]: s for s in meta["sops"]}
    block: dict[str, dict[str, set]] = {}  # one layer's MLP may compute several SOps (one entry each)
    for c in meta["components"]:
        entry = block.setdefault(c["component"], {"reads": set(), "writes": set()})
        entry["reads"] |= set(c["reads"])
        entry["writes"] |= set(c["writes"])

    def senders(label: str) -> list[str]:
        if label in ("tokens", "indices"):
            return ["embed" if label == "tokens" else "pos"]
        sop_dims = set(by_sop[label]["residual"])
        return [c for c in by_sop[label]["components"] if sop_dims & block[c]["writes"]]

    edges = set()
    for dep in meta["edges"]:
        for receiver in by_sop[dep["to"]]["components"]:
            is_head = ".H" in receiver
            if is_head != (dep["role"] in HEAD_ROLES):  # an MLP reads "input" (Map) or "fst"/"snd" (SequenceMap)
                continue
            target = f"{receiver}.{HEAD_ROLES[dep['role']]}" if is_head else receiver
            edges |= {f"{s}->{target}" for s in senders(dep["from"])}
    for sop in meta["sops"]:
        parts = sop["components"]
        for i, first in enumerate(parts):
            for second in parts[i + 1:]:
                if block[first]["writes"] & block[second]["reads"]:
                    edges.add(f"{first}->{second}")
    edges |= {f"{c}->output" for c in senders(meta["output"]["sop"])}
    return edges


@pytest.mark.parametrize("name", [*PROGRAMS, *(pytest.param(n, marks=pytest.mark.slow) for n in SLOW_PROGRAMS)])
def test_weight_circuit_is_the_rasp_graph(name):
    model = build(name, dtype="float64")
    circuit = derive_circuit(model, "qkv")
    task_max = model.cfg.task["params"].get("max_seq_len", 5)
    words = 512 if name in PROGRAMS else 64  # the larger programs: 64 words per length (minutes, not hours)
    batches = word_batches(model, circuit.graph, list(range(1, task_max + 1)), words=words)
    circuit = mark_constant(circuit, batches, model)
    derived = {c.edge.name: c for c in circuit.edges}
    expected = rasp_edges(model)
    assert expected <= set(derived), f"RASP dependencies missing from the weights: {expected - set(derived)}"
    extra = {name_: c for name_, c in derived.items() if name_ not in expected}
    assert all(c.constant for c in extra.values()), {n: c.features for n, c in extra.items() if not c.constant}
    assert all(set(c.features) <= {"one", "tokens:compiler_bos"} or c.constant for c in extra.values())
    check = check_circuit(model, circuit, batches)
    assert check.outside_changed == 0
    assert set(check.unnecessary) == UNNECESSARY.get(name, set())


def test_discovery_on_a_compiled_program():
    """ACDC recovers frac_prevs' circuit (measured: AUROC 1)."""
    model = build("tracr-frac_prevs", dtype="float64")
    circuit = derive_circuit(model, "qkv")
    batches = word_batches(model, circuit.graph, [2, 3, 4], words=32)
    circuit = mark_constant(circuit, batches, model)
    score = score_discovery(discover(model, circuit.graph, batches, "acdc"), circuit)
    assert score.edge_auroc == 1.0 and score.recall == 1.0


@pytest.mark.parametrize("name", [*PROGRAMS, *(pytest.param(n, marks=pytest.mark.slow) for n in SLOW_PROGRAMS)])
def test_weight_circuit_is_sufficient_under_cross_length_ablation(name):
    """Every edge outside the circuit reading a word of another length (n - 1 at max_seq_len) changes no
    decision."""
    from exactlens.analysis.circuit.ablation import check_circuit

    model = build(name, dtype="float64")
    circuit = derive_circuit(model, "qkv")
    batches = word_batches(model, circuit.graph, words=16, ablation="cross-length")
    circuit = mark_constant(circuit, batches, model)
    assert check_circuit(model, circuit, batches).outside_changed == 0


def test_cross_length_ablation_sees_make_length():
    """make_length's value is the same for every word of a length: resample ablation cannot move it and
    no method selects anything; with sources of another length (n + 1; n - 1 at max_seq_len) its two
    edges change every decision alone and ACDC selects exactly them. The query and key reads stay
    unnecessary: the length comes from how many positions the head attends to, which no edge carries."""
    from exactlens.analysis.circuit.ablation import check_circuit

    model = build("tracr-length", dtype="float64")
    length_edges = {"L0.H0->L0.MLP", "L0.MLP->output"}
    selected = {}
    for ablation in ("resample", "cross-length"):
        circuit = derive_circuit(model, "head")
        batches = word_batches(model, circuit.graph, [1, 2, 3, 4, 5], words=32, ablation=ablation)
        circuit = mark_constant(circuit, batches, model)
        moved = {c.edge.name for c in circuit.edges if not c.constant}
        check = check_circuit(model, circuit, batches)
        assert check.outside_changed == 0
        if ablation == "cross-length":
            assert length_edges <= moved
            assert all(check.inside_changed[e] == check.n_words for e in length_edges)
        else:
            assert not length_edges & moved
        assert check.unnecessary == ["embed->L0.H0"]
        selected[ablation] = {e.name for e in discover(model, circuit.graph, batches, "acdc").selected}
    assert selected == {"resample": set(), "cross-length": length_edges}


def test_default_lengths_stop_at_the_programs_longest(capsys):
    """verify and precision without lengths check 1..12 / up to 1000 within the construction's range:
    a compiled program answers up to its max_seq_len (5 here)."""
    import json

    from exactlens.cli import main

    assert main(["verify", "tracr-hist", "--json"]) == 0
    assert [r["length"] for r in json.loads(capsys.readouterr().out)["results"]] == [1, 2, 3, 4, 5]
    assert main(["precision", "tracr-hist", "--json"]) == 0
    assert max(c["length"] for c in json.loads(capsys.readouterr().out)["checked"]) == 5
    assert main(["verify", "tracr-hist", "--lengths", "6"]) == 2  # an explicit length beyond it is refused

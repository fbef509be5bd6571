"""exactlens.analysis.diff: a trained model against an exact construction.

What would catch a wrong diff: an exact model against itself and against a copy whose residual
basis is rotated by a random orthogonal matrix must score perfectly everywhere (no layer norm, so
the rotation is an exact symmetry); a randomly initialized model must not; the flawed FIRST of
§5.2 against FIRST must show the CLS -> position 1 attention of the closed forms and fail exactly
where c <= log|w|. Expected values come from the papers' formulas, never from the diff itself.
"""

from __future__ import annotations

import json
import math

import pytest
import torch
from samples import construction_sample

from exactlens.analysis.diff import PARTS, diff
from exactlens.analysis.verify import verify
from exactlens.cli import main
from exactlens.constructions import build, get
from exactlens.errors import ExactLensError
from exactlens.model import ExactConfig, ExactTransformer

NO_DAS = tuple(p for p in PARTS if p != "alignment")  # DAS has its own tests (test_alignment.py)
LENGTHS = [1, 2, 3, 4, 6, 8]


def rotated_copy(model: ExactTransformer, seed: int = 0) -> ExactTransformer:
    """The same function with residual x -> x R (R random orthogonal); labels dropped (no LN only)."""
    assert model.cfg.normalization == "none"
    d = model.cfg.d_model
    q, _ = torch.linalg.qr(torch.randn(d, d, generator=torch.Generator().manual_seed(seed), dtype=torch.float64))
    r = q.to(model.cfg.torch_dtype)
    new = ExactTransformer(model.cfg.replace(residual_labels=None))
    state = {}
    for key, value in model.state_dict().items():
        if key in ("embed.W_E", "pos_embed.W_feat") or key.endswith(("attn.W_O", "attn.b_O", "mlp.W_out", "mlp.b_out")):
            state[key] = value @ r  # writes into the residual
        elif key.endswith(("attn.W_Q", "attn.W_K", "attn.W_V", "mlp.W_in")) or key == "unembed.W_U":
            state[key] = r.T @ value  # reads from the residual
        else:
            state[key] = value
    new.load_state_dict(state)
    return new.eval()


def assert_perfect(result: dict) -> None:
    assert result["behaviour"]["agreement"] == 1.0
    for feat in result["probes"]["features"]:
        if not feat["constant"]:
            assert feat["best_r2"] > 0.9999, feat
            # a computed feature is found at the same residual site as in the exact model
            assert feat["best_residual_site"] == feat["exact_site"], feat
    for m in result["attention"]["matching"]:
        assert (m["trained_layer"], m["trained_head"]) == (m["exact_layer"], m["exact_head"])
        assert m["distance"] < 1e-9
    for p in result["weights"]["pairs"]:
        for kind in ("qk", "ov"):
            if p[f"{kind}_norm_exact"] > 1e-9:
                assert p[f"{kind}_cosine"] > 1 - 1e-9 and p[f"{kind}_relative_error"] < 1e-6, p
            else:
                assert p[f"{kind}_norm_trained"] < 1e-9, p
    features = result["interventions"]["features"]
    assert features, "no computed feature was intervened on"
    for feat in features:
        assert feat["iia"] == 1.0, feat
        assert feat["iia_changed"] in (None, 1.0), feat
    assert any(f["exact_changed"] > 0.2 for f in features)
    circuit = result["circuit"]  # the discovered circuit is the one the method finds on the exact model
    assert circuit["available"] and all(k == v for k, v in circuit["node_map"].items())
    check = circuit["method_check"]
    assert (circuit["edges"]["precision"], circuit["edges"]["recall"]) == (check["precision"], check["recall"])
    assert circuit["edges"]["auroc"] == pytest.approx(check["edge_auroc"])
    joined = circuit["edges"]["between_components"]  # no norm: joining norm chains changes nothing
    assert {k: joined[k] for k in ("found", "truth", "shared")} == {k: circuit["edges"][k] for k in
                                                                    ("found", "truth", "shared")}


@pytest.mark.parametrize("name", ["first", "parity"])
def test_exact_against_itself(name: str) -> None:
    result = diff(build(name, dtype="float64"), name, lengths=LENGTHS, strings=32, parts=NO_DAS)
    assert_perfect(result)
    json.dumps(result, allow_nan=False)


@pytest.mark.parametrize("name", ["first", "parity"])
def test_rotated_residual_basis_is_invisible(name: str) -> None:
    model = rotated_copy(build(name, dtype="float64"), seed=3)
    x = torch.tensor([[2, 1, 0, 1]])
    assert torch.allclose(model(x), build(name, dtype="float64")(x), atol=1e-12)  # the copy is the same function
    assert_perfect(diff(model, name, lengths=LENGTHS, strings=32, parts=NO_DAS))


@pytest.mark.parametrize("method", ["patching", "eap", "acdc"])
def test_circuit_part_of_a_rotated_copy_at_qkv_granularity(method: str) -> None:
    """Every method, at qkv granularity, finds in a rotated copy of FIRST what it finds in FIRST (the
    rotation changes no activation a discovery method can see: scores are basis-free)."""
    model = rotated_copy(build("first", dtype="float64"), seed=5)
    result = diff(model, "first", lengths=[1, 2, 3, 5], strings=16, parts=("circuit",), circuit_method=method,
                  circuit_granularity="qkv")
    circuit, check = result["circuit"], result["circuit"]["method_check"]
    assert circuit["granularity"] == "qkv" and any(e["edge"].endswith(".q") for e in circuit["trained_edges"])
    assert (circuit["edges"]["precision"], circuit["edges"]["recall"]) == (check["precision"], check["recall"])
    assert circuit["edges"]["auroc"] == pytest.approx(check["edge_auroc"])
    assert result["summary"]["circuit_edge_jaccard"] == circuit["edges"]["jaccard"]
    assert result["summary"]["circuit_edge_jaccard_between_components"] == \
        circuit["edges"]["between_components"]["jaccard"]


def test_circuit_part_under_cross_length_ablation() -> None:
    """With sources of another length, PARITY's per-length edge into the FFN (1/n, i/n) joins the
    exact circuit's movable edges, and a rotated copy still scores what the construction scores."""
    model = rotated_copy(build("parity", dtype="float64"), seed=2)
    runs = {ablation: diff(model, "parity", lengths=[2, 3, 4, 5], strings=16, parts=("circuit",),
                           circuit_method="acdc", circuit_ablation=ablation)
            for ablation in ("resample", "cross-length")}
    for ablation, result in runs.items():
        circuit, check = result["circuit"], result["circuit"]["method_check"]
        assert circuit["ablation"] == ablation == result["settings"]["circuit_ablation"]
        assert (circuit["edges"]["precision"], circuit["edges"]["recall"]) == (check["precision"], check["recall"])
    constant = {a: {e["edge"] for e in r["circuit"]["exact_circuit"]["edges"] if e["constant"]}
                for a, r in runs.items()}
    assert "pos->L0.MLP" in constant["resample"] - constant["cross-length"]
    with pytest.raises(ExactLensError,
                       match="circuit_ablation takes one of resample, mean, cross-length, zero, got 'shuffle'"):
        diff(model, "parity", lengths=[2], strings=4, parts=("circuit",), circuit_ablation="shuffle")


@pytest.mark.parametrize(("post_ln", "plain"), [("first-ln", "first"), ("parity-ln", "parity")])
def test_post_ln_twin_circuit_between_components(post_ln: str, plain: str) -> None:
    """Chiang & Cholak's layer-norm versions compute the same features through the same components,
    with a post-LN norm between any two: no raw edge of the plain circuit has a counterpart, every one
    has a component-level one (sender -> norms -> receiver), and ACDC finds exactly the plain circuit
    there."""
    result = diff(build(post_ln, dtype="float64"), plain, lengths=[1, 2, 3, 4, 6, 8], strings=32,
                  parts=("attention", "circuit"), circuit_method="acdc")
    edges = result["circuit"]["edges"]
    assert edges["truth_with_counterpart"] < edges["truth"]
    joined = edges["between_components"]
    assert joined["truth_with_counterpart"] == joined["truth"] == edges["truth"]
    assert joined["jaccard"] == 1.0 and joined["exact_only"] == []


def test_random_model_scores_low() -> None:
    exact = build("parity", dtype="float64")
    model = ExactTransformer(exact.cfg.replace(residual_labels=None)).init_weights(seed=1).eval()
    result = diff(model, "parity", lengths=LENGTHS, strings=32, parts=NO_DAS)
    assert result["behaviour"]["agreement"] < 0.8
    computed = {f["label"]: f["best_r2"] for f in result["probes"]["features"]}
    assert computed["s"] < 0.5 and computed["I[i=k]/n"] < 0.5  # the circuit's own features are absent
    assert all(abs(p["qk_cosine"]) < 0.9 for p in result["weights"]["pairs"] if p["qk_cosine"] is not None)
    assert all(f["iia_changed"] is None or f["iia_changed"] <= 0.75 for f in result["interventions"]["features"])


def test_flawed_first_against_first_section_5_2() -> None:
    """Flawed FIRST (c = 3, one layer) against FIRST (c = 1): CLS -> position 1 is e^c/(e^c + n - 1) in
    the flawed head and in FIRST's second-layer head, 1/n in FIRST's first layer (W^Q = W^K = 0);
    the flawed model is right iff c > log|w|, i.e. |w| <= 20 for c = 3 (§5.2)."""
    lengths = [2, 8, 20, 21, 30]
    result = diff(build("first-flawed", dtype="float64", c=3.0), "first", lengths=lengths, strings=64, parts=NO_DAS)
    rows = {r["length"]: r for r in result["attention"]["cls_to_first"]["rows"]}
    for length in lengths:
        n = length + 1
        assert rows[length]["trained"][0][0] == pytest.approx(math.exp(3) / (math.exp(3) + n - 1), rel=1e-9)
        assert rows[length]["exact"][1][0] == pytest.approx(math.e / (math.e + n - 1), rel=1e-9)
        assert rows[length]["exact"][0][0] == pytest.approx(1 / n, rel=1e-9)
    (m,) = result["attention"]["matching"]
    assert (m["trained_layer"], m["exact_layer"]) == (0, 1)  # the flawed head is FIRST's second-layer head
    behaviour = {r["length"]: r for r in result["behaviour"]["rows"]}
    assert all(behaviour[n]["trained_accuracy"] == 1.0 for n in (2, 8, 20))
    assert behaviour[21]["trained_accuracy"] < 1.0 and behaviour[30]["trained_accuracy"] < 1.0
    (pair,) = result["weights"]["pairs"]
    assert pair["qk_cosine"] > 1 - 1e-9  # same query/key circuit (CLS looks for I[i=1]) ...
    assert abs(pair["ov_cosine"]) < 1e-6  # ... but values from the tokens, not from I[w_1 = 1] (§5.2)
    and_feature = next(f for f in result["probes"]["features"] if f["label"] == "I[w_i=1 & i=1]")
    assert and_feature["best_r2"] < 0.9  # an AND is no linear function of the one-layer model's activations
    # FIRST's circuit: an FFN computes the AND (embed -> L0.MLP), the second head moves it (L0.MLP -> L1.H0);
    # the one-layer model has no FFN before its head, so neither edge has a counterpart; the head's write to
    # the output is found (its head is matched to L1.H0, its MLP follows it to L1.MLP)
    circuit = result["circuit"]
    assert circuit["node_map"]["L0.H0"] == "L1.H0" and circuit["node_map"]["L0.MLP"] == "L1.MLP"
    assert circuit["edges"]["exact_only"] == ["L0.MLP->L1.H0", "embed->L0.MLP"]
    assert circuit["edges"]["truth_with_counterpart"] == 1 and circuit["edges"]["recall_of_reachable"] == 1.0
    assert circuit["nodes"]["exact_only"] == ["L0.MLP"]
    assert circuit["method_check"]["recall"] == 1.0  # EAP does find the whole circuit in FIRST itself


def test_bridge_export_against_its_construction() -> None:
    """A bridge is read as an ExactTransformer copy (its weights, outputs checked equal), so every part
    applies, the circuit too; a callable readout is applied by the copy to its full logits (the same)."""
    pytest.importorskip("transformer_lens.model_bridge")
    bridge = build("first", dtype="float64").to_bridge(length=9)
    result = diff(bridge, "first", lengths=[1, 2, 4, 8], strings=16, parts=("behaviour", "probes", "attention"))
    assert result["behaviour"]["agreement"] == 1.0
    assert result["trained"]["kind"] == "foreign" and result["trained"]["imported"]
    assert result["trained"]["vocab_check"] == "names" and result["settings"]["readout"] == "cls"
    assert all(m["distance"] < 1e-9 for m in result["attention"]["matching"])
    assert all(f["best_r2"] > 0.9999 for f in result["probes"]["features"] if not f["constant"])
    circuit = diff(bridge, "first", lengths=[2, 4], strings=8, parts=("circuit",))["circuit"]
    assert circuit["available"] and circuit["edges"]["jaccard"] == 1.0

    def at_cls(logits, n_positions):
        return logits[:, 0, 0]

    called = diff(bridge, "first", lengths=[2, 4], strings=8, parts=("behaviour", "circuit"), readout=at_cls)
    assert called["behaviour"]["agreement"] == 1.0 and called["trained"]["imported"]
    assert called["settings"]["readout"] == "callable at_cls"
    assert called["circuit"]["available"] and called["circuit"]["edges"]["jaccard"] == 1.0


def test_bad_input() -> None:
    model = build("first", dtype="float64")
    with pytest.raises(ExactLensError, match="unknown construction"):
        diff(model, "no-such-thing")
    other = ExactTransformer(ExactConfig(d_model=4, n_layers=1, d_vocab=3, vocab=("a", "b", "[CLS]")))
    with pytest.raises(ExactLensError, match="vocabulary"):
        diff(other, "first")
    learned = ExactTransformer(
        ExactConfig(
            d_model=4,
            n_layers=1,
            d_vocab=3,
            vocab=("0", "1", "[CLS]"),
            positional_features=("learned",),
            n_ctx=5,
            readout="sigmoid",
        )
    )
    with pytest.raises(ExactLensError, match="n_ctx=5"):
        diff(learned, "first", lengths=[4, 5])
    with pytest.raises(ExactLensError, match="parts"):
        diff(model, "first", parts=("probes", "vibes"))
    with pytest.raises(ExactLensError, match="circuit_method takes one of patching, eap, acdc, eap-ig-inputs, "
                       "eap-ig-activations, edge-patching, got 'magic'"):
        diff(model, "first", circuit_method="magic")
    with pytest.raises(ExactLensError, match="circuit_granularity takes one of head, qkv, got 'neuron'"):
        diff(model, "first", circuit_granularity="neuron")


def test_cli_json_html_and_errors(tmp_path, capsys) -> None:
    page = tmp_path / "diff.html"
    code = main(
        [
            "diff",
            "first-flawed",
            "--against",
            "first",
            "--lengths",
            "1:4",
            "--strings",
            "16",
            "--json",
            "--html",
            str(page),
        ]
    )
    out = capsys.readouterr()
    assert code == 0
    result = json.loads(out.out)  # exactly one JSON object on stdout
    assert {
        "trained",
        "exact",
        "settings",
        "behaviour",
        "probes",
        "attention",
        "weights",
        "interventions",
        "circuit",
        "summary",
    } <= set(result)
    text = page.read_text()
    assert "I[w_i=1 &amp; i=1]" in text and "<iframe" in text
    assert result["circuit"]["available"] and "<h3>Circuit: the trained model" in text and text.count("<svg") >= 2
    assert (tmp_path / "diff_files" / "trained_attention.html").is_file()
    assert main(["diff", str(tmp_path), "--against", "first"]) == 2  # a directory without a checkpoint
    assert "not an exactlens checkpoint" in capsys.readouterr().err
    assert main(["diff", "no-such-model", "--against", "first"]) == 2
    assert "neither a checkpoint directory nor a construction name" in capsys.readouterr().err


@pytest.mark.slow
def test_trained_scaled_first_matches_the_exact_head() -> None:
    """A scaled FIRST model (log-n attention, §5.3) trained on |w| <= 10: its second-layer head is
    matched to the exact second-layer head, and at long words it still puts far more attention on
    position 1 than the 1/n of a uniform head."""
    from exactlens.train import train

    run = train(
        "first",
        seed=0,
        epochs=150,
        strings_per_epoch=100,
        batch_size=10,
        train_length=[1, 10],
        test_length=50,
        test_strings=100,
        eval_every=0,
        lr=1e-3,
        scaled=True,
    )
    result = diff(run.model, "first-log", lengths=[2, 8, 32, 128], strings=32, parts=NO_DAS)
    assert result["behaviour"]["trained_accuracy"] == 1.0
    pairs = {
        (m["trained_layer"], m["trained_head"]): (m["exact_layer"], m["exact_head"])
        for m in result["attention"]["matching"]
    }
    assert pairs[(1, 0)] == (1, 0)
    longest = result["attention"]["cls_to_first"]["rows"][-1]
    assert longest["trained"][1][0] > 10 / (longest["length"] + 1)


@pytest.mark.parametrize("name", sorted(construction_sample()))
def test_every_construction_against_itself_through_the_cli(name: str, capsys) -> None:
    """`exactlens diff X --against X` works for every construction and task kind, and scores the
    exact side with the decision rule verify uses (the same accuracy on exhaustive lengths)."""
    shortest, longest = get(name).length_range()
    # a compiled program stops at 5; majority-per-position's words are >= 6 long (their margin)
    lengths = [n for n in (2, 4, 6, 8) if n >= shortest and (longest is None or n <= longest)][:3]
    assert main(["diff", name, "--against", name, "--lengths", ",".join(map(str, lengths)), "--strings", "64",
                 "--json", "--parts", ",".join(NO_DAS)]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["task"]["name"] == get(name).task_of().name
    rows = result["behaviour"]["rows"]
    assert [r["length"] for r in rows] == lengths
    assert all(r["agreement"] == 1.0 for r in rows)
    verified = {r["length"]: r for r in verify(name, lengths, strings=64, exhaustive_limit=64)["results"]}
    for row in rows:
        if row["exhaustive"] and verified[row["length"]]["exhaustive"]:
            assert row["exact_accuracy"] == verified[row["length"]]["accuracy"], row


def test_models_of_different_tasks_are_refused_in_one_line(capsys) -> None:
    assert main(["diff", "first", "--against", "majority", "--lengths", "2"]) != 0
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("exactlens: error:")]
    assert len(errors) == 1 and "different tasks" in errors[0], errors
    assert "task 'first' (membership)" in errors[0] and "task 'majority' (classification" in errors[0]


@pytest.mark.parametrize("name", ["first", "majority", "induction-recent", "sm-solution2", "palindrome-hash"])
def test_alignment_runs_for_every_task_kind(name: str, capsys) -> None:
    """DAS runs on every kind (membership, classification, prediction, regression) and on mixed
    normalization with hard attention; tiny settings: this checks the plumbing, not the scores."""
    assert main(["diff", name, "--against", name, "--lengths", "4,5", "--strings", "16", "--json", "--parts",
                 "alignment", "--das-max-dim", "1", "--das-steps", "5", "--alignment-pairs", "10",
                 "--no-untrained-baseline"]) == 0
    result = json.loads(capsys.readouterr().out)
    rows = result["alignment"]
    assert rows, result["alignment_details"]["skipped"]
    for row in rows:
        # k in 1..--das-max-dim, or the variable's own dimension where it needs more (classes - 1)
        assert 0 <= row["iia"] <= 1 and row["dim"] in (1, row["variable_dim"]) and row["pairs"] > 0, row
    assert "mean_das_iia_changed" in result["summary"]

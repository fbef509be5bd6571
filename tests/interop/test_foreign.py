"""Models no exactlens code built, trained by the user's own loop: a TransformerLens 3.9 HookedTransformer
(bidirectional answering at [CLS]; causal answering at the last token with a two-logit head), a TransformerLens 4
``boot_native`` bridge, and a bridge over a Hugging Face model built from a config; each handed to diff, discover,
hull and circuit. The TL 3.9 tests run in the second environment (``make test-tl39``, marker ``tl39``)."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
import torch

import exactlens as el
from exactlens import tasks
from exactlens.errors import ExactLensError
from exactlens.interop.foreign import facts, family, untrained_foreign
from exactlens.interop.readout import Readout, parse_readout

FIRST = tasks.get("first")


def _tl3() -> type | None:
    try:
        from transformer_lens import HookedTransformer  # TL 3.9; TL 4 removed it
    except ImportError:
        return None
    return HookedTransformer


def _bridge_available() -> bool:
    try:
        from transformer_lens.model_bridge.sources import boot_native  # noqa: F401
    except ImportError:
        return False
    return True


def tl3_model(causal: bool, outputs: int, n_layers: int = 1, norm: str = "LN") -> object:
    from transformer_lens import HookedTransformerConfig

    cfg = HookedTransformerConfig(d_model=16, d_head=8, n_heads=2, n_layers=n_layers, n_ctx=12, d_vocab=3,
                                  d_vocab_out=outputs, d_mlp=16, act_fn="relu", normalization_type=norm,
                                  attention_dir="causal" if causal else "bidirectional", seed=0)
    return _tl3()(cfg)


def native_bridge(causal: bool, outputs: int, n_layers: int = 1, norm: str = "LN") -> object:
    from transformer_lens.config import TransformerBridgeConfig
    from transformer_lens.model_bridge.sources import boot_native

    cfg = TransformerBridgeConfig(d_model=16, d_head=8, n_heads=2, n_layers=n_layers, n_ctx=12, d_vocab=3,
                                  d_vocab_out=outputs, d_mlp=16, act_fn="relu", normalization_type=norm,
                                  attention_dir="causal" if causal else "bidirectional",
                                  architecture="TransformerLensNative", seed=0)
    return boot_native(cfg)


def train_first(model: object, at_last: bool, steps: int = 120) -> object:
    """The user's own loop: FIRST's words with [CLS] first, the answer read at [CLS] or at the last token."""
    torch.manual_seed(0)
    opt = torch.optim.Adam(model.parameters(), 1e-2)
    gen = torch.Generator().manual_seed(0)
    for step in range(steps):
        ids = FIRST.sample(1 + step % 8, 32, gen)
        at = model(FIRST.encode(ids).tokens)[:, -1 if at_last else 0]
        y = FIRST.targets(ids)
        if at.shape[-1] >= 2:
            loss = torch.nn.functional.cross_entropy(at, y.long())
        else:
            loss = torch.nn.functional.binary_cross_entropy_with_logits(at[:, 0], y.double().to(at.dtype))
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model.eval()


MAKERS = [
    pytest.param(tl3_model, id="tl3", marks=[
        pytest.mark.tl39, pytest.mark.skipif(_tl3() is None, reason="needs TransformerLens 3 (HookedTransformer)")]),
    pytest.param(native_bridge, marks=pytest.mark.skipif(not _bridge_available(), reason="needs TransformerLens 4"),
                 id="tl4-native"),
]


def test_readout_texts() -> None:
    assert parse_readout("last/1-0") == Readout("last", ("diff", 1, 0))
    assert parse_readout("CLS") == Readout("cls") and parse_readout(-1) == Readout(-1)
    assert parse_readout("every/0:2").text == "every/0:2" and parse_readout(None) is None
    for bad in ("middle", "last/", "last/x", "cls/2:1", True):
        with pytest.raises(ExactLensError, match="readout"):
            parse_readout(bad)
    logits = torch.tensor([[[0.0, 1.0], [2.0, 5.0], [9.0, 9.0]]])
    assert Readout("last", ("diff", 1, 0)).apply(FIRST, logits, torch.tensor([2])).tolist() == [3.0]
    with pytest.raises(ExactLensError, match="output shape.*cls/1-0"):
        Readout("cls").apply(FIRST, logits, torch.tensor([3]))


def test_task_conventions() -> None:
    d = el.task("first").to_dict()
    assert d["token_ids"] == {"0": 0, "1": 1, "[CLS]": 2} and d["readout"] == "cls"
    assert d["special_tokens"] == [{"token": "[CLS]", "id": 2, "position": "first (0)"}]
    assert d["example"]["tokens"][0] == 2 and d["example"]["target"] == FIRST.target(d["example"]["word"])
    assert el.task("dyck", k=1)["token_ids"]["("] == 0


@pytest.mark.parametrize("make", MAKERS)
def test_causal_model_answering_at_the_last_token(make) -> None:
    model = train_first(make(causal=True, outputs=2), at_last=True)
    assert family(model) in ("hooked_transformer", "bridge") and facts(model)["causal"]
    # the task's default readout ([CLS], one logit) does not fit a two-logit head: refused, naming what fits
    with pytest.raises(ExactLensError, match="output shape.*'last/1-0' \\(accuracy 1.000\\)"):
        el.diff(model, "first", lengths=[2, 4, 8], strings=16, parts=("behaviour",))
    result = el.diff(model, "first", lengths=[2, 4, 8], strings=16, parts=("behaviour", "circuit"),
                     readout="last/1-0")
    assert result["settings"]["readout"] == "last/1-0" and result["trained"]["imported"]
    assert result["summary"]["agreement"] >= 0.95 and result["circuit"]["available"]


@pytest.mark.parametrize("make", MAKERS)
def test_one_logit_model_read_at_the_wrong_position_warns(make) -> None:
    model = train_first(make(causal=True, outputs=1), at_last=True)
    with pytest.warns(UserWarning, match="near chance.*'last' gives 1.000"):
        result = el.diff(model, "first", lengths=[2, 4, 8], strings=16, parts=("behaviour",))
    assert "near chance" in result["trained"]["readout_warning"]


@pytest.mark.parametrize("make", MAKERS)
def test_bidirectional_model_at_cls_through_every_verb(make) -> None:
    model = train_first(make(causal=False, outputs=1, n_layers=2), at_last=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # read right: no readout warning
        result = el.diff(model, "first", lengths=[2, 4, 8], strings=16, parts=("behaviour",))
    assert result["settings"]["readout"] == "cls" and result["summary"]["trained_accuracy"] >= 0.95
    with pytest.raises(ExactLensError, match="records no task: name it"):
        el.discover(model, "eap", against="first")
    found = el.discover(model, "eap", against="first", task="first", lengths=[2, 3], words=16)
    assert found["overlap"]["comparable"] and found["foreign"]["task"]["name"] == "first"
    hull = el.hull(model, task="first")
    assert [layer["layer"] for layer in hull["layers"]] == [0, 1] and hull["foreign"]["readout"] == "cls"
    assert "task 'first'" in hull["target"]["tokens"] and hull["target"]["lengths"] == [3, 7, 11]
    checked = el.verify(model, task="first", lengths=[2, 4], strings=16)
    assert checked["target"]["readout"] == "cls" and min(r["accuracy"] for r in checked["results"]) >= 0.95
    with pytest.raises(ExactLensError, match="no weights-read circuit|named residual features.*discover"):
        el.circuit(model, task="first")
    baseline, how = untrained_foreign(model, FIRST, Readout("cls"), seed=1)
    assert "init_weights" in how and baseline is not None
    assert not torch.equal(baseline.W_E.float(), model.W_E.detach().float().cpu())


def last_logodds(logits: torch.Tensor, n_positions: torch.Tensor) -> torch.Tensor:
    """A user's readout: the log-odds (accept minus reject) at each word's last token."""
    at = logits[torch.arange(len(n_positions)), n_positions - 1]
    return at[:, 1] - at[:, 0]


def by_hand(model: object, length: int) -> float:
    """The accuracy of a last-token two-logit model on every word of a length, from its own forward."""
    ids = FIRST.words(length, 2**length, torch.Generator().manual_seed(0), exhaustive_limit=4096)[0]
    with torch.no_grad():
        logits = model(FIRST.encode(ids).tokens)[:, -1]
    return float(((logits[:, 1] > logits[:, 0]) == FIRST.targets(ids).bool()).double().mean())


@pytest.mark.parametrize("make", MAKERS)
def test_a_model_whose_weights_cannot_be_copied_is_verified_through_its_forward(make) -> None:
    model = train_first(make(causal=True, outputs=2, norm="RMS"), at_last=True)
    result = el.verify(model, task="first", readout="last/1-0", lengths=[2, 8], strings=16)
    target = result["target"]
    assert target["imported"] is None and "normalization_type='RMS'" in target["import_refused"]
    assert result["results"][1]["accuracy"] == by_hand(model, 8)
    with pytest.raises(ExactLensError, match="RMS.*reads the weights or hooks of that copy"):
        el.hull(model, task="first", readout="last/1-0")
    hooked = el.diff(model, "first", lengths=[2, 4], strings=8, parts=("behaviour", "circuit"), readout="last/1-0")
    assert hooked["behaviour"]["agreement"] >= 0.95 and "RMS" in hooked["trained"]["import_refused"]
    assert not hooked["circuit"]["available"] and "runs edge by edge on ExactTransformer" in hooked["circuit"]["reason"]
    scan = el.precision(make(causal=True, outputs=2, norm="RMS"), task="first", readout="last/1-0", strings=8)
    assert scan["first_failure_length"] is not None  # untrained: its float64 twin is the module widened
    assert scan["float64"]["applies"] and scan["float64"]["twin"] == "the model in float64"


@pytest.mark.parametrize("make", MAKERS)
def test_verify_and_precision_of_a_causal_model(make) -> None:
    model = train_first(make(causal=True, outputs=2), at_last=True)
    with pytest.raises(ExactLensError, match="records no task: name it"):
        el.verify(model, lengths=[2])
    with pytest.raises(ExactLensError, match="output shape.*'last/1-0' \\(accuracy 1.000\\)"):
        el.verify(model, task="first", lengths=[2])
    result = el.verify(model, task="first", readout="last/1-0", lengths=[2, 8], strings=16)
    assert result["target"]["kind"] == "foreign" and result["target"]["readout"] == "last/1-0"
    assert result["results"][1]["strings"] == 256 and result["results"][1]["accuracy"] == by_hand(model, 8) >= 0.95
    called = el.verify(model, task="first", readout=last_logodds, lengths=[2, 8], strings=16)
    assert [r["accuracy"] for r in called["results"]] == [r["accuracy"] for r in result["results"]]
    scan = el.precision(model, task="first", readout="last/1-0", strings=8)
    assert max(r["length"] for r in scan["checked"]) <= 11  # n_ctx 12 less [CLS]
    # an untrained model fails at once; its float64 twin fails the same: the function, not floating point
    untrained = make(causal=True, outputs=2)
    near_chance = el.verify(untrained, task="first", readout="last/1-0", lengths=[4, 6, 8], strings=32)
    assert "near chance" in near_chance["readout_warning"]
    scan = el.precision(untrained, task="first", readout="last/1-0", strings=8)
    assert scan["first_failure_length"] is not None and scan["float64"]["applies"]
    assert scan["float64"]["cause"].startswith("the model's function")


@pytest.mark.parametrize("make", MAKERS)
def test_a_callable_readout_in_discover_and_hull(make) -> None:
    model = train_first(make(causal=True, outputs=2), at_last=True)
    kw = {"against": "first", "task": "first", "lengths": [2, 3], "words": 16}
    by_text = el.discover(model, "eap", readout="last/1-0", **kw)
    by_fn = el.discover(model, "eap", readout=last_logodds, **kw)
    assert by_fn["foreign"]["readout"] == "callable last_logodds"
    assert [e["score"] for e in by_fn["edges"]] == pytest.approx([e["score"] for e in by_text["edges"]], abs=1e-6)
    hull = el.hull(model, task="first", readout=last_logodds)
    assert hull["foreign"]["readout"] == "callable last_logodds" and len(hull["layers"]) == 1
    with pytest.raises(ExactLensError, match="readout callable gives shape \\(4, 3, 2\\).*must give \\(4,\\)"):
        el.hull(model, task="first", readout=lambda logits, n_positions: logits)


@pytest.mark.parametrize("make", MAKERS)
def test_report_section_for_the_model(make, tmp_path) -> None:
    model = train_first(make(causal=True, outputs=2), at_last=True)
    done = el.report(out=tmp_path / "r", model=model, against="first", task="first", readout="last/1-0", quick=True)
    page = Path(done["index"]).read_text()
    data = json.loads((tmp_path / "r" / "data" / "your_model.json").read_text())
    report = json.loads((tmp_path / "r" / "data" / "report.json").read_text())
    assert report["errors"] == [] and [s["id"] for s in report["sections"]] == ["your-model"]
    assert 'id="your-model"' in page and "DAS verdicts" in page
    assert min(r["accuracy"] for r in data["behaviour"]["results"]) >= 0.95
    assert data["diff"]["summary"]["agreement"] >= 0.95 and data["diff"]["summary"]["verdicts"]
    assert [layer["layer"] for layer in data["hull"]["layers"]] == [0]
    alone = el.report(out=tmp_path / "alone", model=model, task="first", readout="last/1-0", quick=True)
    data = json.loads((Path(alone["index"]).parent / "data" / "your_model.json").read_text())
    assert not data["diff"]["applies"] and "against=NAME" in data["diff"]["reason"] and data["hull"]["layers"]
    with pytest.raises(ExactLensError, match="give model="):
        el.report(out=tmp_path / "none", against="first")


@pytest.mark.skipif(not _bridge_available(), reason="needs TransformerLens 4")
def test_bridge_over_a_hugging_face_model(tmp_path) -> None:
    transformers = pytest.importorskip("transformers")
    from transformer_lens.model_bridge import TransformerBridge

    config = transformers.GPT2Config(vocab_size=3, n_positions=12, n_embd=16, n_layer=1, n_head=2,
                                     activation_function="relu")
    config.save_pretrained(tmp_path)  # read from here: nothing is downloaded
    hf = transformers.GPT2LMHeadModel(config)  # built in training mode (dropout on): read in eval mode
    bridge = TransformerBridge.boot_transformers(str(tmp_path), hf_model=hf, device="cpu")
    assert "Hugging Face GPT2LMHeadModel" in facts(bridge)["source"]
    bridge = train_first(bridge.train(), at_last=True)  # three logits: reject, accept and the [CLS] token's
    result = el.diff(bridge, "first", lengths=[2, 4, 8], strings=16, parts=("behaviour", "circuit"),
                     readout="last/1-0")
    trained = result["trained"]
    assert trained["answer_readout"] == "last/1-0" and result["settings"]["readout"] == "last/1-0"
    assert trained["imported"] and result["circuit"]["available"]
    assert result["summary"]["agreement"] >= 0.95
    checked = el.verify(bridge, task="first", readout="last/1-0", lengths=[8], strings=16)
    assert checked["target"]["imported"] and checked["results"][0]["accuracy"] == by_hand(bridge, 8)
    baseline, how = untrained_foreign(bridge, FIRST, Readout("last", ("diff", 1, 0)), seed=1)
    assert baseline is not None and ("init_weights" in how or "_init_weights" in how)

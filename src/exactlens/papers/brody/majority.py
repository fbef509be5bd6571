"""MAJORITY (Brody, Alon & Yahav 2023, §4.1, App. E.1): the exact averaging construction, the
training preset of Fig. 2-3, and the query-angle read-out.

Preset (§4.1 / App. E.1): one layer, d = 8, 20 classes, |w| = 50, Adam lr 1e-3 with a linear
schedule, batch 6000; layer norm full, scaling only (no projection: ln_center=False) or none.
The paper's 584 parameters at d = 8 fit one attention layer without biases, no FFN and no
positional encoding (20*8 embeddings + 4*64 attention + 8*20 output + 8 LN); we keep that shape
with pre-LN (LN before attention, where its projection acts on keys and queries), a [CLS]
readout and LN gain and bias, so our count differs by a few parameters.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from exactlens.constructions.cookbook import Layer, Program, Readout, compile
from exactlens.constructions.cookbook import attention as att
from exactlens.constructions.registry import Construction, register
from exactlens.errors import ExactLensError
from exactlens.model import ExactTransformer
from exactlens.tasks import CLS, Majority
from exactlens.train.metrics import Metric
from exactlens.train.presets import (
    ARCHITECTURE_OPTIONS,
    Preset,
    check_architecture_options,
    comparable_config,
    positive_int,
    register_preset,
)

PAPER = "Brody et al. 2023"


def majority(num_classes: int = 20, dtype: str = "float32") -> ExactTransformer:
    """Brody et al. §4.1: "exact averaging of the keys". One layer, uniform attention
    (q = 0, so every key gets score 0 and softmax weight exactly 1/n) copies the
    class one-hots: frac_c = count_c / n at [CLS]; the [CLS] indicator gives 1/n.
    Logit_c = frac_c - (c / k) (1/n) = (count_c - c/k) / n: the most frequent class
    wins by >= 1/(k n), ties go to the smallest class index (the task's rule)."""
    lang = Majority(num_classes)
    classes = lang.classes
    embedding = {c: {f"is_{c}": 1.0} for c in classes} | {CLS: {"is_cls": 1.0}}
    values = {f"frac_{c}": f"is_{c}" for c in classes} | {"1/n": "is_cls"}
    layer = Layer(heads=(att.uniform_average(values, name="average"),), mask="none", weighting="softmax")
    readout = Readout(
        {c: {f"frac_{c}": 1.0, "1/n": -index / num_classes} for index, c in enumerate(classes)},
        kind="logits",
        position=0,
    )
    program = Program(vocab=lang.vocab, embedding=embedding, layers=(layer,), readout=readout, name="majority")
    model = compile(program, dtype)
    model.cfg.metadata.update(decision="argmax class")
    return model


# ---- Fig. 2b: the angle between the CLS query and the ones vector -------------------------------


def _query_angle(model: Any, batch: Any, cache: dict[str, torch.Tensor]) -> dict[str, float]:
    """Angle between the first layer's CLS query, as a direction in the (normalized) residual space
    (w * W_K q, with w the pre-LN gain: keys are LN(x) W_K with LN(x) = n(x) * w + b, so the query
    acts on n(x) through w * (W_K q)), and the line through the all-ones vector; summed over words,
    averaged over heads."""
    q = cache["blocks.0.attn.hook_q"][:, 0]  # [b, h, d_head] at CLS
    block = model.blocks[0]
    direction = torch.einsum("bhd,hmd->bhm", q, block.attn.W_K)
    if block.norm == "pre":
        direction = direction * block.ln1.w
    cos = direction.sum(-1).abs() / (direction.norm(dim=-1) * math.sqrt(model.cfg.d_model)).clamp(min=1e-30)
    return {"test_query_angle_deg": float(torch.rad2deg(torch.arccos(cos.clamp(max=1.0))).mean(1).sum())}


QUERY_ANGLE = Metric(
    ("test_query_angle_deg",),
    lambda name: name == "blocks.0.attn.hook_q",
    _query_angle,
    "angle (degrees) between the first layer's CLS query and the ones line (Brody et al. Fig. 2b)",
)


def _config(task, o: dict[str, Any]):
    return comparable_config(task, o, name="majority", n_layers=1, n_heads=1, positional_features=(),
                             normalization="pre", attn_bias=False)


def _validate(o: dict[str, Any]) -> None:
    check_architecture_options(o)
    positive_int("num_classes", o["num_classes"], minimum=2)
    if o["train_length"][0] < 1 or o["test_length"][0] < 1:
        raise ExactLensError("majority words need |w| >= 1 (the empty word has no majority)")


MAJORITY_PRESET = Preset(
    name="majority",
    task="majority",
    paper=f"{PAPER}, §4.1, App. E.1",
    summary="MAJORITY: 1 layer, d = 8, 20 classes, |w| = 50, logits at CLS; layer norm full / scale_only / none",
    config=_config,
    defaults=dict(
        epochs=1000, strings_per_epoch=6000, test_strings=2000, lr=1e-3, lr_schedule="linear", d_model=8, d_mlp=0,
        ln_eps=1e-5, num_classes=20, train_length=50, test_length=50, scaled=False, layer_norm="full",
    ),
    options={**ARCHITECTURE_OPTIONS, "num_classes": "number of classes (2..26)"},
    task_params=lambda o: {"num_classes": o["num_classes"]},
    validate=_validate,
    metrics=(QUERY_ANGLE,),
    null_fields=("test_attn_first",),  # every record had it before metrics were per preset
)


PAPER_STEPS, PAPER_BATCH = 17_000, 6000  # App. E.1

MAJORITY_PER_POSITION = Preset(
    name="majority-per-position",
    task="majority",
    paper=f"{PAPER}, §4.1, App. E.1",
    summary="MAJORITY as the paper frames it: the word's majority class predicted at every position; 1 layer, "
    "d = 8, 20 classes, |w| = 50; the paper's 17K steps of 6000 words scaled to 2000 steps of 250",
    config=_config,
    defaults=dict(
        epochs=2000, strings_per_epoch=250, test_strings=2000, lr=1e-2, lr_schedule="linear", d_model=8, d_mlp=0,
        ln_eps=1e-5, num_classes=20, train_length=50, test_length=50, scaled=False, layer_norm="full",
        eval_every=100,
    ),
    options={**ARCHITECTURE_OPTIONS, "num_classes": "number of classes (2..26)"},
    task_params=lambda o: {"num_classes": o["num_classes"], "per_position": True},
    validate=_validate,
    metrics=(QUERY_ANGLE,),
)


def register_majority() -> None:
    register(Construction("majority", "majority", majority, f"{PAPER} §4.1",
                          "most frequent of num_classes classes: uniform attention, logits (count_c - c/k)/n at CLS",
                          task_params=lambda p: {"num_classes": p["num_classes"]}))
    register_preset(MAJORITY_PRESET)
    register_preset(MAJORITY_PER_POSITION)

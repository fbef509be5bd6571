"""Nowak et al. 2022 §4.2 training preset for ONE.

The sizes and optimizer of Chiang & Cholak §5.1 (d_model 16, d_FFNN 64, post-LN, Adam lr 3e-4,
100 fresh strings per epoch), LN eps 1e-1 as the paper states, and ONE's exact-solution position
feature (i/n, §3.1.1) or FIRST's (I[i=1]); fixed or variable lengths (train_length).
"""

from __future__ import annotations

from typing import Any

from exactlens.errors import ExactLensError
from exactlens.train.metrics import ATTENTION_TO_FIRST
from exactlens.train.presets import (
    ARCHITECTURE_OPTIONS,
    Preset,
    check_architecture_options,
    comparable_config,
)

POSITIONS = {"paper": ("i/n",), "first": ("I[i=1]",)}


def _config(task, o: dict[str, Any]):
    return comparable_config(task, o, name="one", n_layers=1, n_heads=1, positional_features=POSITIONS[o["positions"]])


def _validate(o: dict[str, Any]) -> None:
    check_architecture_options(o)
    if o["positions"] not in POSITIONS:
        raise ExactLensError(f"one: positions={o['positions']!r} is not allowed; choose one of {', '.join(POSITIONS)}")


ONE = Preset(
    name="one",
    task="one",
    paper="Nowak et al. 2022, §4.2, Fig. 5",
    summary="ONE: 1 layer x 1 head, position feature i/n (§3.1.1) or FIRST's I[i=1]; fixed or variable lengths",
    config=_config,
    defaults=dict(
        epochs=1000, strings_per_epoch=100, test_strings=100, lr=3e-4, d_model=16, d_mlp=64, ln_eps=1e-1,
        scaled=False, layer_norm="full", positions="paper", train_length=100, test_length=1000,
    ),
    options={**ARCHITECTURE_OPTIONS, "positions": "'paper' (the exact solution's i/n) or 'first' (FIRST's I[i=1])"},
    validate=_validate,
    metrics=(ATTENTION_TO_FIRST,),
    null_fields=("test_query_angle_deg",),  # every record had it before metrics were per preset
)


PALINDROME_TRAINING = {"epochs": 600, "train_length": (1, 16), "test_length": (1, 16)}
"""PALINDROME in the shapes of palindrome, palindrome-robust and palindrome-hash (Nowak et al. train
none): 2400 Adam steps of 128 words at |w| 1..16 (exactlens.train.shaped's other settings)."""

"""Where an exact label is settled (``probes.features[].exact_site``, the site the alignment patches it at)
in post-LN constructions, and which direction stands for it in a doubled residual [x; -x].

A post-LN model rescales the whole stream at every norm, so a label's value changes after it is written;
Chiang & Cholak Prop. 2's confidence layer then clears the stream but s. Before, every label of first-ln
and parity-ln-eta "settled" only at the last site (where no patch changes a decision), so each exact label
was untestable in their self-diffs. The check here is independent of the rule: the post-LN twin of a
norm-free construction computes each label in the same component, so it must settle at the same site.
"""

from __future__ import annotations

import math

import pytest
import torch

from exactlens.analysis.diff import diff
from exactlens.constructions import build
from exactlens.model.labels import is_negated_copy, label_direction, negated_label


def _settled(name: str) -> dict[str, str]:
    result = diff(build(name, dtype="float64"), name, lengths=[4, 5], parts=("probes",), untrained_baseline=False)
    return {f["label"]: f["exact_site"] for f in result["probes"]["features"]}


@pytest.mark.parametrize(("plain", "twin"), [("first", "first-ln"), ("parity", "parity-ln"),
                                             ("parity", "parity-ln-eta"), ("first", "first-ln-eta"),
                                             ("first-log", "first-log-ln")])
def test_a_post_ln_twin_settles_each_label_where_the_norm_free_construction_does(plain: str, twin: str) -> None:
    norm_free, post_ln = _settled(plain), _settled(twin)
    compared = 0
    for label, site in norm_free.items():
        if label in post_ln:  # the dimensions the confidence layer reuses for s-bar are renamed "L | s-bar"
            assert post_ln[label] == site, (label, site, post_ln[label])
            assert post_ln[negated_label(label)] == site, label
            compared += 1
    assert compared >= len(norm_free) - 2
    # the written labels are the ones that matter: none of them waits for the last site any more
    assert post_ln["s"] == "blocks.1.hook_resid_mid" and norm_free["s"] == "blocks.1.hook_resid_mid"


def test_a_doubled_residual_label_is_one_direction() -> None:
    labels = ["a", "b", "-(a)", "-(b)", "c"]
    a = label_direction(labels, "a")
    assert torch.allclose(a, torch.tensor([1, 0, -1, 0, 0], dtype=torch.float64) / math.sqrt(2))
    assert torch.equal(label_direction(labels, "c"), torch.tensor([0, 0, 0, 0, 1.0], dtype=torch.float64))
    assert is_negated_copy(labels, "-(a)") and not is_negated_copy(labels, "a")
    assert not is_negated_copy(["-(x)"], "-(x)")  # a label that only looks negated


def test_the_alignment_tests_a_doubled_label_as_one_variable() -> None:
    """first-ln's AND label is one DAS variable (its negated copy is skipped, with the reason), patched along
    e_L - e_-(L) at the first FFN's output: the exact model's own decisions change through it."""
    model = build("first-ln", dtype="float64")
    result = diff(model, "first-ln", lengths=[4, 5], parts=("alignment",), untrained_baseline=False,
                  das_steps=10, das_max_dim=1, alignment_pairs=48)
    details = result["alignment_details"]
    names = {v["variable"] for v in details["variables"] if v["origin"] == "exact"}
    assert "I[w_i=1 & i=1]" in names and "-(I[w_i=1 & i=1])" not in names
    skipped = {s["variable"]: s["reason"] for s in details["skipped"]}
    assert "negated copy" in skipped["-(I[w_i=1 & i=1])"]
    and_label = next(v for v in details["variables"] if v["variable"] == "I[w_i=1 & i=1]")
    assert and_label["exact_site"] == "blocks.0.hook_resid_post"
    line = details["verdicts"]["I[w_i=1 & i=1]"]
    assert line["changed_pairs"] >= 10, line  # before: 0 (the label settled at the last site)

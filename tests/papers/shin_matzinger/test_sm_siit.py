"""SIIT on Shin & Matzinger's solutions (docs/siit.md "Shin & Matzinger's solutions 2 and 3"): solution 2's derived
mapping and its counterfactuals, which stay in the task's range (each swap of ``pos_k`` gives position k the source
word's answer), and solution 3's, which leave it. No per-task SIIT defaults are registered: solution 2 met the
targets on seed 0 only of three seeds (docs/siit.md)."""

from __future__ import annotations

import torch

from exactlens.plugins import load_plugins

load_plugins()

LENGTHS = (2, 8)


def _circuit(name: str):
    from exactlens.train import get_preset
    from exactlens.train.siit import siit_loss_of

    settings = dict(epochs=1, eval_every=0, test_strings=16, train_length=LENGTHS, test_length=LENGTHS, siit=True)
    return siit_loss_of(get_preset(name).spec(settings)).circuit


def _outside_share(circuit) -> dict[str, float]:
    """Per mapped variable: the share of the positions its swap moves whose exact counterfactual lies outside the
    range of the task's answers on the same held-out words."""
    lo = min(float(p.base_answers[0].min()) for p in circuit.test_pairs)
    hi = max(float(p.base_answers[0].max()) for p in circuit.test_pairs)
    out = {}
    for i, v in enumerate(circuit.variables):
        moved = outside = 0
        for p in circuit.test_pairs:
            changed = (p.cf[i] - p.base_answers[i]).abs() > 1e-6
            moved += int(changed.sum())
            outside += int((changed & ((p.cf[i] < lo - 1e-6) | (p.cf[i] > hi + 1e-6))).sum())
        out[v.name] = outside / max(moved, 1)
    return out


def test_solution2_maps_each_shifted_position_coordinate_to_the_attention_output_and_its_swaps_stay_in_range():
    circuit = _circuit("sm-solution2")
    names = [v.name for v in circuit.variables]
    assert names == [f"pos{k}" for k in range(1, LENGTHS[1] + 1)]
    assert {s["hook"] for s in circuit.mapping.values()} == {"blocks.0.hook_attn_out"}
    assert [s["dims"] for s in circuit.mapping.values()] == [[k] for k in range(len(names))]
    assert circuit.kept == ["blocks.0.hook_mlp_out"]  # cat0 (the prediction) is read and then overwritten
    assert set(_outside_share(circuit).values()) == {0.0}
    # pos_k is the answer at position k: its swap takes the source's answer there and leaves every other position
    for i, v in enumerate(circuit.variables):
        k = int(v.name[3:])
        for p in circuit.test_pairs:
            cf, base, width = p.cf[i].double(), p.base_answers[i].double(), p.cf[i].shape[1]
            if k >= width:
                assert torch.equal(cf, base)
                continue
            source = p.run.exact_outputs[p.source].double()[..., 0]
            others = [j for j in range(1, width) if j != k]  # position 0 has no target
            assert torch.allclose(cf[:, others], base[:, others], atol=1e-9)
            assert torch.allclose(cf[:, k], source[:, k], atol=1e-9)


def test_solution3s_single_category_swaps_leave_the_tasks_range():
    """The contrast: catC holds e_{X_i} plus a row of q_true, so a swapped coordinate can switch on a second ReLU."""
    shares = _outside_share(_circuit("sm-solution3"))
    assert min(shares.values()) > 0.1

"""Idle FFN units dropped (exactlens.model.idle): the same residual stream and outputs, narrower FFNs."""

from __future__ import annotations

import torch

from exactlens import tasks
from exactlens.constructions import build
from exactlens.model.idle import idle_units, without_idle_units


def test_an_idle_unit_free_copy_computes_the_same_stream() -> None:
    """tracr-shuffle_dyck keeps at most 16 of its 146 FFN units busy in any layer: the copy has d_mlp 16, and every
    residual-stream activation, component output and output is equal to the model's, float64 and float32."""
    for dtype in ("float64", "float32"):
        model = build("tracr-shuffle_dyck", dtype=dtype)
        lean = without_idle_units(model)
        idle = idle_units(model)
        assert max(model.cfg.d_mlp - len(units) for units in idle) == lean.cfg.d_mlp == 16
        assert lean.cfg.metadata["idle_units_dropped_from_d_mlp"] == 146 and model.cfg.d_mlp == 146
        assert [16 - len(units) for units in idle_units(lean)] == [146 - len(units) for units in idle]  # busy
        task = tasks.of_model(model)
        words = task.encode(task.sample(5, 200, torch.Generator().manual_seed(0))).tokens
        names = [n for n in model.hook_dict if "resid" in n or n.endswith(("attn_out", "mlp_out"))]
        with torch.no_grad():
            out, cache = model.run_with_cache(words, names_filter=names)
            lean_out, lean_cache = lean.run_with_cache(words, names_filter=names)
        assert torch.equal(out, lean_out)
        assert all(torch.equal(cache[n], lean_cache[n]) for n in names)


def test_a_model_without_idle_units_is_returned_as_it_is() -> None:
    """FIRST (every unit busy) and a compiled program whose widest layer uses its whole FFN: nothing to drop."""
    for name in ("first", "tracr-sort_freq"):
        model = build(name, dtype="float64")
        assert without_idle_units(model) is model


def test_a_cast_model_and_a_non_finite_unit() -> None:
    """A float64 construction cast to float32 gets a float32 copy (its parameters' dtype, not its config's), with the
    same outputs; an idle unit whose input weight is not finite (its hidden value and term are NaN) is kept."""
    model = build("tracr-shuffle_dyck", dtype="float64").float()
    lean = without_idle_units(model)
    assert next(lean.parameters()).dtype == torch.float32
    task = tasks.of_model(model)
    words = task.encode(task.sample(5, 50, torch.Generator().manual_seed(1))).tokens
    with torch.no_grad():
        assert torch.equal(model(words), lean(words))
    unit = idle_units(model)[0][0]
    with torch.no_grad():
        model.blocks[0].mlp.W_in[0, unit] = float("inf")
    assert unit not in idle_units(model)[0]
    with torch.no_grad():
        assert torch.equal(model(words).isnan(), without_idle_units(model)(words).isnan())

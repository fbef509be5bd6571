"""The training fast path computes the model's CLS logits and gradients exactly."""

import pytest
import torch

from exactlens.model import ExactTransformer
from exactlens.train import fastpath
from exactlens.train.data import assemble
from exactlens.train.init import pytorch_default_init
from exactlens.train.loop import seed_generators
from exactlens.train.presets import get_preset, resolve_options

CASES = [
    ("first", {}),
    ("first", {"scaled": True}),
    ("parity", {"scaled": True}),
    ("one", {"positions": "first"}),
    ("majority", {}),
    ("majority", {"layer_norm": "scale_only"}),
    ("majority", {"layer_norm": "none"}),
]


@pytest.mark.parametrize("dtype,tol", [("float64", 1e-12), ("float32", 2e-5)])
@pytest.mark.parametrize("task,options", CASES)
def test_fast_path_matches_model_forward_and_gradients(task, options, dtype, tol):
    preset = get_preset(task)
    opts = resolve_options(preset, dict(options, dtype=dtype))
    model = pytorch_default_init(ExactTransformer(preset.config(opts)), seed_generators(5)["init"])
    assert fastpath.supports(model)
    lang = preset.language_of(opts)
    gen = torch.Generator().manual_seed(1)
    for batch in (
        assemble(lang, [lang.sample(7, 4, gen)]),
        assemble(lang, [lang.sample(n, 2, gen) for n in (1, 4, 9)]),
    ):
        n_pos = batch.n_positions if batch.padded else None
        weights = torch.randn(model.cfg.d_vocab_out, generator=gen, dtype=model.cfg.torch_dtype)
        grads = []
        outs = []
        forwards = (
            lambda b=batch, n=n_pos: model(b.tokens, n)[:, 0],
            lambda b=batch, n=n_pos: fastpath.cls_logits(model, b.tokens, n),
        )
        for fn in forwards:
            model.zero_grad()
            out = fn()
            (out @ weights).square().sum().backward()
            outs.append(out.detach())
            # (a model without positional features has an empty W_feat: no gradient to compare)
            grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None and p.numel()})
        torch.testing.assert_close(outs[1], outs[0], rtol=tol, atol=tol)
        assert grads[0].keys() == grads[1].keys()
        for name in grads[0]:
            torch.testing.assert_close(grads[1][name], grads[0][name], rtol=tol * 10, atol=tol * 10, msg=name)


def test_unsupported_configurations_are_refused():
    preset = get_preset("first")
    cfg = preset.config(resolve_options(preset, {}))
    assert not fastpath.supports(ExactTransformer(cfg.replace(attention_weighting="average_hard")))
    assert not fastpath.supports(ExactTransformer(cfg.replace(readout_position=-1)))
    assert not fastpath.supports(ExactTransformer(cfg.replace(attention_mask="causal")))

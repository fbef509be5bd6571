"""Benchmark of the forward overhead of ExactTransformer against a bare PyTorch forward.

Runs, in one process and on the same weights and tokens:

* a 2-layer, 4-head softmax model (d_model 64, d_mlp 256, ReLU, positional features
  i/n, cos(i*pi) and an 8-dim sinusoid), post-LN and pre-LN, batch 32, sequence
  lengths 16, 128 and 512;
* the Chiang & Cholak PARITY construction (``build("parity")``) at n = 1001 positions
  (|w| = 1000), batch 32.

For each case it runs ExactTransformer.forward (no hooks attached) and a bare functional
forward of the same computation (the same einsum/matmul/softmax/layer-norm formulas,
without HookPoints, module dispatch or input checks), asserts that both give the same
logits, then times them with torch.set_num_threads(2): after a warm-up, calls of ours
and bare alternate one by one over several rounds, and the table gives the median time
per call, ours/bare (goal <= 1.2x), and the ratio of the fastest calls as a cross-check
on a shared machine (the header prints the load average). The exit status is 0 unless
the outputs differ: a ratio above the goal is reported, not failed, since timings on a
loaded machine are noisy.

``--quick`` uses fewer rounds, a smaller batch for n = 1001 and drops length 512.

Usage: PYTHONPATH=src python benchmarks/bench_forward_overhead.py [--quick] [--threads 2]
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
from goals import Goals, add_arguments

from exactlens import tasks
from exactlens.constructions import build
from exactlens.model import ExactConfig, ExactTransformer
from exactlens.model.positional import sinusoidal_features

GOAL = 1.2
FEATURES = ("i/n", "cos(i*pi)") + sinusoidal_features(8)

# ----------------------------------------------------------------------------- the bare forward


def _bare_feature(name: str, i: torch.Tensor, n: float) -> torch.Tensor:
    """One positional feature over positions i [pos] of an unpadded sequence of n positions."""
    if name == "i/n":
        return i / n
    if name == "1/n":
        return torch.full_like(i, 1 / n)
    if name == "cos(i*pi)":
        return 1 - 2 * torch.remainder(i, 2)
    if name.startswith(("sin[", "cos[")):  # sin[j/D]: sin(i / 10000^(2j/D))
        j, d = (int(v) for v in name[4:-1].split("/"))
        trig = torch.sin if name.startswith("sin") else torch.cos
        return trig(i * (1.0 / 10000.0 ** (2 * j / d)))
    raise ValueError(f"the bare forward does not implement positional feature {name!r}")


def _bare_layer_norm(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, eps: float) -> torch.Tensor:
    x = x - x.mean(-1, keepdim=True)
    return x / (x.pow(2).mean(-1, keepdim=True) + eps).sqrt() * w + b


@dataclass
class BareModel:
    """Plain tensors copied out of an ExactTransformer, and the switches the forward needs."""

    features: tuple[str, ...]
    norm: str
    eps: float
    divisor: float
    params: dict[str, torch.Tensor]
    n_layers: int


def bare_from(model: ExactTransformer) -> BareModel:
    cfg = model.cfg
    unsupported = {
        "attention_mask": (cfg.attention_mask, "none"),
        "attention_weighting": (cfg.attention_weighting, "softmax"),
        "attn_length_scale": (cfg.attn_length_scale, "none"),
        "act_fn": (cfg.act_fn, "relu"),
        "ln_center": (cfg.ln_center, True),
    }
    for key, (value, wanted) in unsupported.items():
        if value != wanted:
            raise ValueError(f"the bare forward needs {key}={wanted!r}, the model has {value!r}")
    if cfg.learned_positions or cfg.d_mlp == 0:
        raise ValueError("the bare forward needs functional positional features and an FFN")
    params = {k: v.detach().clone() for k, v in model.state_dict().items()}
    return BareModel(cfg.positional_features, cfg.normalization, cfg.ln_eps, cfg.scale_divisor, params,
                     cfg.n_layers)


def bare_forward(m: BareModel, tokens: torch.Tensor) -> torch.Tensor:
    """Logits [batch, pos, d_vocab_out] of unpadded tokens [batch, pos]."""
    p = m.params
    n_pos = tokens.shape[1]
    i = torch.arange(n_pos, dtype=p["embed.W_E"].dtype)
    feats = torch.stack([_bare_feature(name, i, float(n_pos)) for name in m.features], dim=-1)  # [pos, F]
    x = p["embed.W_E"][tokens] + feats @ p["pos_embed.W_feat"]
    for layer in range(m.n_layers):
        pre = f"blocks.{layer}."

        def ln(t: torch.Tensor, which: str, pre: str = pre) -> torch.Tensor:
            return _bare_layer_norm(t, p[f"{pre}{which}.w"], p[f"{pre}{which}.b"], m.eps)

        a = ln(x, "ln1") if m.norm == "pre" else x
        q = torch.einsum("bpm,hmd->bhpd", a, p[pre + "attn.W_Q"]) + p[pre + "attn.b_Q"][:, None, :]
        k = torch.einsum("bpm,hmd->bhpd", a, p[pre + "attn.W_K"]) + p[pre + "attn.b_K"][:, None, :]
        v = torch.einsum("bpm,hmd->bhpd", a, p[pre + "attn.W_V"]) + p[pre + "attn.b_V"][:, None, :]
        pattern = torch.softmax((q / m.divisor) @ k.transpose(-1, -2), dim=-1)  # [b, h, q, k]
        z = pattern @ v  # [b, h, q, d]
        x = x + torch.einsum("bhqd,hdm->bqm", z, p[pre + "attn.W_O"]) + p[pre + "attn.b_O"]
        if m.norm == "post":
            x = ln(x, "ln1")
        a = ln(x, "ln2") if m.norm == "pre" else x
        hidden = torch.relu(a @ p[pre + "mlp.W_in"] + p[pre + "mlp.b_in"])
        x = x + hidden @ p[pre + "mlp.W_out"] + p[pre + "mlp.b_out"]
        if m.norm == "post":
            x = ln(x, "ln2")
    if m.norm == "pre":
        x = _bare_layer_norm(x, p["ln_final.w"], p["ln_final.b"], m.eps)
    return x @ p["unembed.W_U"] + p["unembed.b_U"]


# ----------------------------------------------------------------------------- cases


@dataclass
class Case:
    name: str
    model: ExactTransformer
    tokens: torch.Tensor


def random_model(norm: str, seed: int = 0) -> ExactTransformer:
    cfg = ExactConfig(
        d_model=64, n_layers=2, n_heads=4, d_mlp=256, d_vocab=16, d_vocab_out=16,
        normalization=norm, ln_eps=1e-5, positional_features=FEATURES, attention_weighting="softmax",
        act_fn="relu", readout="logits",
    )
    model = ExactTransformer(cfg).init_weights(seed=seed)
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():  # biases and LN gains away from 0 and 1, so that a misplaced bias or gain shows
        for name, param in model.named_parameters():
            if name.endswith(".w") or name.split(".")[-1].startswith("b"):
                param.add_(0.1 * torch.randn(param.shape, generator=gen))
    return model.eval()


def cases(quick: bool) -> list[Case]:
    gen = torch.Generator().manual_seed(0)
    out = []
    lengths = (16, 128) if quick else (16, 128, 512)
    for norm in ("post", "pre"):
        model = random_model(norm)
        for length in lengths:
            tokens = torch.randint(0, model.cfg.d_vocab, (32, length), generator=gen)
            out.append(Case(f"{norm}-LN seq {length}", model, tokens))
    parity = build("parity")
    batch = 8 if quick else 32
    task = tasks.of_model(parity)
    ids = task.sample(1000, batch, gen)
    out.append(Case(f"parity n=1001 (b={batch})", parity, task.encode(ids).tokens))
    return out


# ----------------------------------------------------------------------------- timing


def check_same(case: Case, bare: BareModel) -> float:
    with torch.no_grad():
        ours = case.model(case.tokens)
        theirs = bare_forward(bare, case.tokens)
    scale = float(ours.abs().max())
    torch.testing.assert_close(theirs, ours, rtol=1e-4, atol=1e-5 * max(scale, 1e-30))
    if case.model.cfg.readout == "sigmoid":  # the decisions at CLS must agree too
        assert torch.equal(ours[:, 0, 0] > 0, theirs[:, 0, 0] > 0), f"{case.name}: decisions differ"
    return float((ours - theirs).abs().max())


def calls_per_round(fn: Callable[[], object], target_s: float) -> int:
    start = time.perf_counter()
    fn()
    once = max(time.perf_counter() - start, 1e-6)
    return max(1, min(500, int(target_s / once)))


def bench(case: Case, rounds: int, target_s: float) -> tuple[list[float], list[float]]:
    """Seconds per call of ours and bare, every timed call.

    Calls alternate one by one (ours, bare, bare, ours, ...) so that both see the
    same machine load; each round times `calls` calls of each, one at a time. The
    table reports the median over every timed call (robust to preemption spikes) and,
    as a cross-check on a shared machine, the ratio of the fastest calls.
    """
    bare = bare_from(case.model)
    ours_fn = lambda: case.model(case.tokens)
    bare_fn = lambda: bare_forward(bare, case.tokens)
    t_ours: list[float] = []
    t_bare: list[float] = []
    with torch.no_grad():
        for _ in range(3):  # warm-up (allocator, kernels)
            ours_fn()
            bare_fn()
        calls = calls_per_round(bare_fn, target_s)
        for r in range(rounds):
            for c in range(calls):
                pair = [(ours_fn, t_ours), (bare_fn, t_bare)]
                for fn, sink in pair if (r + c) % 2 == 0 else pair[::-1]:
                    start = time.perf_counter()
                    fn()
                    sink.append(time.perf_counter() - start)
    return t_ours, t_bare


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds and smaller sizes for a smoke run")
    parser.add_argument("--threads", type=int, default=2, help="torch.set_num_threads (default 2)")
    add_arguments(parser)
    args = parser.parse_args(argv)
    goals = Goals("bench_forward_overhead.py", args.quick)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    rounds, target_s = (5, 0.05) if args.quick else (11, 0.2)

    header = (f"{'case':<24}{'ours ms':>10}{'bare ms':>10}{'ratio':>8}{'min ratio':>11}{'max |diff|':>12}"
              f"  goal <= {GOAL}x")
    load = ", ".join(f"{v:.1f}" for v in os.getloadavg())
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {os.cpu_count()} CPUs, "
          f"load average {load}")
    print(f"ours/bare: median per call over {rounds} rounds of calls alternating one by one; "
          "min ratio: fastest call of each")
    print(header)
    print("-" * len(header))
    worst = 0.0
    for case in cases(args.quick):
        diff = check_same(case, bare_from(case.model))
        all_ours, all_bare = bench(case, rounds, target_s)
        t_ours, t_bare = statistics.median(all_ours), statistics.median(all_bare)
        ratio = t_ours / t_bare
        min_ratio = min(all_ours) / min(all_bare)
        worst = max(worst, ratio)
        verdict = "ok" if ratio <= GOAL else "SLOWER"
        print(f"{case.name:<24}{t_ours * 1e3:>10.3f}{t_bare * 1e3:>10.3f}{ratio:>7.2f}x{min_ratio:>10.2f}x"
              f"{diff:>12.2e}  {verdict}")
        goals.add(f"forward, ours / bare PyTorch, {case.name}", ratio, "x", f"<= {GOAL}")
    print()
    print(f"worst ratio {worst:.2f}x (goal <= {GOAL}x)" + ("" if math.isfinite(worst) else " (not finite)"))
    goals.write(args.results, args.overwrite)
    return 0


if __name__ == "__main__":
    sys.exit(main())

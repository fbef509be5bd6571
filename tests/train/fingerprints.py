"""Fingerprints of float64 training runs, to pin the loop's exact behaviour across speed work.

A fingerprint is the SHA-256 of a run's trained weights (every parameter's float64 bytes, in
``named_parameters`` order) and of its history (every record, ``wall_s`` left out). ``RUNS`` are
small runs that cover the loop's paths: one run (SingleRun), stacked runs of padded words of
variable length with several steps per epoch, log-n scaling, checkpoints, and LBFGS (Shin & Matzinger's
regression task). ``canary`` fingerprints the kernels those runs call (products, batched products,
torch's fused attention and layer norm, Adam) on fixed inputs: where it differs from the recorded
one, this machine's BLAS rounds differently from the machine that recorded the runs, and the runs
cannot be compared bit for bit there.

``python tests/train/fingerprints.py OUT.json`` (with the exactlens to pin on PYTHONPATH) records
them; tests/train/data/main_float64_runs.json was recorded with main's code before the training
speed work (see its ``recorded`` field); tests/train/test_bit_identical.py compares.
"""

from __future__ import annotations

import hashlib
import json
import sys
from typing import Any

import torch

RUNS: dict[str, dict[str, Any]] = {
    "first single": dict(task="first", seeds=[3], epochs=12, train_length=10, eval_every=4, test_strings=20,
                         test_length=12),
    "first scaled single": dict(task="first", seeds=[1], epochs=6, train_length=7, eval_every=3, test_strings=10,
                                test_length=9, scaled=True),
    "parity stacked variable": dict(task="parity", seeds=[0, 1, 2], epochs=5, train_length=[3, 8], batch_size=25,
                                    eval_every=2, test_strings=10, test_length=[2, 9]),
    "one stacked checkpoints": dict(task="one", seeds=[4, 5], epochs=6, train_length=6, eval_every=3, test_strings=8,
                                    test_length=6, checkpoint_every=2),
    "pairs lbfgs": dict(task="pairs", seeds=[2], epochs=3),
}


def digest(values: list[Any]) -> str:
    h = hashlib.sha256()
    for value in values:
        if isinstance(value, torch.Tensor):
            h.update(value.detach().to(torch.float64).contiguous().numpy().tobytes())
        else:
            h.update(json.dumps(value, sort_keys=True).encode())
    return h.hexdigest()


def run_fingerprint(name: str) -> dict[str, str]:
    from exactlens.train import train_many

    spec = dict(RUNS[name])
    task, seeds = spec.pop("task"), spec.pop("seeds")
    spec = {k: tuple(v) if isinstance(v, list) else v for k, v in spec.items()}
    runs = train_many(task, seeds, dtype="float64", **spec)
    weights = [p for run in runs for _, p in run.model.named_parameters()]
    history = [{k: v for k, v in r.items() if k != "wall_s"} for run in runs for r in run.history]
    kept = [[c.step for c in run.checkpoints] for run in runs]
    return {"weights": digest(weights), "history": digest(history + kept)}


def canary() -> str:
    """The kernels the runs call, on fixed float64 inputs."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(100, 11, 16, generator=g, dtype=torch.float64)
    w = torch.randn(16, 64, generator=g, dtype=torch.float64)
    heads = torch.randn(2, 16, 8, generator=g, dtype=torch.float64)
    q, k, v = (torch.randn(100, 2, 11, 8, generator=g, dtype=torch.float64) for _ in range(3))
    param = torch.randn(16, 64, generator=g, dtype=torch.float64, requires_grad=True)
    adam = torch.optim.Adam([param], lr=1e-3, fused=True)
    param.grad = torch.randn(16, 64, generator=g, dtype=torch.float64)
    adam.step()
    outs = [x.reshape(-1, 16) @ w, torch.einsum("bpm,hmd->bphd", x, heads),
            torch.nn.functional.scaled_dot_product_attention(q, k, v, scale=1.0),
            torch.nn.functional.layer_norm(x, (16,), eps=1e-5), param]
    return digest(outs)


def record() -> dict[str, Any]:
    torch.set_num_threads(1)
    return {"torch": torch.__version__, "canary": canary(), "runs": {name: run_fingerprint(name) for name in RUNS}}


if __name__ == "__main__":
    result = record()
    result["recorded"] = sys.argv[2] if len(sys.argv) > 2 else None
    with open(sys.argv[1], "w") as f:
        json.dump(result, f, indent=1)
        f.write("\n")
    print(json.dumps(result, indent=1))

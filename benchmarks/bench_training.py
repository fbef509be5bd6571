"""Training speed: the papers' batch-size-1 loop against exactlens.train, side by side.

Both train FIRST with the Chiang & Cholak §5.1 settings (2 layers, 1 head, d_model 16,
d_FFNN 64, post-LN eps 1e-5, Adam lr 3e-4, position feature I[i=1]) on the same number
of fresh training strings: ``--epochs`` epochs of 100 strings of length |w| = L.

* baseline: the loop of the papers' code as they describe it, written here in plain
  PyTorch: torch.nn.TransformerEncoder (post-norm layers, no dropout), one string per
  step (Python-list sampling, forward, loss, backward, Adam step, loss.item()), i.e.
  100 Adam steps per epoch;
* exactlens, batch 1: ``train("first", batch_size=1)``, the same 100 steps per epoch;
* exactlens: ``train("first")``, one Adam step on the epoch's 100 strings (one padded
  batch, the fast CLS-only forward);
* exactlens, R runs: ``train_many("first", seeds=range(R))``, R independent runs (own
  data, initialization and Adam state) trained as one stacked computation; its time per
  epoch is divided by R (time per run), as for an experiment of R runs such as Fig. 4.

The table gives seconds per epoch and per run (median over alternating rounds, one torch
thread) and the ratios baseline / exactlens for the same number of strings (goal >= 50x).
Evaluation is excluded (eval_every=0 with a one-string test). The load average is
printed: on a shared machine ratios are noisy.

Usage: PYTHONPATH=src python benchmarks/bench_training.py [--lengths 10,30,100,300] [--epochs 20] [--rounds 3]
       [--runs 10]
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import time

import torch


class PaperLoopModel(torch.nn.Module):
    """FIRST model as in the papers' description, PyTorch's own encoder layers."""

    def __init__(self, size: int = 16):
        super().__init__()
        self.word_embedding = torch.nn.Embedding(3, size)
        self.pos_adapter = torch.nn.Linear(1, size, bias=False)
        layer = torch.nn.TransformerEncoderLayer(size, 1, dim_feedforward=4 * size, dropout=0.0, norm_first=False)
        self.encoder = torch.nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False)
        self.output_layer = torch.nn.Linear(size, 1)

    def forward(self, w: torch.Tensor) -> torch.Tensor:
        is_first = (torch.arange(len(w)) == 1).float().unsqueeze(1)  # I[i = 1]
        x = self.word_embedding(w) + self.pos_adapter(is_first)
        y = self.encoder(x.unsqueeze(1)).squeeze(1)
        return self.output_layer(y[0])[0]


def baseline_epochs(model, optim, length: int, epochs: int, rng: random.Random) -> None:
    for _ in range(epochs):
        for _ in range(100):
            w = torch.tensor([2] + [rng.randrange(2) for _ in range(length)])
            target = torch.tensor(float(w[1] == 1))
            loss = torch.nn.functional.binary_cross_entropy_with_logits(model(w), target)
            optim.zero_grad()
            loss.backward()
            optim.step()
            loss.item()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lengths", default="10,30,100,300")
    parser.add_argument("--runs", type=int, default=10, help="R, runs trained together by train_many")
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    from exactlens.train import train, train_many

    runs = args.runs
    print(f"training speed, FIRST, 100 strings per epoch, 1 thread, load average {os.getloadavg()}")
    print(
        f"| |w| | baseline s/epoch | exactlens batch 1 s/epoch | exactlens s/epoch | exactlens, {runs} runs: "
        "s/epoch per run | baseline/exactlens | baseline/exactlens R runs | baseline/exactlens batch 1 |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for length in (int(v) for v in args.lengths.split(",")):
        times: dict[str, list[float]] = {"baseline": [], "batch1": [], "exactlens": [], "many": []}
        model = PaperLoopModel()
        optim = torch.optim.Adam(model.parameters(), lr=3e-4)
        rng = random.Random(0)
        common = dict(epochs=args.epochs, train_length=length, eval_every=0, test_strings=1, test_length=1)
        baseline_epochs(model, optim, length, 1, rng)  # warm-up
        train("first", **dict(common, epochs=1))
        for r in range(args.rounds):
            start = time.perf_counter()
            baseline_epochs(model, optim, length, args.epochs, rng)
            times["baseline"].append((time.perf_counter() - start) / args.epochs)
            start = time.perf_counter()
            train("first", seed=r, **common)
            times["exactlens"].append((time.perf_counter() - start) / args.epochs)
            start = time.perf_counter()
            train("first", seed=r, batch_size=1, **common)
            times["batch1"].append((time.perf_counter() - start) / args.epochs)
            start = time.perf_counter()
            train_many("first", range(r * runs, (r + 1) * runs), **common)
            times["many"].append((time.perf_counter() - start) / args.epochs / runs)
        med = {k: statistics.median(v) for k, v in times.items()}
        print(
            f"| {length} | {med['baseline']:.3f} | {med['batch1']:.3f} | {med['exactlens']:.4f} | "
            f"{med['many']:.4f} | {med['baseline'] / med['exactlens']:.0f}x | {med['baseline'] / med['many']:.0f}x | "
            f"{med['baseline'] / med['batch1']:.1f}x |",
            flush=True,
        )
    print(f"load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()

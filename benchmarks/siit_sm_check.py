"""Why a SIIT run of a Shin & Matzinger solution meets or misses its targets: docs/siit.md's numbers.

Two measurements, printed:

1. ``--construction NAME``: the exact side of ``train NAME --siit`` at ``--lengths`` (the SIIT run's own pairs,
   held-out part): per mapped variable, the range of the exact counterfactual answers and the share of the
   positions a swap moves whose counterfactual lies outside the range of the task's answers on those words
   (a swap that leaves the task's range asks the trained model for an output no word of the task gives);
2. ``--run DIR`` (a SIIT checkpoint): on ``--words`` random words of the longest length, how much of each exact
   variable its mapped coordinate of the trained attention output holds (R^2 of a linear fit; a ``posK``
   variable at position K, where the construction's FFN reads it, a ``catC`` variable at every position),
   and per length the share of words whose every target position is within the run's regression tolerance of
   the exact answer with no swap (which bounds the interchange accuracy, counted per word).

Usage: PYTHONPATH=src python benchmarks/siit_sm_check.py --construction sm-solution2 [--lengths 2:8]
       PYTHONPATH=src python benchmarks/siit_sm_check.py --run runs/sm2/sm-solution2/siit [--words 400]
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch


def counterfactual_ranges(name: str, lengths: tuple[int, int]) -> dict[str, dict[str, float]]:
    """Per mapped variable: the counterfactuals' range, the moved positions and the share outside the answers'."""
    from exactlens.train import get_preset
    from exactlens.train.siit import siit_loss_of

    settings = dict(epochs=1, eval_every=0, test_strings=16, train_length=lengths, test_length=lengths, siit=True)
    circuit = siit_loss_of(get_preset(name).spec(settings)).circuit
    lo = min(float(p.base_answers[0].min()) for p in circuit.test_pairs)
    hi = max(float(p.base_answers[0].max()) for p in circuit.test_pairs)
    out = {"answers": {"min": lo, "max": hi}}
    for i, v in enumerate(circuit.variables):
        cf = torch.cat([p.cf[i].flatten() for p in circuit.test_pairs])
        moved = torch.cat([((p.cf[i] - p.base_answers[i]).abs() > 1e-6).flatten() for p in circuit.test_pairs])
        outside = moved & ((cf < lo - 1e-6) | (cf > hi + 1e-6))
        out[v.name] = {"min": round(float(cf.min()), 2), "max": round(float(cf.max()), 2), "moved": int(moved.sum()),
                       "outside_share": round(float(outside.sum()) / max(int(moved.sum()), 1), 3)}
    return out


def _r2(x: torch.Tensor, y: torch.Tensor) -> float:
    design = torch.stack([x, torch.ones_like(x)], 1)
    fit = design @ torch.linalg.lstsq(design, y[:, None]).solution
    return round(float(1 - (y - fit[:, 0]).var() / y.var()), 3)


@torch.no_grad()
def mapped_coordinates(run: Path, words: int, seed: int = 7) -> dict[str, dict]:
    """R^2 of each exact variable from its mapped coordinate; per length, the words within tolerance everywhere."""
    from exactlens.constructions import registry
    from exactlens.model import ExactTransformer

    record = json.loads((run / "run.json").read_text())
    info, lengths = record["siit"], record["options"]["train_length"]
    tol = info["measured"]["regression_tolerance"]
    trained = ExactTransformer.load(run).double().eval()
    exact = registry.get(info["construction"]).make(dtype="float64", **info["construction_params"]).eval()
    labels = list(exact.cfg.residual_labels)
    rng = torch.Generator().manual_seed(seed)
    longest = torch.randint(0, exact.cfg.d_vocab, (words, lengths[1]), generator=rng)
    _, got = trained.run_with_cache(longest)
    _, want = exact.run_with_cache(longest)
    att, mid = got["blocks.0.hook_attn_out"], want["blocks.0.hook_resid_mid"]
    fits = {}
    for name, site in info["mapping"].items():
        d, label = site["dims"][0], labels.index(name)
        if name.startswith("pos"):
            k = int(name[3:])
            if k < lengths[1]:
                fits[name] = _r2(att[:, k, d], mid[:, k, label])
        else:
            fits[name] = _r2(att[:, :, d].flatten(), mid[:, :, label].flatten())
    precise = {}
    for n in range(lengths[0], lengths[1] + 1):
        w = torch.randint(0, exact.cfg.d_vocab, (words, n), generator=rng)
        close = (trained(w)[..., 0] - exact(w)[..., 0]).abs()[:, 1:] <= tol  # position 0 has no target
        precise[n] = round(float(close.all(1).double().mean()), 3)
    return {"r2_of_mapped_coordinate": fits, "words_within_tolerance": precise, "tolerance": tol}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--construction", help="sm-solution1..3: the counterfactual ranges of its SIIT pairs")
    parser.add_argument("--lengths", default="2:8", help="training lengths LO:HI of the pairs (default 2:8)")
    parser.add_argument("--run", type=Path, help="a SIIT checkpoint directory: its mapped coordinates")
    parser.add_argument("--words", type=int, default=400, help="random words per length for --run")
    args = parser.parse_args()
    if not args.construction and not args.run:
        parser.error("give --construction NAME and/or --run DIR")
    torch.set_num_threads(1)
    from exactlens.plugins import load_plugins

    load_plugins()
    start, cpu, load = time.perf_counter(), time.process_time(), os.getloadavg()[0]
    if args.construction:
        lo, _, hi = args.lengths.partition(":")
        print(json.dumps(counterfactual_ranges(args.construction, (int(lo), int(hi))), indent=1))
    if args.run:
        print(json.dumps(mapped_coordinates(args.run, args.words), indent=1))
    print(f"wall {time.perf_counter() - start:.1f} s, CPU {time.process_time() - cpu:.1f} s, "
          f"load {load:.1f}-{os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()

"""`exactlens pairlogic`: train (or load) Shin & Matzinger models and decide where the pair logic lives.

Importing this module imports no torch (``exactlens --help`` registers the verb from it); the work's
modules are imported when the verb runs.
"""

from __future__ import annotations

import argparse
import contextlib
from pathlib import Path
from typing import Any

from exactlens.api import Result, View, register_api, register_view
from exactlens.cli.common import add_device_argument, emit
from exactlens.cli.registry import Verb, register_verb
from exactlens.errors import ExactLensError
from exactlens.progress import say


def _check(args: argparse.Namespace) -> dict[str, Any]:
    from exactlens.constructions import get
    from exactlens.devices import device_name
    from exactlens.papers.shin_matzinger.pairlogic import check_construction
    from exactlens.papers.shin_matzinger.task import make_q

    construction = get(args.check)
    if construction.task != "pairs":
        raise ExactLensError(f"--check takes a Shin & Matzinger construction (sm-solution1..3), not {args.check!r}")
    model = construction.make(
        dtype=args.dtype, device=args.device, categories=args.categories, positions=args.positions, q=args.q,
        q_seed=args.q_seed,
    )
    q = make_q(args.q, args.categories, args.q_seed)
    result = check_construction(model, q, strings=args.batch, seed=args.seed)
    return {
        "name": args.check,
        "dtype": args.dtype,
        "device": device_name(model.device),
        "categories": args.categories,
        "positions": args.positions,
        "q": args.q,
        "q_seed": args.q_seed,
        **result,
    }


def _train_seeds(args: argparse.Namespace, root: Path | None) -> list[dict[str, Any]]:
    from exactlens.papers.shin_matzinger.pairlogic import analyse
    from exactlens.papers.shin_matzinger.training import PairTrainConfig, train_pairs

    runs = []
    for seed in range(args.seed, args.seed + args.seeds):
        cfg = PairTrainConfig(
            categories=args.categories,
            positions=args.positions,
            batch=args.batch,
            iterations=args.iterations,
            system=args.system,
            flavour=args.flavour,
            q=args.q,
            q_seed=args.q_seed,
            seed=seed,
            dtype=args.dtype,
        )
        say(
            f"pairlogic: training {args.system}/{args.flavour}, seed {seed} "
            f"(N={args.categories}, M={args.positions}, {args.iterations} LBFGS iterations)"
        )
        run = train_pairs(cfg, log=say, out=None if root is None else root / f"seed{seed}", device=args.device)
        record = {
            "seed": seed,
            "train_mse": run.train_mse,
            "test_mse": run.test_mse,
            "seconds": run.seconds,
            **analyse(run.model, run.q_true, batch=args.batch, seed=seed + 999),
        }
        if root is not None:
            record["checkpoint"] = f"{args.save}/seed{seed}"
        runs.append(record)
    return runs


def _verdicts(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    from exactlens.devices import device_name, resolve_device
    from exactlens.model import ExactTransformer
    from exactlens.outputs import staged
    from exactlens.papers.shin_matzinger.causal import CAUSAL_RULE
    from exactlens.papers.shin_matzinger.pairlogic import VERDICT_RULE, analyse, consensus
    from exactlens.papers.shin_matzinger.task import make_q

    device = resolve_device(args.device, args.dtype)  # a device that is not there fails before any work
    runs = []
    if args.checkpoint:
        model = ExactTransformer.load(args.checkpoint).to(device)
        meta = model.cfg.metadata
        if "q_true" in meta:
            q = torch.tensor(meta["q_true"], dtype=torch.float64)
        else:
            train = meta.get("train", {})
            q = make_q(train.get("q", args.q), model.cfg.d_vocab, train.get("q_seed", args.q_seed))
        runs.append({"checkpoint": args.checkpoint, **analyse(model, q, batch=args.batch, seed=args.seed)})
    else:
        if args.seeds < 1:
            raise ExactLensError(f"--seeds must be >= 1, got {args.seeds}")
        with contextlib.ExitStack() as stack:  # --save DIR appears, complete, only after the last seed
            root = None if not args.save else stack.enter_context(
                staged(args.save, overwrite=args.overwrite, what="--save directory"))
            runs = _train_seeds(args, root)
    return {
        "device": device_name(device),
        "categories": args.categories,
        "positions": args.positions,
        "q": args.q,
        "q_seed": args.q_seed,
        "system": args.system,
        "flavour": args.flavour,
        "runs": runs,
        "consensus": consensus([r["verdict"] for r in runs]),
        "verdict_rule": VERDICT_RULE,
        "causal_consensus": consensus([r["causal_verdict"] for r in runs]),
        "causal_rule": CAUSAL_RULE,
    }


def _rate(value: float | None) -> str:
    return "  -  " if value is None else f"{value:.3f}"


def _text(result: dict[str, Any]) -> str:
    if "exact" in result:
        return (
            f"{result['name']} ({result['dtype']}, N={result['categories']}, M={result['positions']}): "
            f"{'exact' if result['exact'] else 'NOT exact'}, max |error| {result['max_abs_error']:.3e} "
            f"(tolerance {result['tolerance']:.3e})"
        )
    lines = ["run      mse     no-attn  lin-FFN  var     qk~q  ov~q  qk~shift ov~shift  verdict    "
             "IIA(P@attn) IIA(V@attn)  causal"]
    for r in result["runs"]:
        a, s = r["ablations"], r["signatures"]
        name = str(r.get("seed", "ckpt"))
        lines.append(
            f"{name:8s} {a['mse']:.4f}  {a['mse_without_attention']:.4f}  {a['mse_linear_ffn']:.4f}  "
            f"{a['target_variance']:.4f}  {s['qk_category_q']:.2f}  {s['ov_category_q']:.2f}  "
            f"{s['qk_position_shift']:.2f}     {s['ov_position_shift']:.2f}      {r['verdict']:10s} "
            f"{_rate(r['interchanges']['iia_previous'])}        {_rate(r['interchanges']['iia_value'])}        "
            f"{r['causal_verdict']}"
        )
    lines.append(f"consensus: {result['consensus']} (weights and ablations); causal: {result['causal_consensus']}")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> None:
    import torch

    torch.set_num_threads(1)
    result = _check(args) if args.check else _verdicts(args)
    emit(result, args.json, _text(result))


def arguments(p: argparse.ArgumentParser) -> None:
    from exactlens.papers.shin_matzinger.training import FLAVOURS, SYSTEMS

    p.add_argument("--categories", type=int, default=10, help="N, number of categories (default 10)")
    p.add_argument("--positions", type=int, default=50, help="M, sequence length (default 50)")
    p.add_argument("--seed", type=int, default=0, help="first training seed (default 0)")
    p.add_argument("--seeds", type=int, default=1, help="number of seeds; the verdicts get a consensus")
    p.add_argument("--iterations", type=int, default=50, help="LBFGS iterations (paper: 50)")
    p.add_argument("--batch", type=int, default=1000, help="sequences per batch (paper: 1000)")
    p.add_argument("--system", choices=SYSTEMS, default="combined")
    p.add_argument("--flavour", choices=FLAVOURS, default="unconstrained")
    p.add_argument("--q", choices=["normal", "code"], default="normal", help="q_true: standard normal or eq. 2.15")
    p.add_argument("--q-seed", type=int, default=0)
    p.add_argument("--dtype", choices=["float32", "float64"], default="float32")
    p.add_argument("--checkpoint", help="analyse a saved model instead of training one")
    p.add_argument("--save", help="save each trained model under SAVE/seed<S> (SAVE appears when all are done)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing --save directory")
    p.add_argument("--check", metavar="NAME", help="check a construction (sm-solution1..3) against q_true")
    add_device_argument(p, "training and the checks run there; the verdicts' figures come back to the CPU")
    p.add_argument("--json", action="store_true")


def pairlogic(**options: Any) -> Result:
    """``exactlens pairlogic`` as a function (``el.pairlogic``): the CLI's options as keywords
    (``seeds=3``, ``system="solution2"``, ``check="sm-solution1"``, ``save=DIR``, ...)."""
    parser = argparse.ArgumentParser(prog="pairlogic")
    arguments(parser)
    args = parser.parse_args([])
    unknown = sorted(set(options) - set(vars(args)) - {"json"})
    if unknown:
        raise ExactLensError(f"pairlogic takes {sorted(k for k in vars(args) if k != 'json')}, not {unknown}")
    for key, value in options.items():
        setattr(args, key, value)
    return Result("pairlogic", _check(args) if args.check else _verdicts(args))


def _headline(result: dict[str, Any]) -> list[tuple[str, Any]]:
    if "exact" in result:
        return [("construction", result["name"]), ("exact", result["exact"]), ("max |error|", result["max_abs_error"])]
    return [("runs", len(result["runs"])), ("verdict (weights)", result["consensus"]),
            ("verdict (causal)", result["causal_consensus"])]


def register_cli() -> None:
    register_api("pairlogic", pairlogic)
    register_view("pairlogic", View(_headline, _text))
    register_verb(Verb("pairlogic", "Shin & Matzinger: is the pair logic in attention or in the FFN?", arguments, run,
                       order=70))

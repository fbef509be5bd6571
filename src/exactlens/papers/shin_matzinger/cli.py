"""`exactlens pairlogic`: train (or load) Shin & Matzinger models and decide where the pair logic lives.

Importing this module imports no torch (``exactlens --help`` registers the verb from it); the work's
modules are imported when the verb runs.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from exactlens.errors import ExactLensError
from exactlens.papers.shin_matzinger.options import PairOptions
from exactlens.requests import Bool, Int, Path_, Text, device_option, option
from exactlens.results import Result, View
from exactlens.verbs import VerbSpec, register_verb, tell


@dataclass(frozen=True)
class PairlogicRequest(PairOptions):  # the options shared with training: exactlens.papers.shin_matzinger.options
    seeds: int = option(1, kind=Int(1), help="number of seeds; the verdicts get a consensus")
    checkpoint: str | None = option(None, kind=Path_(), help="analyse a saved model instead of training one")
    save: str | None = option(None, kind=Path_(), help="save each trained model under SAVE/seed<S> (SAVE appears "
                              "when all are done)")
    overwrite: bool = option(False, kind=Bool(), help="replace an existing --save directory")
    check: str | None = option(None, kind=Text(), metavar="NAME",
                               help="check a construction (sm-solution1..3) against q_true")
    device: Any = device_option("training and the checks run there; the verdicts' figures come back to the CPU")


def _check(args: PairlogicRequest) -> dict[str, Any]:
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


def _train_seeds(args: PairlogicRequest, root: Path | None) -> list[dict[str, Any]]:
    from exactlens.papers.shin_matzinger.pairlogic import analyse
    from exactlens.papers.shin_matzinger.training import PairTrainConfig, train_pairs

    runs = []
    for seed in range(args.seed, args.seed + args.seeds):
        cfg = PairTrainConfig(**{**args.shared(), "seed": seed})
        tell(
            f"pairlogic: training {args.system}/{args.flavour}, seed {seed} "
            f"(N={args.categories}, M={args.positions}, {args.iterations} LBFGS iterations)"
        )
        run = train_pairs(cfg, log=tell, out=None if root is None else root / f"seed{seed}", device=args.device)
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


def _verdicts(args: PairlogicRequest) -> dict[str, Any]:
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


def run(request: PairlogicRequest) -> Result:
    from exactlens.resources import torch_threads

    with torch_threads(1):
        return Result("pairlogic", _check(request) if request.check else _verdicts(request))


def _headline(result: dict[str, Any]) -> list[tuple[str, Any]]:
    if "exact" in result:
        return [("construction", result["name"]), ("exact", result["exact"]), ("max |error|", result["max_abs_error"])]
    return [("runs", len(result["runs"])), ("verdict (weights)", result["consensus"]),
            ("verdict (causal)", result["causal_consensus"])]


def register_cli() -> None:
    register_verb(VerbSpec("pairlogic", "Shin & Matzinger: is the pair logic in attention or in the FFN?",
                           PairlogicRequest, run, views={"pairlogic": View(_headline, _text)}, order=70))

"""Report section for Shin & Matzinger 2025: Fig. 1-style heat maps and the pair-logic verdicts."""

from __future__ import annotations

import time
from typing import Any

import torch

from exactlens.outputs import save_figure
from exactlens.papers.shin_matzinger import constructions as sm
from exactlens.papers.shin_matzinger.pairlogic import VERDICT_RULE, analyse, category_qk, check_construction, consensus
from exactlens.papers.shin_matzinger.task import make_q
from exactlens.papers.shin_matzinger.training import PairTrainConfig, train_pairs
from exactlens.viz.backend import pyplot
from exactlens.viz.page import ReportContext, Section, esc, figure, fmt, progress, table
from exactlens.viz.parallel import per_part
from exactlens.viz.trained_diff import TrainedDiff, trained_diff_section

# The paper's §4 settings (N = 10, M = 50, batch 1000, 50 LBFGS iterations); 3 seeds x 2 systems ~ 100 s.
FULL = {"categories": 10, "positions": 50, "batch": 1000, "iterations": 50, "seeds": 3, "test_batch": 1000}
PAPER = {"categories": 10, "positions": 50, "batch": 1000, "iterations": 50}
QUICK = {"categories": 3, "positions": 6, "batch": 80, "iterations": 4, "seeds": 1, "test_batch": 80}


def _heatmaps(path, panels: list[tuple[str, torch.Tensor]]):
    plt = pyplot()

    fig, axes = plt.subplots(1, len(panels), figsize=(3.2 * len(panels), 3.0))
    for ax, (title, matrix) in zip(axes, panels, strict=True):
        image = ax.imshow(matrix.detach().double().numpy(), cmap="RdBu_r")
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("query category t (X_i)" if "QK" in title else "category b (X_i)", fontsize=8)
        ax.set_ylabel("key category s (X_(i-1))" if "QK" in title else "category a (X_(i-1))", fontsize=8)
        fig.colorbar(image, ax=ax, fraction=0.046)
    fig.tight_layout()
    save_figure(fig, path, dpi=100)
    plt.close(fig)
    return path


def _construction_checks(s: dict[str, Any]) -> list[list[Any]]:
    """Each exact construction against q_true, for both kinds of q_true and both dtypes."""
    checks = []
    for kind in ("normal", "code"):
        q_check = make_q(kind, s["categories"], 0)
        for build in (sm.build_solution1, sm.build_solution2, sm.build_solution3):
            for dtype in ("float32", "float64"):
                c = check_construction(build(q_check, s["positions"], dtype=dtype), q_check, strings=s["batch"])
                checks.append([build.__name__.replace("build_", "sm-"), kind, dtype, c["max_abs_error"],
                               c["tolerance"], c["exact"]])
    return checks


SYSTEMS = (("solution2", "unconstrained"), ("combined", "unconstrained"))  # the trained systems, in table order


def _settings(ctx: ReportContext) -> dict[str, Any]:
    return QUICK if ctx.quick else FULL


def shin_matzinger_parts(ctx: ReportContext) -> list[str]:
    """The section's independent parts (exactlens.viz.parallel.per_part): the constructions' checks and each
    trained system and seed ("solution2/0", ...); none where the report covers no Shin & Matzinger construction."""
    if not ctx.covers(sm.PAPER):
        return []
    return ["checks"] + [f"{system}/{seed}" for system, _ in SYSTEMS for seed in range(_settings(ctx)["seeds"])]


def shin_matzinger_part(ctx: ReportContext, part: str) -> dict[str, Any]:
    """One part: {"checks": rows} or one trained seed's {"row", "verdict"} (with "fig1", the q_true and learned
    QK matrices of the figure, for solution2's seed 0); with its wall seconds."""
    s, start = _settings(ctx), time.perf_counter()
    if part == "checks":
        result: dict[str, Any] = {"checks": _construction_checks(s)}
    else:
        system, seed = part.split("/")
        result = _trained_row(ctx, s, system, dict(SYSTEMS)[system], int(seed))
    return {**result, "seconds": time.perf_counter() - start}


def _trained_row(ctx: ReportContext, s: dict[str, Any], system: str, flavour: str, seed: int) -> dict[str, Any]:
    """Ablations, signatures and verdict of one trained seed; for solution2's seed 0 also the figure's matrices."""
    options = {k: s[k] for k in ("categories", "positions", "batch", "iterations", "test_batch")}
    run = train_pairs(PairTrainConfig(**options, system=system, flavour=flavour, seed=seed), device=ctx.device)
    result = analyse(run.model, run.q_true, batch=s["batch"], seed=seed + 999)
    a, g = result["ablations"], result["signatures"]
    row = [f"{system}/{flavour}", seed, a["mse"], a["mse_without_attention"], a["mse_linear_ffn"],
           a["target_variance"], g["qk_category_q"], g["ov_category_q"], g["qk_position_shift"], result["verdict"]]
    out: dict[str, Any] = {"row": row, "verdict": result["verdict"]}
    if system == "solution2" and seed == 0:
        out["fig1"] = (run.q_true.detach().cpu(), category_qk(run.model).detach().cpu())
    return out


def _trained_rows(ctx: ReportContext, s: dict[str, Any]) -> tuple[list[list[Any]], Any, float]:
    """Every trained seed's row (and a consensus row per system), the figure's matrices (solution2, seed 0) and
    the seconds of the parts."""
    rows, fig1, seconds = [], None, 0.0
    for system, flavour in SYSTEMS:
        verdicts = []
        for seed in range(s["seeds"]):
            done = ctx.part(shin_matzinger_part, f"{system}/{seed}")
            rows.append(done["row"])
            verdicts.append(done["verdict"])
            fig1, seconds = done.get("fig1", fig1), seconds + done["seconds"]
        rows.append([f"{system}/{flavour}", "consensus", "", "", "", "", "", "", "", consensus(verdicts)])
    return rows, fig1, seconds


def _intro(s: dict[str, Any]) -> str:
    size = ("the paper's settings; the 10-seed grid of all flavours is in docs/shin_matzinger.md).</p>"
            if all(s[k] == v for k, v in PAPER.items())
            else "smaller than the paper's N = 10, M = 50, batch 1000, 50 iterations; the full-size numbers are "
            "in docs/shin_matzinger.md).</p>")
    return ("<p>One-layer transformers for Y_i = q_true(X_(i-1), X_i) (Shin &amp; Matzinger 2025): softmax-free "
            "attention, a normalization layer, two linear layers with a ReLU, trained with LBFGS on the MSE "
            f"(N = {s['categories']} categories, M = {s['positions']} positions, batch {s['batch']}, "
            f"{s['iterations']} iterations, {s['seeds']} seed(s); " + size)


@per_part(shin_matzinger_part, shin_matzinger_parts)
def shin_matzinger_sections(ctx: ReportContext) -> list[Section]:
    """The section; its checks and each trained seed are independent parts, spread over the report's workers."""
    if not ctx.covers(sm.PAPER):
        return []
    s: dict[str, Any] = _settings(ctx)
    parts = []
    try:
        checked = ctx.part(shin_matzinger_part, "checks")
        checks = checked["checks"]
        rows, (q_true, learned_qk), seconds = _trained_rows(ctx, s)
        t0 = time.perf_counter()  # the parts' seconds are their own (wherever they ran), then the page's
        exact = sm.build_solution2(make_q("normal", s["categories"], 0), s["positions"])
        png = _heatmaps(ctx.asset("figures", "shin_matzinger_fig1.png"),
                        [("q_true", q_true), ("learned QK, system 2", learned_qk),
                         ("QK of sm-solution2", category_qk(exact))])
        seconds += checked["seconds"] + time.perf_counter() - t0
        data = ctx.write_json(
            "shin_matzinger.json", {"settings": s, "checks": checks, "rows": rows, "verdict_rule": VERDICT_RULE}
        )
        parts += [
            _intro(s),
            table(["construction", "q_true", "dtype", "max |error|", "tolerance", "exact"],
                  [[fmt(v) if isinstance(v, float) else v for v in row] for row in checks],
                  caption=f"Constructions vs q_true: every sequence of length <= 3 (when at most 2^16) and "
                  f"{s['batch']} random ones of length {s['positions']}"),
            figure(ctx, png, "Fig. 1 reproduction", "Fig. 1: q_true, the category block of the learned bilinear "
                   "form of the system restricted to solution 2, and that of the exact construction sm-solution2"),
            table(["model", "seed", "MSE", "no attention", "linear FFN", "variance", "QK~q", "OV~q", "QK~shift",
                   "verdict"], [[fmt(v) if isinstance(v, float) else v for v in row] for row in rows],
                  caption="Ablations, signatures (|correlation|) and verdicts"),
            f"<p>Verdict rule: {esc(VERDICT_RULE)} (see exactlens.analysis.pairlogic). "
            f'Data: <a href="{esc(data)}">{esc(data)}</a> ({seconds:.1f} s)</p>',
        ]
        progress(f"report: Shin & Matzinger section done ({seconds:.1f} s)")
    except Exception as err:  # a failing section must not take the report down
        parts.append(ctx.error("Shin & Matzinger", err))
    return [Section("Shin & Matzinger: attention or FFN?", "shin-matzinger", "\n".join(parts))]


PAIRS_DIFF = TrainedDiff(
    "Trained vs exact: category pairs (solution 2)", "diff-pairs", "pairs", "sm-solution2", lengths=(8, 16),
    quick_options={"epochs": 5, "strings_per_epoch": 200},
    note="A regression task: behaviour is MSE and R^2; IIA decides by the nearest answer of the batch. The "
    "trained model is the combined, unconstrained system of §4 (LBFGS).",
)


def pairs_diff_sections(ctx: ReportContext) -> list[Section]:
    return [trained_diff_section(ctx, PAIRS_DIFF)] if PAIRS_DIFF.against in ctx.names else []

"""Verdicts on DAS alignment rows: what a researcher may conclude from one row and from one variable.

A DAS score alone misleads in both directions (docs/diff.md, "How to read the alignment"), so each
row of the alignment table gets one verdict, and each variable one line (``summary.verdicts``):

* ``"model does not solve the task"``: the trained model's accuracy on the diff's words closes less
  than half the gap from chance (the most common answer's rate) to 1 (:func:`solves_task`); nothing
  is claimed about how it computes a task it does not compute.
* ``"indistinguishable from the answer"``: the variable's counterfactual is the source's own answer
  on >= 99 % of pairs (``source_determined``), so any site that carries the answer "aligns" it; no
  site is claimed.
* ``"computed"``: on held-out test pairs that the patch has to change (the counterfactual answer
  differs from the model's own decision on the base), IIA >= 0.9 and >= the random-subspace p95, the
  95 % Wilson interval's lower end above the random mean and above doing nothing, the fit converged
  on its training pairs (IIA >= 0.99 on changed pairs) and the illusion check passed.
* ``"illusion suspected"``: the row's test scores would make it "computed" (or "indistinguishable"),
  but neither the part of Q that varies at the site nor the part that later components read reaches
  that IIA alone (:mod:`.illusion`).
* ``"unconverged"``: the fit stayed below 0.99 on its training pairs, and its test interval still
  lies above the random mean: something is there that the fit did not finish finding.
* ``"too few pairs"``: fewer than MIN_CHANGED_PAIRS held-out test pairs change the answer through the
  variable: even all right, the interval is too wide to claim it computed (10 of 10 right: [0.72, 1]),
  and a low score on so few is no evidence of absence either.
* ``"in the input"``: the row would be "computed", at ``blocks.0.hook_resid_pre``: a subspace of the
  embedded tokens and positions realizes the variable. A variable's line is "in the input" where it also
  is a function of the token at its position (and the position) on every word (``token_functions``,
  e.g. Dyck's ``bools_open``): nothing computes it. Otherwise such a row only says that swapping the input
  at every position realizes it (sm-solution1's categories, which attention writes from two tokens): the
  line prefers a "computed" row at a later site, and is "in the input" only where no other row passes.
* ``"untestable"`` (a variable's line, never a row): no pair can test it; ``untestable_reason`` says
  why, e.g. "constant within a length: no same-length interchange changes it" (parity's 1/n), or no
  pair of the designed search changes the exact output through it.
* ``"not found"``: everything else.

A position-resolved variable (``LABEL@p``, rows with ``position_index`` p: patched at its own position p, never
the readout's) is never "indistinguishable from the answer": at position p only what holds it there realizes
it. Its line is its earliest "computed" row at a component output (COMPONENT_SITES: where it is written at p;
the residual sites at p still hold the token there), else the rules above.

``pairs_needed`` (a variable's line): where the interval at the observed rate is too wide to decide
whether the IIA clears COMPUTED_IIA, the number of changed test pairs at which it would (at that
rate); None where it already does (or no count up to PAIRS_NEEDED_CAP would).

A variable's line is its best row, chosen on *validation* pairs (never on the test pairs that give
the reported IIA).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

COMPUTED_IIA = 0.9  # point IIA on changed test pairs a "computed" row needs
CONVERGED_IIA = 0.99  # training IIA on changed pairs below which a fit is "unconverged"
SOLVES_GAP = 0.5  # share of the gap from chance to 1 the model's accuracy must close
RANDOM_DRAWS = 20  # random subspaces per row for the baseline
WILSON_Z = 1.959963984540054  # two-sided 95 %
MIN_CHANGED_PAIRS = 10  # changed test pairs a row needs for "computed" / "not found" (fewer: "too few pairs")

VERDICTS = ("computed", "not found", "indistinguishable from the answer", "illusion suspected", "unconverged",
            "model does not solve the task", "too few pairs", "in the input", "untestable")
INPUT_SITE = "blocks.0.hook_resid_pre"  # the embedded tokens and positions
PAIRS_NEEDED_CAP = 100_000


# Brown, Cai & DasGupta (2001), modified Wilson: with 1-3 successes (or failures) the Wilson bound
# next to them undercovers small rates; the one-sided Poisson bound chi2_{2x, 0.05} / (2n) replaces it.
_POISSON_BOUND = {1: 0.05129, 2: 0.35536, 3: 0.81769}


def wilson(successes: int, n: int, z: float = WILSON_Z) -> list[float] | None:
    """The 95 % Wilson score interval [lo, hi] of a binomial rate, with the modification of Brown, Cai
    & DasGupta at 1-3 successes or failures (x = 1, 2 for n <= 50; x = 3 for 51 <= n <= 100); None
    without trials."""
    if n <= 0:
        return None
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    lo = 0.0 if successes == 0 else max(0.0, centre - half)
    hi = 1.0 if successes == n else min(1.0, centre + half)

    def modified(x: int) -> bool:
        return x in (1, 2) and n <= 50 or x == 3 and 51 <= n <= 100

    if modified(successes):
        lo = _POISSON_BOUND[successes] / n
    if modified(n - successes):
        hi = 1.0 - _POISSON_BOUND[n - successes] / n
    return [lo, hi]


def p95(values: Sequence[float | None]) -> float | None:
    kept = [v for v in values if v is not None]
    return float(torch.quantile(torch.tensor(kept, dtype=torch.float64), 0.95)) if kept else None


def mean(values: Sequence[float | None]) -> float | None:
    kept = [v for v in values if v is not None]
    return float(sum(kept) / len(kept)) if kept else None


def solves_task(task: Any, runs: Sequence[Any], side: Any, units: Any) -> dict[str, Any]:
    """The trained model's accuracy on the diff's words against chance (the most common answer's
    rate); it solves the task when it closes at least SOLVES_GAP of the gap from chance to 1."""
    right, answers = [], []
    for run in runs:
        if not len(run.ids):
            continue
        decisions = side.reader.decide(run.trained_outputs, run.n_positions)
        r, _ = units(task, decisions, run.truth, run.truth, run.n_positions)
        right.append(r.reshape(-1))
        truth = run.truth
        if truth.ndim > 1:
            truth = truth[task.target_mask(run.n_positions - task.n_specials, truth.shape[1], truth)]
        answers.append(truth.reshape(-1).double())
    if not right:
        return {"accuracy": None, "chance": None, "threshold": None, "solves": True, "units": 0}
    r, a = torch.cat(right), torch.cat(answers)
    accuracy = float(r.double().mean())
    _, counts = torch.unique(a, return_counts=True)
    chance = float(counts.max()) / a.numel()
    threshold = chance + SOLVES_GAP * (1 - chance)
    return {"accuracy": accuracy, "chance": chance, "threshold": threshold, "units": int(r.numel()),
            "accuracy_ci": wilson(int(r.sum()), int(r.numel())), "solves": accuracy >= threshold or chance >= 1.0}


def passes_scores(row: dict[str, Any]) -> bool:
    """The test-pair evidence of a "computed" row (without convergence and the illusion check): IIA on
    changed pairs >= COMPUTED_IIA and at least the random p95, the interval's lower end above the
    random mean and above doing nothing. (A site whose activations vary in about k dimensions lets
    random k-dimensional subspaces swap part of them; the p95 then reaches 1 at a site that does
    carry the variable, so the point IIA is held to the p95 and the interval to the mean.)"""
    iia, ci = row.get("iia_changed"), row.get("iia_ci")
    if iia is None or ci is None or iia < COMPUTED_IIA:
        return False
    if row.get("random_iia_p95") is not None and iia < row["random_iia_p95"]:
        return False
    floor = max(v for v in (row.get("random_iia_changed"), row.get("do_nothing_iia"), 0.0) if v is not None)
    return ci[0] > floor


def row_verdict(row: dict[str, Any], determined: float, solves: bool, determined_at: float) -> str:
    """One row's verdict (module docstring); ``determined_at``: the share above which a variable is
    source-determined."""
    if not solves:
        return "model does not solve the task"
    passes = passes_scores(row)
    if passes and (row.get("illusion") or {}).get("suspected"):
        return "illusion suspected"  # whatever the variable, this subspace does not carry it
    if determined >= determined_at:
        return "indistinguishable from the answer"
    if (row.get("changed_pairs") or 0) < MIN_CHANGED_PAIRS:
        return "too few pairs"
    converged = row.get("converged")
    if passes and row.get("site") == INPUT_SITE:
        return "in the input"
    if passes:
        return "unconverged" if converged is False else "computed"
    ci, floor = row.get("iia_ci"), row.get("random_iia_changed")
    if converged is False and ci is not None and ci[0] > (floor or 0.0):
        return "unconverged"
    return "not found"


def _selection_key(row: dict[str, Any], order: dict[str, int]) -> tuple:
    """Best on validation pairs: validation IIA on changed pairs, then on all pairs, then the earlier site."""
    v = row.get("validation_iia_changed")
    return (-(v if v is not None else -1.0), -(row.get("validation_iia") or 0.0), order.get(row["site"], 0))


COMPONENT_SITES = ("hook_attn_out", "hook_mlp_out")  # component outputs: what a component writes, not the input

VERDICT_FIELDS = ("verdict", "site", "position", "position_index", "dim", "iia", "iia_ci", "changed_pairs", "lift",
                  "random_iia_p95")


def variable_verdicts(rows: list[dict[str, Any]], sites: list[str], readout_name: str = "readout",
                      determined_at: float = 0.99, token_functions: frozenset = frozenset()
                      ) -> dict[str, dict[str, Any]]:
    """One line per variable: its best row by validation IIA (a "computed" row first), with that row's
    verdict. An answer-determined variable names no site, unless its localization test (every
    position of a component output, ``row["test"] == "localization"``) finds it computed at a site
    *before* the answer reaches the readout position (the earliest site where a readout row of any
    answer-determined variable carries it): then it is "computed" there. Exact labels are keyed
    ``exact:LABEL`` where a task variable has the same name."""
    order = {s: i for i, s in enumerate(sites)}
    by_variable: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for row in rows:
        by_variable.setdefault((row["origin"], row["variable"]), []).append(row)
    # Where the answer reaches the readout position: the earliest site at which the readout row of any
    # answer-determined variable swaps it (IIA >= COMPUTED_IIA; their counterfactuals are all the
    # source's own answer, so their readout rows test the same thing, and a variable the readout
    # position never holds, like FIRST's AND, has no readout row of its own that scores). A random
    # subspace that swaps it too (Dyck-1's readout) does not make the answer arrive any later.
    arrival = [order.get(r["site"], 0) for r in rows if (r.get("source_determined") or 0.0) >= determined_at
               and r.get("test") != "localization" and r["position"] == "readout" and r.get("changed_pairs")
               and (r.get("iia_changed") or 0.0) >= COMPUTED_IIA and r["verdict"] != "illusion suspected"]
    out: dict[str, dict[str, Any]] = {}
    for (origin, name), own in by_variable.items():
        key = name if origin == "task" or (("task", name) not in by_variable) else f"exact:{name}"
        scored = [r for r in own if r.get("changed_pairs")]
        resolved = any(r.get("position_index") is not None for r in own)
        determined = not resolved and max((r.get("source_determined") or 0.0) for r in own) >= determined_at
        written = [r for r in scored if r["verdict"] == "computed" and r["site"].endswith(COMPONENT_SITES)]
        if resolved and written:  # where a component writes it at its position (module docstring)
            best = min(written, key=lambda r: (order.get(r["site"], 0), _selection_key(r, order)))
        elif determined:
            best = _answer_determined(own, scored, order, min(arrival) if arrival else None)
        else:
            at_input = [r for r in scored if r["verdict"] == "in the input"]
            computed = [r for r in scored if r["verdict"] == "computed"]
            if (origin, name) in token_functions and at_input:
                computed = at_input  # the embedding carries it: a function of the token at its position
            pool = computed or at_input or [r for r in scored if r["verdict"] != "in the input"] or scored or own
            best = min(pool, key=lambda r: _selection_key(r, order))
        out[key] = _line(best, origin, readout_name)
        # where an answer-determined variable reaches the readout: the earliest site at which the readout
        # row of any answer-determined variable swaps the answer (a timeline dates this)
        out[key]["answer_arrival"] = sites[min(arrival)] if determined and arrival else None
    return out


def _answer_determined(own: list[dict[str, Any]], scored: list[dict[str, Any]], order: dict[str, int],
                       arrival: int | None) -> dict[str, Any]:
    readout = [r for r in scored if r.get("test") != "localization"]
    local = [r for r in scored if r.get("test") == "localization" and r["verdict"] == "computed"
             and arrival is not None and order.get(r["site"], 0) < arrival]
    if local:
        return min(local, key=lambda r: (order.get(r["site"], 0), _selection_key(r, order)))
    pool = readout or scored or own
    best = dict(min(pool, key=lambda r: _selection_key(r, order)))
    best["verdict"] = "indistinguishable from the answer" if best["verdict"] != "model does not solve the task" \
        else best["verdict"]
    return best


def _line(best: dict[str, Any], origin: str, readout_name: str) -> dict[str, Any]:
    line = {
        "verdict": best["verdict"],
        "site": best["site"],
        "position": best["position"],
        "position_index": best.get("position_index"),
        "dim": best["dim"],
        "iia": best.get("iia_changed"),
        "iia_ci": best.get("iia_ci"),
        "changed_pairs": best.get("changed_pairs", 0),
        "lift": best.get("lift"),
        "random_iia_p95": best.get("random_iia_p95"),
        "origin": origin,
        "position_name": readout_name if best["position"] == "readout" else (
            f"position {best['position_index']}" if best.get("position_index") is not None else "every position"),
        "pairs_needed": pairs_needed(best.get("iia_changed"), best.get("changed_pairs") or 0),
    }
    if best["verdict"] in ("indistinguishable from the answer", "model does not solve the task"):
        line["site"] = line["position"] = line["position_index"] = None  # no site is claimed
        line["pairs_needed"] = None  # decided by what the counterfactual is, or by the behaviour
    return line


def pairs_needed(iia: float | None, changed: int) -> int | None:
    """The changed test pairs at which the 95 % interval of an IIA observed at rate ``iia`` would lie wholly
    on one side of COMPUTED_IIA (at least MIN_CHANGED_PAIRS); None where the ``changed`` pairs already do,
    where nothing was measured, or where no count up to PAIRS_NEEDED_CAP would (a rate at the threshold)."""
    if iia is None or not changed:
        return None

    def decided(n: int) -> bool:
        ci = wilson(int(round(iia * n)), n)
        return ci is not None and n >= MIN_CHANGED_PAIRS and (ci[0] > COMPUTED_IIA or ci[1] < COMPUTED_IIA)

    if decided(changed):
        return None
    n = max(changed, MIN_CHANGED_PAIRS)
    while n <= PAIRS_NEEDED_CAP and not decided(n):
        n = int(math.ceil(n * 1.05))
    if n > PAIRS_NEEDED_CAP:
        return None
    low = max(changed, MIN_CHANGED_PAIRS, int(n / 1.05))
    return next(m for m in range(low, n + 1) if decided(m))


def _f(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _search_text(v: dict[str, Any]) -> str:
    """Where a designed search found too few effective test pairs: how many of how many, and what gives more."""
    search = v.get("search") or {}
    if v.get("pairs") != "designed" or not search.get("searched"):
        return ""
    exists = " (every pair of the test words)" if search.get("available") is not None else ""
    return (f"; the designed search found {search['effective']} effective of {search['searched']} test pairs"
            f"{exists}: more words per length (--strings) give more")


def format_verdict_line(variable: str, v: dict[str, Any]) -> str:
    """e.g. ``first symbol: computed at blocks.1.hook_attn_out [CLS] (IIA 0.98 [0.93, 1.00], 62 changed
    pairs, lift 0.98, random p95 0.05)``."""
    ci = v.get("iia_ci")
    interval = f" [{_f(ci[0])}, {_f(ci[1])}]" if ci else ""
    numbers = (f"IIA {_f(v.get('iia'))}{interval}, {v.get('changed_pairs', 0)} changed pairs, "
               f"lift {_f(v.get('lift'))}, random p95 {_f(v.get('random_iia_p95'))}")
    verdict = v["verdict"]
    if verdict == "untestable":
        return f"{variable}: untestable ({v.get('untestable_reason')})"
    if not v.get("changed_pairs"):
        return f"{variable}: {verdict} (no test pair changes the answer through it: untestable on these pairs" \
               f"{_search_text(v)})"
    if v.get("pairs_needed"):
        numbers += f"; {v['pairs_needed']} changed pairs would decide it{_search_text(v)}"
    if v.get("site") is None:
        where = " (best anywhere: " if verdict == "indistinguishable from the answer" else " ("
        return f"{variable}: {verdict}{where}{numbers})"
    position = v.get("position_name") or ("readout" if v.get("position") == "readout" else "every position")
    position = position if position == "every position" else f"[{position}]"
    preposition = "at" if verdict in ("computed", "in the input") else "best at"
    return f"{variable}: {verdict} {preposition} {v['site']} {position} (k={v.get('dim')}, {numbers})"


def verdict_lines(result: dict[str, Any]) -> list[str]:
    """The CLI text of the alignment part: whether the model solves the task, then one line per variable."""
    details = result.get("alignment_details", {})
    lines = []
    solves = details.get("solves")
    if solves and solves.get("accuracy") is not None:
        ci = solves.get("accuracy_ci") or [None, None]
        lines.append(f"  DAS (scored against the model's own decisions; test words unseen in fitting): accuracy "
                     f"{_f(solves['accuracy'])} [{_f(ci[0])}, {_f(ci[1])}] on {solves['units']} answers, chance "
                     f"{_f(solves['chance'])}" + ("" if solves["solves"] else " -> the model does not solve the task"))
    found = details.get("verdicts") or result.get("summary", {}).get("verdicts") or {}
    if not found and result.get("alignment") == []:
        reasons = "; ".join(s["reason"] for s in details.get("skipped", []) if s.get("reason"))
        lines.append(f"  DAS: no variable fitted{' (' + reasons + ')' if reasons else ''}")
    lines += [f"  {format_verdict_line(name, v)}" for name, v in found.items()]
    return lines

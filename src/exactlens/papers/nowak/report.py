"""Report section: Nowak et al. (2022) Fig. 2, PALINDROME's precision cliff, and palindrome-robust."""

from __future__ import annotations

import time

from exactlens.analysis.verify import precision
from exactlens.constructions import get
from exactlens.papers.nowak import figures as nf
from exactlens.viz.page import ReportContext, Section, esc, figure, fmt, progress, table

NOWAK_NAMES = ("one", "palindrome", "palindrome-robust")


def nowak_sections(ctx: ReportContext) -> list[Section]:
    """Fig. 2 (accuracy vs |w|), the cliff per dtype, when the report covers a Nowak construction."""
    if not any(name in NOWAK_NAMES for name in ctx.names):
        return []
    parts = []
    try:
        t0 = time.perf_counter()
        max_length, strings = (60, 20) if ctx.quick else (200, 100)
        rows = []
        for dtype in ("float32", "float64"):
            result = precision("palindrome", dtype=dtype, max_length=max(max_length, 120), strings=32,
                               device=ctx.device_for(dtype))
            first = result["first_failure_length"]
            detail = nf.signal_and_rounding([first], dtype)[0] if first is not None else None
            rows.append(
                [
                    dtype,
                    result["max_exact_length"],
                    first,
                    detail["threshold"] if detail else None,
                    detail["largest_palindrome_abs_s"] if detail else None,
                ]
            )
        parts += [
            "<h3>PALINDROME's precision cliff</h3>",
            "<p>The faithful construction (§3.2, c = ln 2) reads the verdict off s = (sum of ±2^i over "
            "mismatched pairs) / (2^n - 1) (App. A), n = |w| + 2. Its smallest nonzero value, 2/(2^n - 1) "
            "(a mismatch at the outermost pair), is O(2^-n), while each head's output is about 2^(-n/2) "
            "(one half read as a binary number over 2^n - 1), so rounding in the heads is about u 2^(-n/2). "
            "The decision |s| &lt; 2^-n fails once that rounding reaches 2^-n: near n = 2 log2(1/u), i.e. "
            "n ~ 48 in float32 and ~106 in float64. The paper reports exact accuracy up to 37.</p>",
            table(
                [
                    "dtype",
                    "last exact |w|",
                    "first failing |w|",
                    "threshold 2^-n there",
                    "largest |s| of a palindrome there (rounding)",
                ],
                rows,
            ),
        ]
        data = nf.fig2_data(max_length=max_length, strings=strings)
        data_json = ctx.write_json("nowak_fig2.json", data)
        png = nf.plot_fig2(data, ctx.asset("figures", "nowak_fig2.png"))
        robust_exact = all(
            c["first_error_length"] is None for c in data["curves"].values() if c["name"] == "palindrome-robust"
        )
        summary = [
            [key, c["last_perfect_before_first_error"], c["first_error_length"], c["mean_accuracy_above_first_error"]]
            for key, c in data["curves"].items()
        ]
        parts += [
            "<h3>Fig. 2: exact PALINDROME accuracy against length</h3>",
            f"<p>{strings} words per length |w| = 1..{max_length} from the Appendix B sampler "
            "(palindromes and one-flip negatives, 1/2 each). palindrome-robust (ours: mirror lookup by "
            "quadratic maximization, position-wise mismatch, uniform average; logit (1/2 - M)/n) "
            + ("has accuracy 1 at every length here" if robust_exact else "makes errors here (see the table)")
            + ".</p>",
            figure(ctx, png, "Nowak Fig. 2 reproduction", "Fig. 2: accuracy per length, both constructions"),
            table(["curve", "accuracy 1 up to |w|", "first error at |w|", "mean accuracy from there"], summary),
            f'<p>JSON: <a href="{esc(data_json)}">{esc(data_json)}</a>; robust margin |logit| &gt;= 1/(2n), '
            f"e.g. {fmt(0.5 / (max_length + 2))} at |w| = {max_length}.</p>",
        ]
        progress(f"report: nowak figures done ({time.perf_counter() - t0:.1f} s)")
    except Exception as err:
        parts.append(ctx.error("Nowak et al. figures", err))
    paper = get("palindrome").paper.split(" §")[0]
    return [Section(f"{paper}: PALINDROME precision", "nowak-figures", "\n".join(parts))]

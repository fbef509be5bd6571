"""Nowak et al. (2022) Fig. 2 recomputed: exact PALINDROME accuracy against length.

The paper tests every length 1..200 on its Appendix B data (palindromes and one-flip
negatives) and reports accuracy 1 up to 37, then a fall to chance (0.5) near 70.
fig2_data draws the same curve for the faithful construction (``palindrome``) and for
ours (``palindrome-robust``), in float32 (PyTorch's default, the paper's setting) and
float64, on words from the language's sampler (each a palindrome or a one-flip
negative with probability 1/2), through :func:`exactlens.analysis.verify.verify`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from exactlens.analysis.verify import verify
from exactlens.errors import ExactLensError
from exactlens.outputs import save_figure
from exactlens.viz.backend import pyplot

FIG2_CONSTRUCTIONS = ("palindrome", "palindrome-robust")
FIG2_DTYPES = ("float32", "float64")
PAPER_LAST_EXACT = 37  # §4.1 / §5: perfect accuracy for n in [1, 37]


def fig2_data(
    max_length: int = 200,
    strings: int = 200,
    seed: int = 0,
    constructions: tuple[str, ...] = FIG2_CONSTRUCTIONS,
    dtypes: tuple[str, ...] = FIG2_DTYPES,
) -> dict[str, Any]:
    """Accuracy per |w| = 1..max_length for every construction and dtype (sampled words only)."""
    if not isinstance(max_length, int) or max_length < 1:
        raise ExactLensError(f"max_length must be an integer >= 1, got {max_length!r}")
    if not isinstance(strings, int) or strings < 1:
        raise ExactLensError(f"strings must be an integer >= 1, got {strings!r}")
    lengths = list(range(1, max_length + 1))
    curves: dict[str, dict[str, Any]] = {}
    for name in constructions:
        for dtype in dtypes:
            # exhaustive_limit=0: the paper's sampler at every length (uniform words are almost never palindromes).
            result = verify(name, lengths, strings=strings, dtype=dtype, seed=seed, exhaustive_limit=0)
            accuracy = [row["accuracy"] for row in result["results"]]
            imperfect = [length for length, acc in zip(lengths, accuracy, strict=True) if acc < 1.0]
            curves[f"{name} / {dtype}"] = {
                "name": name,
                "dtype": dtype,
                "accuracy": accuracy,
                "last_perfect_before_first_error": (imperfect[0] - 1) if imperfect else max_length,
                "first_error_length": imperfect[0] if imperfect else None,
                "mean_accuracy_above_first_error": (
                    sum(accuracy[imperfect[0] - 1 :]) / len(accuracy[imperfect[0] - 1 :]) if imperfect else None
                ),
            }
    return {
        "lengths": lengths,
        "strings": strings,
        "seed": seed,
        "paper_last_exact": PAPER_LAST_EXACT,
        "sampler": "Palindrome.sample: palindrome or one-flip negative, probability 1/2 each (App. B.3)",
        "curves": curves,
    }


STYLE = {
    "palindrome / float32": ("tab:red", "-"),
    "palindrome / float64": ("tab:orange", "--"),
    "palindrome-robust / float32": ("tab:blue", "-"),
    "palindrome-robust / float64": ("tab:green", ":"),
}


def plot_fig2(data: dict[str, Any], path: str | Path) -> Path:
    """Accuracy against |w|, one curve per construction and dtype, the paper's last exact length marked."""
    plt = pyplot()

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(9, 4.5))
    for key, curve in data["curves"].items():
        colour, style = STYLE.get(key, (None, "-"))
        ax.plot(data["lengths"], curve["accuracy"], ls=style, color=colour, label=key, lw=1.4)
    ax.axvline(data["paper_last_exact"], color="grey", ls=":", lw=1)
    ax.text(
        data["paper_last_exact"] + 1,
        0.42,
        f"paper: exact up to {data['paper_last_exact']}",
        color="grey",
        fontsize="small",
    )
    ax.set_ylim(0.4, 1.03)
    ax.set_xlabel("string length |w| (n = |w| + 2 positions with [CLS], [EOS])")
    ax.set_ylabel("accuracy")
    ax.set_title(
        f"PALINDROME, exact constructions: {data['strings']} words per length (palindromes and one-flip negatives)"
    )
    ax.grid(True, alpha=0.3)
    ax.legend(loc="lower left", fontsize="small")
    fig.tight_layout()
    save_figure(fig, path, dpi=110)
    plt.close(fig)
    return path


def signal_and_rounding(lengths: list[int], dtype: str) -> list[dict[str, Any]]:
    """Per |w|: the smallest exact |s| of a non-palindrome, 2/(2^n - 1) (App. A, a mismatch at i = 1),
    against the largest |s| the faithful model computes for a palindrome (pure rounding), on the
    language's hardest words. The decision threshold 2^-n lies between them while it works."""
    from exactlens.analysis.verify import readout_logits
    from exactlens.constructions import build
    from exactlens.tasks import get as language

    lang = language("palindrome")
    model = build("palindrome", dtype=dtype)
    rows = []
    for length in lengths:
        words = lang.hard_words(length)
        gen = torch.Generator().manual_seed(length)
        words = torch.cat([words, lang.palindromes(length, 64, gen)])
        truth = lang.membership(words)
        s = readout_logits(model, lang.encode(words).tokens).double()
        n = length + 2
        rows.append(
            {
                "length": length,
                "smallest_signal": 2.0 / (2.0**n - 1),
                "threshold": 2.0**-n,
                "largest_palindrome_abs_s": float(s[truth].abs().max()),
                "smallest_negative_abs_s": float(s[~truth].abs().min()) if bool((~truth).any()) else None,
            }
        )
    return rows

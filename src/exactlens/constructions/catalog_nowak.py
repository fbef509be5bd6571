"""Registry entries of Nowak et al. 2022 (ONE, PALINDROME) and the precision-robust PALINDROME."""

from __future__ import annotations

from exactlens.constructions import nowak
from exactlens.constructions.palindrome_robust import palindrome_robust
from exactlens.constructions.registry import Construction, register

NOWAK = "Nowak et al. 2022"

register(
    Construction(
        "one", "one", nowak.one, f"{NOWAK} §3.1", "ONE, 1 layer x 1 head, d=7, no layer norm; s = (I[k=1] - 1/2)/n"
    )
)
register(
    Construction(
        "palindrome",
        "palindrome",
        nowak.palindrome,
        f"{NOWAK} §3.2, App. A",
        "PALINDROME with [EOS], 2 layers x 2 heads, d=11, c=ln 2; s = sum of ±2^i over "
        "mismatches / (2^n - 1); accept iff |s| < 2^-n",
        decide=nowak.decide_palindrome,
    )
)
register(
    Construction(
        "palindrome-robust",
        "palindrome",
        palindrome_robust,
        "ours (Yang et al. 2025 §5.3.4, §5.7)",
        "PALINDROME by mirror lookup (quadratic maximization, gap magnified to underflow), "
        "position-wise mismatch, uniform average; logit (1/2 - M)/n, |logit| >= 1/(2n)",
    )
)

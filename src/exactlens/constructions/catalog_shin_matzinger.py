"""Registry entries of Shin & Matzinger 2025 (category pairs of adjacent tokens, §2).

These are regression models (one real output per position), not recognizers: the
registry lists them, and `verify`/`precision` stop with an error that points to
`exactlens pairlogic --check`, which checks them against q_true.
"""

from __future__ import annotations

from exactlens.constructions import shin_matzinger as sm
from exactlens.constructions.registry import Construction, register
from exactlens.errors import ExactLensError

SM = "Shin & Matzinger 2025"


class RegressionConstruction(Construction):
    """A construction whose output is a real number per position: no membership, no verify."""

    def check_length(self, length: int) -> None:
        raise ExactLensError(
            f"{self.name} is a regression construction ({self.paper}): it outputs q_true(X_(i-1), X_i) at "
            "every position, not a membership logit, so verify/precision do not apply; check it with "
            f"`exactlens pairlogic --check {self.name}` (exactness on every short sequence and on random ones)"
        )


register(
    RegressionConstruction(
        "sm-solution1",
        "pairs",
        sm.solution1,
        f"{SM} §2.1",
        "attention (k^T q = 2 D_-1) puts X_(i-1) next to X_i; FFN with N^2 rows + C decode the pair",
        tags=("regression",),
    )
)
register(
    RegressionConstruction(
        "sm-solution2",
        "pairs",
        sm.solution2,
        f"{SM} §2.2",
        "bilinear score k^T q = A_2 = q_true on categories; v shifts positions; skip + ReLU keep the diagonal",
        tags=("regression",),
    )
)
register(
    RegressionConstruction(
        "sm-solution3",
        "pairs",
        sm.solution3,
        f"{SM} §2.3",
        "v = A_2^T on categories, k^T q = D_-1 on positions; skip + ReLU extract the entry",
        tags=("regression",),
    )
)

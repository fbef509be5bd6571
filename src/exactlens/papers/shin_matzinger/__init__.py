"""Shin & Matzinger 2025, "Does a one-layer transformer do pair logic in attention or in the FFN?":
the category-pair regression task, the three exact solutions, LBFGS training of the constrained
systems, the pair-logic verdicts (``exactlens pairlogic``) and a report section. A plug-in (entry
point ``shin_matzinger``).

``register`` imports nothing heavy: the task, builders, preset and sections are named by where they
live and imported when first used (exactlens.plugins.lazy); the verb's module imports its work when
the verb runs."""

SM = "Shin & Matzinger 2025"
_HERE = "exactlens.papers.shin_matzinger"
_Q = {"categories": 10, "positions": 50, "q": "normal", "q_seed": 0}  # every solution's parameters


def _pair_task(p: dict) -> dict:
    return {"categories": p["categories"], "q": p["q"], "seed": p["q_seed"]}


def register() -> None:
    from exactlens import tasks
    from exactlens.constructions.registry import Construction
    from exactlens.constructions.registry import register as register_construction
    from exactlens.papers.shin_matzinger import cli
    from exactlens.plugins import lazy
    from exactlens.train.registry import register_preset
    from exactlens.viz.page import register_section

    tasks.register(lazy(f"{_HERE}.task:Pairs", kind="regression", min_length=2), name="pairs")
    for name, builder, section, summary, large in (
        ("sm-solution1", "solution1", "§2.1",
         "attention (k^T q = 2 D_-1) puts X_(i-1) next to X_i; FFN with N^2 rows + C decode the pair", False),
        ("sm-solution2", "solution2", "§2.2",
         "bilinear score k^T q = A_2 = q_true on categories; v shifts positions; skip + ReLU keep the diagonal", True),
        ("sm-solution3", "solution3", "§2.3",
         "v = A_2^T on categories, k^T q = D_-1 on positions; skip + ReLU extract the entry", True),
    ):
        register_construction(Construction(name, "pairs", f"{_HERE}.constructions:{builder}", f"{SM} {section}",
                                           summary, task_params=_pair_task, tags=("regression",),
                                           parameters={**_Q, **({"large": None} if large else {})}))
    cli.register_cli()
    register_preset(lazy(f"{_HERE}.training:PAIRS_PRESET", task="pairs", paper=f"{SM} §4",
                         summary="one-layer softmax-free model of category pairs (N=10, M=50), LBFGS on one batch "
                         "of 1000; systems solution1..3 or combined"), name="pairs")
    register_section("shin-matzinger", lazy(f"{_HERE}.report:shin_matzinger_sections"), order=600)
    register_section("shin-matzinger-diff-pairs", lazy(f"{_HERE}.report:pairs_diff_sections"), order=610)

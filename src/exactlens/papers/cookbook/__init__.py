"""The Transformer Cookbook's worked examples (Yang et al. 2025, §9): induction heads and Dyck
languages as constructions, the Dyck external-check decision rule and a report section. The
recipes themselves are in the core (exactlens.constructions.cookbook). A plug-in (entry point
``cookbook``).

``register`` imports nothing heavy: builders, the decision rule, the training settings and the
sections are named by where they live and imported when first used (exactlens.plugins.lazy)."""

TC = "Transformer Cookbook (Yang et al. 2025)"
DYCK_RULE_NAME = "dyck-zero-check"  # exactlens.papers.cookbook.examples.DYCK_RULE
_EXAMPLES = "exactlens.papers.cookbook.examples"


def _symbols(p: dict) -> dict:
    return {"num_symbols": p["num_symbols"]}


def _dyck1(p: dict) -> dict:
    return {"k": 1, "max_depth": None}


def _dyck1_depth2(p: dict) -> dict:
    return {"k": 1, "max_depth": 2}


def _dyck_kd(p: dict) -> dict:
    return {"k": p["k"], "max_depth": p["D"]}


def register() -> None:
    from exactlens.constructions.registry import Construction
    from exactlens.constructions.registry import register as register_construction
    from exactlens.plugins import lazy
    from exactlens.tasks.decisions import register_decision_rule
    from exactlens.train.registry import register_task_defaults
    from exactlens.viz.page import register_section

    register_decision_rule(lazy(f"{_EXAMPLES}:DYCK_RULE"), name=DYCK_RULE_NAME)
    for construction in (
        Construction("induction-recent", "induction-recent", f"{_EXAMPLES}:induction_recent", f"{TC} §9.1.1",
                     "at every position, the follower of the most recent earlier occurrence of the current "
                     "symbol (itself if none); 2 layers, unique-hard", task_params=_symbols,
                     parameters={"num_symbols": 3}),
        Construction("induction-frequent", "induction-frequent", f"{_EXAMPLES}:induction_frequent", f"{TC} §9.1.2",
                     "at every position, the most frequent follower of the current symbol (ties: "
                     "alphabetical); bigram counts, 2 layers", task_params=_symbols, parameters={"num_symbols": 3}),
        Construction("dyck1", "dyck", f"{_EXAMPLES}:dyck1", f"{TC} §9.2.1",
                     "Dyck-1, future-masked uniform attention; uniform external check, or 0/1 with max_length=N",
                     task_params=_dyck1, decision_rule=DYCK_RULE_NAME, parameters={"max_length": None}),
        Construction("dyck1-depth2", "dyck", f"{_EXAMPLES}:dyck1_depth2", f"{TC} §9.2.2",
                     "Dyck-1 of depth <= 2: match-and-cancel twice (4 hard-attention layers + final average)",
                     task_params=_dyck1_depth2, decision_rule=DYCK_RULE_NAME,
                     parameters={"max_length": None, "weighting": "unique_hard"}),
        Construction("dyck-k-D", "dyck", f"{_EXAMPLES}:dyck_kd", f"{TC} §9.2.3",
                     "Dyck-k of depth <= D: 2D hard-attention layers cancel matched pairs, then an average",
                     task_params=_dyck_kd, decision_rule=DYCK_RULE_NAME,
                     parameters={"k": 2, "D": 2, "max_length": None, "weighting": "unique_hard"}),
    ):
        register_construction(construction)
    register_section("cookbook-examples", lazy("exactlens.papers.cookbook.report:examples_sections"), order=500)
    register_section("cookbook-diff-induction", lazy("exactlens.papers.cookbook.report:induction_diff_sections"),
                     order=510)
    register_task_defaults("dyck", lazy(f"{_EXAMPLES}:DYCK_TRAINING"))
    register_task_defaults("induction-recent", lazy(f"{_EXAMPLES}:INDUCTION_TRAINING"))
    register_task_defaults("induction-frequent", lazy(f"{_EXAMPLES}:INDUCTION_TRAINING"))

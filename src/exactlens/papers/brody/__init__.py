"""Brody, Alon & Yahav 2023, "On the expressivity role of LayerNorm in transformers' attention":
MAJORITY (exact construction, training preset, query angle), Fig. 1c/1d, Tables 1-2 on a character
LM of Python's docstrings, Fig. 2-3, report sections. The convex-hull check itself is in the core
(exactlens.analysis.hull). A plug-in (entry point ``brody``).

``register`` imports nothing heavy: the tasks, builder, presets and sections are named by where they
live and imported when first used (exactlens.plugins.lazy; what is declared here is checked against
the objects by tests/test_plugins.py)."""

BRODY = "Brody et al. 2023"
_HERE = "exactlens.papers.brody"


def _classes(p: dict) -> dict:
    return {"num_classes": p["num_classes"]}


def _margin_classes(p: dict) -> dict:
    return {"num_classes": p["num_classes"], "min_margin": p["min_margin"]}


def register() -> None:
    from exactlens import tasks
    from exactlens.constructions.registry import Construction
    from exactlens.constructions.registry import register as register_construction
    from exactlens.plugins import lazy
    from exactlens.train.registry import register_preset
    from exactlens.viz.page import register_section

    tasks.register(lazy(f"{_HERE}.lm:CharTask", kind="prediction", min_length=2), name="stdlib-chars")
    tasks.register(lazy(f"{_HERE}.majority:MarginMajority", kind="prediction", min_length=1), name="majority-margin")
    register_construction(Construction(
        "majority", "majority", f"{_HERE}.majority:majority", f"{BRODY} §4.1",
        "most frequent of num_classes classes: uniform attention, logits (count_c - c/k)/n at CLS",
        task_params=_classes, parameters={"num_classes": 20}))
    register_construction(Construction(
        "majority-per-position", "majority-margin", f"{_HERE}.majority:majority_per_position", f"{BRODY} §4.1",
        "the word's majority class at every position (majority-margin): uniform attention, logits count_c/n",
        min_length=1, task_params=_margin_classes, parameters={"num_classes": 20, "min_margin": 6},
        min_length_param="min_margin"))
    register_preset(lazy(
        f"{_HERE}.majority:MAJORITY_PRESET", task="majority", paper=f"{BRODY}, §4.1, App. E.1",
        summary="MAJORITY: 1 layer, d = 8, 20 classes, |w| = 50, logits at CLS; layer norm full / scale_only / none"),
        name="majority")
    register_preset(lazy(
        f"{_HERE}.majority:MAJORITY_PER_POSITION", task="majority-margin", paper=f"{BRODY}, §4.1, App. E.1",
        summary="MAJORITY as the paper trains it: the majority class predicted at every position, no [CLS], "
        "words with majority - runner-up >= 6; the authors' layer (d = 8, FFN 8, pre-LN, no final LN); "
        "by default a CPU budget (600 Adam steps of 100 words, lr 1e-2); App. E.1's schedule (lr 1e-3 linear, "
        "batch 6000, 17K steps) is benchmarks/brody_majority.py's"), name="majority-per-position")
    register_section("brody", lazy(f"{_HERE}.report:brody_sections"), order=200)
    register_section("brody-diff-majority", lazy(f"{_HERE}.report:majority_diff_sections"), order=210)

"""Nowak et al. 2022, "On the power of finite-precision ... transformers": exact ONE and PALINDROME,
the PALINDROME precision cliff, our precision-robust and layer-norm-hash PALINDROMEs, the ONE
training preset, Fig. 2 and report sections. A plug-in (entry point ``nowak``).

``register`` imports nothing heavy: builders, the decision rule, the preset and the sections are
named by where they live and imported when first used (exactlens.plugins.lazy)."""

NOWAK = "Nowak et al. 2022"
PALINDROME_RULE_NAME = "abs-below-2^-n"  # exactlens.papers.nowak.constructions.PALINDROME_RULE
_HERE = "exactlens.papers.nowak"


def register() -> None:
    from exactlens.constructions.registry import Construction
    from exactlens.constructions.registry import register as register_construction
    from exactlens.plugins import lazy
    from exactlens.tasks.decisions import register_decision_rule
    from exactlens.train.registry import register_preset, register_task_defaults
    from exactlens.viz.page import register_section

    register_decision_rule(lazy(f"{_HERE}.constructions:PALINDROME_RULE"), name=PALINDROME_RULE_NAME)
    for construction in (
        Construction("one", "one", f"{_HERE}.constructions:one", f"{NOWAK} §3.1",
                     "ONE, 1 layer x 1 head, d=7, no layer norm; s = (I[k=1] - 1/2)/n", parameters={}),
        Construction("palindrome", "palindrome", f"{_HERE}.constructions:palindrome", f"{NOWAK} §3.2, App. A",
                     "PALINDROME with [EOS], 2 layers x 2 heads, d=11, c=ln 2; s = sum of ±2^i over "
                     "mismatches / (2^n - 1); accept iff |s| < 2^-n", decision_rule=PALINDROME_RULE_NAME,
                     parameters={}),
        Construction("palindrome-robust", "palindrome", f"{_HERE}.palindrome_robust:palindrome_robust",
                     "ours (Yang et al. 2025 §5.3.4, §5.7)",
                     "PALINDROME by mirror lookup (quadratic maximization, gap magnified to underflow), "
                     "position-wise mismatch, uniform average; logit (1/2 - M)/n, |logit| >= 1/(2n)",
                     parameters={"lookup": "softmax", "gap_scale": None}),
        Construction("palindrome-hash", "palindrome", f"{_HERE}.palindrome_hash:palindrome_hash",
                     "ours (Yang et al. 2025 §5.1.2, §5.3.3, §4.8)",
                     "PALINDROME by layer-norm-hash lookup of the mirror n-1-i (6 layers, average-hard, selective "
                     "LN); logit (1 - M)/n at CLS, M = #mismatches (0 or >= 2), |logit| >= 1/n",
                     tags=("layer-norm-hash",), parameters={}),
    ):
        register_construction(construction)
    register_preset(lazy(f"{_HERE}.presets:ONE", task="one", paper=f"{NOWAK}, §4.2, Fig. 5",
                         summary="ONE: 1 layer x 1 head, position feature i/n (§3.1.1) or FIRST's I[i=1]; fixed or "
                         "variable lengths"), name="one")
    register_task_defaults("palindrome", lazy(f"{_HERE}.presets:PALINDROME_TRAINING"))
    register_section("nowak", lazy(f"{_HERE}.report:nowak_sections"), order=400)

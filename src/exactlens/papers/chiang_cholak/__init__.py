"""Chiang & Cholak 2022, "Overcoming a Theoretical Limitation of Self-Attention": exact PARITY and
FIRST transformers, layer norm for low cross-entropy (§4), log-n scaled attention (§5), their
training presets, Fig. 2-4 and report sections. A plug-in (entry point ``chiang_cholak``).

``register`` imports nothing heavy: the builders, presets and sections are named by where they live
and imported when first used (exactlens.plugins.lazy)."""

CC = "Chiang & Cholak 2022"
_HERE = "exactlens.papers.chiang_cholak"

# name, task, builder, section, summary, parameters (the builder's, with defaults), min_length
CONSTRUCTIONS = (
    ("parity", "parity", "parity", "§3.2", "PARITY, 2 layers x 2 heads, d=9, no layer norm; s = ±2tanh(c)/n^2 (even n)",
     {"c": 1.0, "log_scaled": False}, 0),
    ("first", "first", "first", "§3.3", "FIRST, 2 layers, d=6, no layer norm; s = e^c/(e^c+n-1)(I[w1=1]-1/2)",
     {"c": 1.0, "log_scaled": False}, 0),
    ("parity-ln", "parity", "parity_ln", "§4.1",
     "PARITY with [x,-x] residual and post-LN (gamma=1, beta=0), eps a parameter", {"c": 1.0, "eps": 0.0}, 0),
    ("first-ln", "first", "first_ln", "§4.1",
     "FIRST with [x,-x] residual and post-LN (gamma=1, beta=0), eps a parameter", {"c": 1.0, "eps": 0.0}, 0),
    # the -eta ones: for the empty word s = 0 and LN(0) = 0/0 with eps = 0
    ("parity-ln-eta", "parity", "parity_ln_eta", "§4.2 Prop. 2",
     "parity-ln (eps=0) plus the Prop. 2 layer: cross-entropy eta bits for every n", {"eta": 0.01, "c": 1.0}, 1),
    ("first-ln-eta", "first", "first_ln_eta", "§4.2 Prop. 2",
     "first-ln (eps=0) plus the Prop. 2 layer: cross-entropy eta bits for every n", {"eta": 0.01, "c": 1.0}, 1),
    ("first-log", "first", "first_log", "§5.3 eq. 2, Prop. 3",
     "FIRST with attention logits scaled by log n; |s| > 1/4 for c=1", {"c": 1.0}, 0),
    ("first-log-ln", "first", "first_log_ln", "§5.3 Prop. 3", "first-log with [x,-x] residual and post-LN",
     {"c": 1.0, "eps": 1e-05}, 0),
    ("first-flawed", "first", "first_flawed", "§5.2",
     "one-layer FIRST that leaks the other positions; correct iff c > log(n-1)", {"c": 1.0}, 0),
)


def register() -> None:
    from exactlens.constructions.registry import Construction
    from exactlens.constructions.registry import register as register_construction
    from exactlens.plugins import lazy
    from exactlens.train.registry import register_preset
    from exactlens.viz.page import register_section

    for name, task, builder, section, summary, parameters, min_length in CONSTRUCTIONS:
        register_construction(Construction(name, task, f"{_HERE}.constructions:{builder}", f"{CC} {section}", summary,
                                           min_length=min_length, parameters=parameters))
    register_preset(lazy(f"{_HERE}.presets:FIRST", task="first", paper=f"{CC}, §5.1/§5.3, Fig. 4",
                         summary="FIRST: 2 layers x 1 head, position feature I[i=1] (as the §3.3 solution)"),
                    name="first")
    register_preset(lazy(f"{_HERE}.presets:PARITY", task="parity", paper=f"{CC}, §5.1",
                         summary="PARITY: 2 layers x 2 heads, position features i/n, cos(i*pi) (as the §3.2 "
                         "solution)"), name="parity")
    register_section("chiang-cholak-figures", lazy(f"{_HERE}.report:chiang_figures_sections"), order=100)
    register_section("chiang-cholak-diff", lazy(f"{_HERE}.report:diff_sections"), order=300)

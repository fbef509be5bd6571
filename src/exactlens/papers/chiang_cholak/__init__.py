"""Chiang & Cholak 2022, "Overcoming a Theoretical Limitation of Self-Attention": exact PARITY and
FIRST transformers, layer norm for low cross-entropy (§4), log-n scaled attention (§5), their
training presets, Fig. 2-4 and report sections. A plug-in (entry point ``chiang_cholak``)."""


def register() -> None:
    from exactlens.papers.chiang_cholak import constructions, presets, report

    constructions.register_constructions()
    presets.register_presets()
    report.register_sections()

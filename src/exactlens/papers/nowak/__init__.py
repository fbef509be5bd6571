"""Nowak et al. 2022, "On the power of finite-precision ... transformers": exact ONE and PALINDROME,
the PALINDROME precision cliff, our precision-robust and layer-norm-hash PALINDROMEs, the ONE
training preset, Fig. 2 and report sections. A plug-in (entry point ``nowak``)."""


def register() -> None:
    from exactlens.papers.nowak import constructions, presets, report

    constructions.register_constructions()
    presets.register_presets()
    report.register_sections()

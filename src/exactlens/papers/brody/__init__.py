"""Brody, Alon & Yahav 2023, "On the expressivity role of LayerNorm in transformers' attention":
MAJORITY (exact construction, training preset, query angle), Fig. 1c/1d, Tables 1-2 on a character
LM of Python's docstrings, Fig. 2-3, report sections. The convex-hull check itself is in the core
(exactlens.analysis.hull). A plug-in (entry point ``brody``)."""


def register() -> None:
    from exactlens import tasks
    from exactlens.papers.brody import lm, majority, report

    tasks.register(lm.CharTask)
    majority.register_majority()
    report.register_sections()

"""Shin & Matzinger 2025, "Does a one-layer transformer do pair logic in attention or in the FFN?":
the category-pair regression task, the three exact solutions, LBFGS training of the constrained
systems, the pair-logic verdicts (``exactlens pairlogic``) and a report section. A plug-in (entry
point ``shin_matzinger``)."""


def register() -> None:
    from exactlens import tasks
    from exactlens.papers.shin_matzinger import cli, constructions, report, task, training

    tasks.register(task.Pairs)
    constructions.register_constructions()
    cli.register_cli()
    training.register_presets()
    report.register_sections()

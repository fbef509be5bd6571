"""The Transformer Cookbook's worked examples (Yang et al. 2025, §9): induction heads and Dyck
languages as constructions, the Dyck external-check decision rule and a report section. The
recipes themselves are in the core (exactlens.constructions.cookbook). A plug-in (entry point
``cookbook``)."""


def register() -> None:
    from exactlens.papers.cookbook import examples, report

    examples.register_constructions()
    report.register_sections()
    examples.register_training_defaults()

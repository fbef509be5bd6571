"""Constructions: the registry of exact transformers (``registry``: a name -> its task, builder, paper and
decision rule) and the ways to write their weights: ``builder`` (weights by residual label, the way a paper
writes its matrices) and ``cookbook`` (programs of pieces over named labels, compiled one pass per module).
The papers' own constructions live in their plug-ins (``exactlens.papers.<paper>``), imported programs in
``exactlens.interop.tracr``; docs/architecture.md says which way to use when."""

from exactlens.constructions.registry import REGISTRY, Construction, build, get, names, register

__all__ = ["REGISTRY", "Construction", "build", "get", "names", "register"]

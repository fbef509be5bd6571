"""Constructions: one module per paper; a registry maps names to builders."""

from exactlens.constructions.registry import REGISTRY, Construction, build, get, names, register

__all__ = ["REGISTRY", "Construction", "build", "get", "names", "register"]

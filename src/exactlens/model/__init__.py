"""The hooked model: config, positional features, components, initializer, stacked runs, save/load, exports."""

from exactlens.model.config import ExactConfig
from exactlens.model.stacked import StackedRuns
from exactlens.model.transformer import ExactTransformer

__all__ = ["ExactConfig", "ExactTransformer", "StackedRuns"]

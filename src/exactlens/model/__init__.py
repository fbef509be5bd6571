"""The hooked model: config, positional features, components, save/load, exports."""

from exactlens.model.config import ExactConfig
from exactlens.model.transformer import ExactTransformer

__all__ = ["ExactConfig", "ExactTransformer"]

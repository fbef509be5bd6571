"""exactlens: the hand-built transformers of the theory literature as hooked TransformerLens models."""

from exactlens.errors import ExactLensError
from exactlens.model import ExactConfig, ExactTransformer

__version__ = "0.1.0"

__all__ = ["ExactConfig", "ExactLensError", "ExactTransformer", "__version__"]

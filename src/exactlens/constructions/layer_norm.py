"""Old path of the Chiang & Cholak layer-norm transforms (pinned by tests/test_compat.py); they live in
exactlens.constructions.cookbook.layer_norm with the Cookbook's layer-norm recipes."""

from exactlens.constructions.cookbook.layer_norm import append_confidence_layer, confidence_scale, double_for_post_ln

__all__ = ["append_confidence_layer", "confidence_scale", "double_for_post_ln"]

"""Circuits: the edge-level graph of a model, its ground-truth circuit, ablations, and circuit
discovery scored against the ground truth."""

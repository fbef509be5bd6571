"""Causal alignment by distributed alignment search (DAS; Geiger, Wu, Icard, Potts & Goodman 2024).

A probe says where a variable is *readable*; an intervention on the right subspace says the model
*uses* it there. For a high-level variable V, a site S of the trained model (``hook_resid_pre``,
``hook_attn_out``, ``hook_resid_mid``, ``hook_mlp_out``, ``hook_resid_post``) and a set of positions
(the readout position, or every position), DAS learns an orthonormal basis Q [d_model, k] of a
k-dimensional subspace such that the interchange intervention

    h' = h_base + ((h_source - h_base) Q) Q^T        (at S, at the chosen positions)

makes the trained model give the *counterfactual* answer: what the high-level model answers on
the base input with V set to its value on the source input. Q is fitted by gradient descent on the
task kind's loss (cross-entropy; squared error for regression) against the counterfactual answers,
the model frozen; k in 1..max_dim is chosen on validation pairs; the interchange-intervention
accuracy (IIA) is measured on held-out test pairs.

High-level variables come from two places:

* the task's named causal variables (``Task.variables()`` with a known effect): the counterfactual
  is ``variable.counterfactual(base, source)``, e.g. FIRST with w_1 taken from the source word;
* the exact circuit's residual labels (features it computes, e.g. ``k/n``): the counterfactual is the
  exact model's own decision when that one residual dimension is swapped at the site where the
  label is settled (at the readout position for labels only the unembedding reads).

``iia`` counts the pairs (per target position for per-position tasks) where the intervened trained
model decides the counterfactual answer; ``iia_changed`` only those whose counterfactual answer
differs from the base answer (elsewhere a model that ignores V also scores 1). Two baselines in the
same run: a random orthonormal subspace of the same dimension (``random_iia_changed``) and the same
fit on an untrained model of the same shape (``untrained_iia_changed``, at the row's dimension).
Regression answers are decided by the nearest value among the answers of the batch.

Fits are trained together: the fits (variables x dims x starts) of a group of sites are stacked along
the batch, each row patched with its own Q at its own site, so one forward from the earliest site's
layer on serves them all (:func:`fit_sites`; k by increasing size, a larger k only where a smaller one
is below 1 - DIM_TOLERANCE on validation pairs).

The package's modules are the steps, each readable alone: :mod:`.variables` (what is aligned),
:mod:`.pairs` (on which words), :mod:`.patch` (how a subspace is swapped), :mod:`.starts` and
:mod:`.directions` (where fits start), :mod:`.fit`, :mod:`.score`, :mod:`.localization`,
:mod:`.verdicts` and :mod:`.table` (the rows and summary of the diff).
"""

from exactlens.analysis.diff.alignment.fit import Settings
from exactlens.analysis.diff.alignment.table import alignment_table, untrained_copy

__all__ = ["Settings", "alignment_table", "untrained_copy"]

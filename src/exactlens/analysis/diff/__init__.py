"""Circuit diff: a trained model against an exact construction, on the same words, through hooks.

``diff(trained, against)`` runs both models on words of the construction's task at a range of
lengths and compares them five ways (each a part of the returned JSON-ready dict), whatever the
task's kind, depth, width, head count, normalization or attention weighting of either model:

* ``behaviour``: accuracy of each model and how often their decisions agree, per length
  (per position for prediction tasks; MSE and R^2 for regression) (:mod:`.behaviour`).
* ``probes``: for every residual label of the exact model (a named feature such as ``k/n``) and
  every hook site of the trained model, the held-out R^2 of a ridge probe that reads the feature's
  exact value from the trained activations (:mod:`.probes`).
* ``attention``: per-head pattern distances, an optimal matching of trained heads to exact heads,
  and the attention from the readout position to the first symbol (:mod:`.attention`).
* ``weights``: QK and OV circuits of matched heads compared after mapping the trained residual
  basis onto the exact one; singular-value spectra (:mod:`.weights`).
* ``interventions``: interchange interventions along the probe direction of each feature, scored
  against what the exact circuit does under the same intervention (:mod:`.interventions`).
* ``alignment``: distributed alignment search: for every causal variable of the task and every
  computed residual label of the exact circuit, at every site and position set of the trained
  model, a learned subspace whose interchange gives the counterfactual answer; interchange-
  intervention accuracy on held-out pairs beside a random subspace and an untrained model
  (:mod:`.alignment`).
* ``circuit``: the trained model's circuit found by a discovery method (EAP by default) against the
  exact circuit read off the construction's weights: node and edge overlap after the head matching,
  AUROC of the trained scores, and the same method on the exact model as a check (:mod:`.circuit`).

The trained side is an :class:`~exactlens.model.ExactTransformer`, a checkpoint directory, a
construction name (two constructions of one task, e.g. palindrome vs palindrome-hash), or any
model with TransformerLens hook names and a ``cfg`` (e.g. a TransformerLens 4 ``TransformerBridge``).
Both models must answer the same task with the same vocabulary (same token ids are fed to both);
otherwise the diff stops with one line naming both.

The options are one request (:class:`~.request.DiffRequest`: the command line's flags, ``el.diff``'s and
``diff``'s keyword arguments); each part is declared once, one module of :mod:`.parts`, with what it needs
(the words both models ran, the probe fits, the head matching), the sections and summary keys it adds, and
its text and page section; the
orchestrator (:mod:`.orchestrator`) runs the steps the chosen parts need, in the order their needs give.
No part imports the orchestrator. Light at import: the names below load their modules when first used.
"""

from exactlens.analysis.diff.parts import PARTS, Part
from exactlens.analysis.diff.request import DiffRequest
from exactlens.lazy import lazy_names

_WHERE = {  # loaded when first used (torch): the command line reads PARTS and DiffRequest without it
    "DEFAULT_LENGTHS": "runs", "resolve_trained": "runs", "diff": "orchestrator", "behaviour_table": "behaviour",
    "probe_table": "probes",
}

__all__ = ["DEFAULT_LENGTHS", "PARTS", "DiffRequest", "Part", "behaviour_table", "diff", "probe_table",
           "resolve_trained"]


__getattr__, __dir__ = lazy_names(__name__, _WHERE)

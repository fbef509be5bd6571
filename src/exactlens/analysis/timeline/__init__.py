"""Circuit formation: a run's checkpoints, each compared with an exact construction, and when (and in what
order) the trained model becomes the exact circuit (docs/formation.md).

``timeline(run, against, ...)`` runs the diff (exactlens.analysis.diff) on every checkpoint of ``run`` (a
run directory, a train result, or a list of models, checkpoint directories, state dicts or TransformerLens
models) and returns a JSON-ready dict:

* ``checkpoints``: one row per checkpoint: ``step``, ``epoch``, ``accuracy`` and ``agreement`` (with the exact
  model) on the compared lengths, ``long_accuracy`` on longer lengths, ``probes`` ({label: {r2, site}}),
  ``verdicts`` (the diff's ``summary.verdicts``), ``alignment`` (each DAS row in short), ``attention``
  (``tv_distance`` per matched head, ``cls_to_first``), ``circuit_overlap`` (edge Jaccard and AUROC between
  components, so that a post-LN model's norm chains meet a norm-free construction's edges; node Jaccard),
  ``seconds``; a field that is null has its reason in ``reasons``.
* ``events`` (:mod:`.events`): per variable the first step from which it is computed and stays so, the
  steps where accuracy reaches 0.99 on the compared and on the long lengths, the step where the circuit
  overlap reaches its final value, and their ``order`` in one sentence.

The words, the exact model's runs, the alignment's pairs and the exact circuit are computed once; each
checkpoint's DAS fit starts from the previous checkpoint's subspace (``das_warm_steps`` Adam steps instead
of ``das_steps``). Light at import: the names below load their modules when first used. The figure is
exactlens.viz.timeline's.
"""

from exactlens.analysis.timeline.request import DEFAULT_PARTS, TimelineRequest
from exactlens.lazy import lazy_names

_WHERE = {"timeline": "build", "checkpoint_row": "build", "events": "events", "order_sentence": "events",
          "sources_of": "sources"}

__all__ = ["DEFAULT_PARTS", "TimelineRequest", "checkpoint_row", "events", "order_sentence", "sources_of",
           "timeline"]


__getattr__, __dir__ = lazy_names(__name__, _WHERE)

"""Circuit part of the diff: the trained model's circuit as a discovery method finds it, compared
with the exact construction's circuit read off its weights (the ground truth).

Both models run the task's words at the diff's lengths. The comparison after the node map (heads
through the attention part's optimal one-to-one matching, by (layer, head) when attention was not
compared) is exactlens.analysis.circuit.correspond's: ``edges`` (with ``between_components``) and
``nodes``. Added here: ``method_check``, the same method on the exact model scored against its own
circuit, so that a low overlap can be told apart from a method that misses the exact circuit too.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from exactlens.analysis.circuit.ablation import mark_constant, model_reader
from exactlens.analysis.circuit.correspond import compare_with_circuit
from exactlens.analysis.circuit.discovery import discover
from exactlens.analysis.circuit.evaluate import shared_longest, word_batches
from exactlens.analysis.circuit.graph import model_graph
from exactlens.analysis.circuit.scoring import score_discovery
from exactlens.analysis.circuit.truth import derive_circuit
from exactlens.errors import ExactLensError
from exactlens.model import ExactTransformer

DEFAULT_METHOD = "eap"  # one forward and backward pass per length: affordable at every diff length


def circuit_part(trained, exact, lengths: Sequence[int], words: int, seed: int,
                 matching: list[dict[str, Any]] | None, method: str = DEFAULT_METHOD,
                 granularity: str = "head", ablation: str = "resample", carry: dict[str, Any] | None = None
                 ) -> dict[str, Any]:
    """The ``circuit`` part of the diff JSON (module docstring); ``available`` is False, with the
    reason, when the trained model is not an ExactTransformer (discovery runs edge by edge on its
    components). The method, granularity and ablation are the request's, checked there
    (exactlens.analysis.diff.request). ``carry``: a timeline's shared values; the exact side (its circuit and
    the method's check on it) is computed for the first model and reused."""
    head = {"method": method, "granularity": granularity, "ablation": ablation}
    if not isinstance(trained, ExactTransformer):
        return {**head, "available": False,
                "reason": f"circuit discovery runs edge by edge on ExactTransformer components; the trained "
                          f"model is a {type(trained).__name__}"}
    t_graph, e_graph = model_graph(trained, granularity), model_graph(exact, granularity)
    try:  # the same words for both models: the task's words per length, drawn with the same seed
        t_batches = word_batches(trained, t_graph, lengths, words, seed, ablation, shared_longest(trained, exact))
    except ExactLensError as error:  # e.g. no length with two words to resample from
        return {**head, "available": False, "reason": str(error)}
    key = ("circuit_exact", tuple(lengths), words, seed, method, granularity, ablation,
           shared_longest(trained, exact))
    carry = {} if carry is None else carry
    if key not in carry:
        e_batches = word_batches(exact, e_graph, lengths, words, seed, ablation, shared_longest(trained, exact))
        truth = mark_constant(derive_circuit(exact, granularity), e_batches, exact)
        check = score_discovery(discover(exact, e_graph, e_batches, method), truth).to_dict()
        check.pop("roc")
        carry[key] = (truth, check)
    truth, check = carry[key]
    found = discover(trained, t_graph, t_batches, method)
    return {
        **head, "available": True, "threshold": found.threshold, "seconds": round(found.seconds, 3),
        "lengths": [int(b.tokens.shape[1]) - model_reader(trained).task.n_specials for b in t_batches],
        "words": sum(len(b.tokens) for b in t_batches),
        **compare_with_circuit(t_graph, found, truth, matching),
        "trained_nodes": t_graph.nodes,
        "trained_graph_edges": [e.name for e in t_graph.edges],
        "exact_circuit": truth.to_dict(),
        "method_check": check,
        "details": found.details,
    }

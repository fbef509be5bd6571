"""What SIIT training (exactlens.train.siit) reads of the analysis layer: the exact side of a construction, its
variables, the (base, source) pairs, the ground-truth circuit and the decision comparison.

Training sits below analysis, so exactlens.train.siit imports none of this: the layer above provides it (the
package ``exactlens`` names it when imported: ``exactlens.lazy.provide("siit_side", ...)``) and SIIT finds it with
``exactlens.lazy.provided("siit_side")``, imported on first use."""

from __future__ import annotations

from types import SimpleNamespace

from exactlens.analysis.circuit.truth import derive_circuit
from exactlens.analysis.diff.alignment.pairs import make_pairs
from exactlens.analysis.diff.alignment.variables import TIED, exact_variables
from exactlens.analysis.diff.probes import feature_scopes, probe_table
from exactlens.analysis.diff.runs import make_side, run_exact, same_decisions, with_trained

__all__ = ["SIDE"]

SIDE = SimpleNamespace(
    TIED=TIED, derive_circuit=derive_circuit, exact_variables=exact_variables, feature_scopes=feature_scopes,
    make_pairs=make_pairs, make_side=make_side, probe_table=probe_table, run_exact=run_exact,
    same_decisions=same_decisions, with_trained=with_trained,
)
"""The names SIIT uses, each the analysis layer's own function or constant."""

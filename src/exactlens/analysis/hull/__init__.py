"""Unselectable keys (Brody, Alon & Yahav 2023), one module per stage; the check itself is :mod:`.keys`.

Public names are those of :mod:`.keys` (imported on first use, so that :mod:`.request` loads no numpy at
``exactlens --help``) (``selectable_keys`` and its results); the per-layer analysis of a
model is :mod:`.model`, the random-keys grid :mod:`.random`. Imports run one way inside the package:
``products`` (torch matrix products) <- ``solver`` (``HullSolver``: one check's state, the LPs every method
shares) <- ``scores`` <- ``columns`` <- ``fast`` (the fast method's stages; ``gram``: of the key array)
<- ``keys`` (the API) <- ``model``, ``random``.
"""

from exactlens.lazy import lazy_names

__all__ = ["METHODS", "KeyCertificate", "SelectabilityResult", "layer_norm_geometric", "layer_norm_projection",
           "selectable_keys"]  # defined in .keys, imported on first use: .request stays light (no numpy)

__getattr__, __dir__ = lazy_names(__name__, dict.fromkeys(__all__, "keys"), submodules=True)

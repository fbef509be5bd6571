"""Unselectable keys (Brody, Alon & Yahav 2023), one module per stage; the check itself is :mod:`.keys`.

Public names are those of :mod:`.keys` (``selectable_keys`` and its results); the per-layer analysis of a
model is :mod:`.model`, the random-keys grid :mod:`.random`. Imports run one way inside the package:
``products`` (torch matrix products) <- ``solver`` (``HullSolver``: one check's state, the LPs every method
shares) <- ``scores`` <- ``columns`` <- ``fast`` (the fast method's stages; ``gram``: of the key array)
<- ``keys`` (the API) <- ``model``, ``random``.
"""

from exactlens.analysis.hull.keys import *  # noqa: F403 - the public names are keys.__all__
from exactlens.analysis.hull.keys import __all__  # noqa: F401

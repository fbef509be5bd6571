"""The built-in constructions: one registry module per paper (or recipe family).

Importing a module registers its entries; adding a paper is one line here.
"""

from exactlens.constructions import (
    catalog_chiang_cholak,  # noqa: F401
    catalog_cookbook,  # noqa: F401
    catalog_nowak,  # noqa: F401
    catalog_shin_matzinger,  # noqa: F401
)

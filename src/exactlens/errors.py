"""The one exception type exactlens raises for bad input."""


class ExactLensError(ValueError):
    """Bad input to exactlens: the message names what was wrong and what is allowed."""

"""The one exception type exactlens raises for bad input."""


def one_line(text: str) -> str:
    """A message on one line: its non-blank lines, stripped, joined by '; '."""
    return "; ".join(line.strip() for line in text.strip().splitlines() if line.strip())


class ExactLensError(ValueError):
    """Bad input to exactlens: the message names what was wrong and what is allowed, on one line (a message
    built from another error's several lines is joined into one)."""

    def __init__(self, *args: object) -> None:
        if len(args) == 1 and isinstance(args[0], str) and "\n" in args[0]:
            args = (one_line(args[0]),)
        super().__init__(*args)

"""The one exception type bnfold raises for bad input or bad options."""

from __future__ import annotations


class BnfoldError(ValueError):
    """Invalid input IR, an unreadable file, or an option that makes no sense.

    A `ValueError`, so generic handlers keep working. `location` is where the
    problem is (``file:line:col``, a file name, or an option such as
    ``--disable``), `message` says what is wrong and what to do. ``str(e)`` is
    the complete user-facing line, ``location: error: message``; a message
    that is already formatted MLIR diagnostics (one or more located lines) is
    passed with ``preformatted=True`` and printed as it is.

        >>> str(BnfoldError("unknown pattern 'x'", location="--disable"))
        "--disable: error: unknown pattern 'x'"
    """

    def __init__(self, message: str, *, location: str | None = None,
                 preformatted: bool = False) -> None:
        self.message = message
        self.location = location
        self.preformatted = preformatted
        super().__init__(self.format())

    def format(self) -> str:
        if self.preformatted:
            return self.message
        return f"{self.location}: error: {self.message}" if self.location else \
            f"error: {self.message}"

    def __str__(self) -> str:
        return self.format()

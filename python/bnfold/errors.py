"""The one exception type bnfold raises for bad input or bad options."""

from __future__ import annotations


class BnfoldError(Exception):
    """Invalid input IR, an unreadable file, or an option that makes no sense.

    The message is complete and user-facing: it names the file and location
    (``file:line:col: error: ...``) where there is one. The CLI prints it and
    exits 1; the Python API lets it propagate.
    """

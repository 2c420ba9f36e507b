"""The jax/jaxlib range bnfold supports, checked when bnfold is imported.

jaxlib's MLIR Python bindings change between minor releases (0.8.3's
`RewritePatternSet.add` takes other arguments), so an unsupported jaxlib
fails at import with the range and the command that fixes it, instead of an
"internal error" later.
"""

from __future__ import annotations

import re

# [low, high): CI tests 0.9.0 and 0.10.2; 0.11.2 passed the suite on a lent GPU machine (docs)
SUPPORTED = ((0, 9), (0, 12))


def check(version: str) -> None:
    """Raises ImportError naming the supported range for an unsupported jaxlib."""
    parts = tuple(int(p) for p in re.findall(r"\d+", version)[:2])
    (lo_major, lo_minor), (hi_major, hi_minor) = SUPPORTED
    if not SUPPORTED[0] <= parts < SUPPORTED[1]:
        spec = f">={lo_major}.{lo_minor},<{hi_major}.{hi_minor}"
        raise ImportError(
            f"bnfold supports jax/jaxlib {lo_major}.{lo_minor} to {hi_major}.{hi_minor - 1} "
            f"(tested 0.9.0 and 0.10.2 in CI, 0.11.2 once), not jaxlib {version}: "
            f"pip install 'jax{spec}' 'jaxlib{spec}'")


def check_installed() -> None:
    from jaxlib import version

    check(version.__version__)

"""The rewrites, one module each, in the order the pipeline runs them.

Each module has a kebab-case `NAME` (used by `--disable`) and a
`DESCRIPTION`; folding patterns expose pure `match` / `plan` functions and an
`apply` that only creates ops and redirects the uses of its root.
"""

from bnfold.patterns import backward_affine, expand_batch_norm, forward_affine, inline_calls

PATTERNS = (inline_calls, backward_affine, forward_affine, expand_batch_norm)

__all__ = ["PATTERNS", "backward_affine", "expand_batch_norm", "forward_affine", "inline_calls"]

"""The rewrite patterns, in the order the pipeline runs them."""

from bnfold.patterns.backward_affine import BackwardAffine
from bnfold.patterns.expand_batch_norm import ExpandBatchNorm
from bnfold.patterns.forward_affine import ForwardAffine

PATTERNS = (BackwardAffine, ForwardAffine, ExpandBatchNorm)
OPT_IN = frozenset({"expand-batch-norm"})

__all__ = ["PATTERNS", "OPT_IN", "BackwardAffine", "ExpandBatchNorm", "ForwardAffine"]

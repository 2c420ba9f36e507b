"""Why a pattern does not rewrite: a code for programs, a message for people.

Matchers and planners return a `Refusal` instead of raising; the driver
hands it to the pattern that refused, which notes it for the report. Control
flow branches on `code`, never on the message text:

    >>> r = Refusal(Code.PARAMETER, "the mean is function argument %arg3; bind parameters first")
    >>> r.code is Code.PARAMETER, str(r)
    (True, 'the mean is function argument %arg3; bind parameters first')

`Refusal.wrap` prefixes a message while keeping the code, so a low-level
reason ("operand is not constant") can say where it came from
("forward: operand is not constant").
"""

from __future__ import annotations

import enum
from typing import NamedTuple, TypeGuard, TypeVar


class Code(enum.Enum):
    """What kind of obstacle stopped a rewrite (stable names, in the JSON report)."""

    # The user can fix these by binding parameters (--bind-params).
    PARAMETER = "parameter-argument"  # a statistic or scale is a function argument
    KERNEL_ARGUMENT = "kernel-argument"  # the producer's kernel is a function argument
    NOT_CONSTANT = "not-constant"  # another operand is computed at run time
    LOOP = "loop-carried"  # a per-iteration value of a loop (lax.scan over stacked weights)
    # The graph around the normalization.
    NO_PRODUCER = "no-producer"  # nothing linear before (or after) it
    USERS = "users"  # a value has another live user
    AXIS = "axis"  # a constant varies along another axis, or a reshape splits the channels
    SYMBOLIC = "symbolic"  # a symbolic channel or spatial size
    NOT_FLOAT = "not-float"
    NOT_LINEAR = "not-linear"  # it feeds (or is fed by) a nonlinear op
    NONLINEAR_CONSUMER = "nonlinear-consumer"  # a normalized value has a use that is not a linear layer
    NOTHING = "nothing-to-do"
    # The precision contract.
    PRECISION = "precision"  # a kernel or bias would overflow, underflow or narrow
    NARROWING = "narrowing-convert"  # a rounding would move
    CANCELS = "shift-cancels"  # a forward-folded shift would cancel
    RANGE = "range"  # a value could overflow its type (equalized activations, a folded result)
    PADDING = "padding"  # a shift through zero padding that cannot be corrected
    # The laws of the ops between two layers (equalization, high-bias absorption).
    NO_LAW = "no-law"  # an op with no law in bnfold.laws
    NOT_HOMOGENEOUS = "not-homogeneous"
    FAN_OUT = "fan-out"
    ROLE = "role"  # an op out of place in high-bias absorption's ordered roles
    NO_STATISTICS = "no-statistics"
    BALANCED = "already-balanced"
    LIMIT = "limit"  # a size limit (huge splats, too many region ops, call depth)
    QUANTIZED = "quantized-kernel"  # integer weights (--quantize-weights) would become floats
    # Constant scales (fold-scale).
    SHARED_WEIGHT = "shared-weight"  # the weight is also read elsewhere (tied): a copy
    NORMALIZED = "normalized"  # a normalization would undo the scale, and no weight follows it


class Refusal(NamedTuple):
    """A pattern does not apply here: `code` says why in kind, `message` in words."""

    code: Code
    message: str

    def __str__(self) -> str:
        return self.message

    def wrap(self, prefix: str) -> Refusal:
        """The same refusal with `prefix: ` in front of its message."""
        return Refusal(self.code, f"{prefix}: {self.message}")


T = TypeVar("T")


def refused(value: T | Refusal) -> TypeGuard[Refusal]:
    """True when `value` is a `Refusal` (reads better than isinstance at call sites)."""
    return isinstance(value, Refusal)

"""drop-identity: remove a multiply by exactly 1 and an add of exactly 0.

torchax writes `a + b` as `a + b * 1` (aten::add.Tensor's `alpha`), and other
exporters leave `x * 1.0`, `x / 1.0`, `x + 0.0`, `x - 0.0` behind. Each is exact
(`x * 1` and `x / 1` are x for every x, NaN and -0 included; `x + 0` and `x - 0`
are x up to the sign of a zero, which compares equal and which XLA's algebraic
simplifier drops the same way), so the op goes and its reader reads x. Before:

    %one = stablehlo.constant dense<1.000000e+00> : tensor<f32>
    %ob = stablehlo.broadcast_in_dim %one, dims = [] : (tensor<f32>) -> tensor<1x16x96xf32>
    %m = stablehlo.multiply %b, %ob : tensor<1x16x96xf32>
    %r = stablehlo.add %a, %m : tensor<1x16x96xf32>

After:

    %r = stablehlo.add %a, %b : tensor<1x16x96xf32>

It runs before the folds, so none of them counts it as an affine of its own (it
used to fold backward into the linear layer before it, rewriting that kernel
to the same values) and a refusal names the real consumer (the residual `add`,
not the `* 1` before it). The report lists each removed op apart from the
folds (`"identities"`, kind `identity`); the fold count leaves them out.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, NamedTuple

from bnfold.graph import as_operation, defining_op, function_name
from bnfold.ir import ir, op_id
from bnfold.patterns.base import Pattern
from bnfold.report import Part, Section, block_of, columns

if TYPE_CHECKING:
    from bnfold.driver import Context
    from bnfold.rewriter import Rewriter

# op -> (the neutral constant, the operand positions it may take)
_NEUTRAL = {"stablehlo.multiply": (1.0, (0, 1)), "stablehlo.divide": (1.0, (1,)),
            "stablehlo.add": (0.0, (0, 1)), "stablehlo.subtract": (0.0, (1,))}
# What may stand between the neutral constant and the op (a splat, broadcast, converted).
_PASS_THROUGH = frozenset({"stablehlo.broadcast_in_dim", "stablehlo.reshape",
                           "stablehlo.convert"})
_WALKED = frozenset({"stablehlo.constant", *_NEUTRAL})  # the roots follow uses from constants
_SYMBOL = {"stablehlo.multiply": "* 1", "stablehlo.divide": "/ 1", "stablehlo.add": "+ 0",
           "stablehlo.subtract": "- 0"}


class Identity(NamedTuple):
    """An op that computes its input unchanged, and the input its readers take instead."""

    op: ir.Operation
    keep: ir.Value


class Removed(NamedTuple):
    """One removed identity op, for the report."""

    op: str  # its location
    op_name: str
    function: str
    kind: str = "identity"

    def to_json(self) -> dict[str, Any]:
        return {"op": self.op, "op_name": self.op_name, "kind": self.kind,
                "function": self.function, "block": block_of(self.op, self.function)}


class Identities(Section):
    """`"identities": [{"op", "op_name", "kind": "identity", ...}]` (when any): the ops
    removed as exact identities; not folds (the fold count and the `folds` list leave them
    out)."""

    order = 25

    def attributes(self, part: Part) -> dict[str, Any]:
        return {"identities": part.records}

    def to_json(self, part: Part) -> dict[str, Any]:
        """The key only where something was removed (reports of modules without any
        stay as they were)."""
        return {"identities": [r.to_json() for r in part.records]} if part.records else {}

    def table(self, part: Part) -> list[str]:
        """How many were removed, by block and spelling (the JSON report lists each one):

            identities removed  block                   count
            x * 1               model.layers.0          6
        """
        if not part.records:
            return []
        counts: dict[tuple[str, str], int] = {}
        for r in part.records:
            key = (f"x {_SYMBOL[r.op_name]}", block_of(r.op, r.function))
            counts[key] = counts.get(key, 0) + 1
        rows = [("identities removed", "block", "count")]
        rows += [(what, block, str(n)) for (what, block), n in counts.items()]
        return columns(rows)

    def summary(self, part: Part) -> str:
        if not part.records:
            return ""
        by: dict[str, int] = {}
        for r in part.records:
            by[r.op_name] = by.get(r.op_name, 0) + 1
        what = ", ".join(f"{n} x {_SYMBOL[name]}" for name, n in by.items())
        return f", removed {len(part.records)} identity op(s) ({what}; not folds)"


RECORDS = Identities()


def _is_splat(value: ir.Value, neutral: float) -> bool:
    """Whether `value` is one neutral scalar: a constant of one element (possibly broadcast,
    reshaped or converted: a convert of an exact 1 or 0 is exact), or a splat of the op's
    own shape, equal to `neutral`. A per-channel vector that happens to hold only 1s or 0s
    (a batch norm's never trained gamma, beta or mean, broadcast along the features) is
    that layer's parameter: left to the folds, which recover the statistics from it. Read
    from the attribute, never evaluated: a multiply of two large constants costs nothing."""
    owner = defining_op(value)
    while owner is not None and owner.name in _PASS_THROUGH:
        owner = defining_op(owner.operands[0])
    if owner is None or owner.name != "stablehlo.constant":
        return False
    shape = ir.RankedTensorType(owner.results[0].type).shape
    if math.prod(shape) != 1 and shape != ir.RankedTensorType(value.type).shape:
        return False
    return _splat_of(owner) == neutral


def _splat_of(constant: ir.Operation) -> float | None:
    """The one number a `stablehlo.constant` written as a splat holds, else None."""
    try:
        attr = ir.DenseElementsAttr(constant.attributes["value"])
    except ValueError:  # dense_resource and other forms: not a splat written inline
        return None
    except TypeError:  # complex elements: `x * (1 + 0j)` is not x (inf * 0 is NaN)
        return None
    if not attr.is_splat:
        return None
    found = getattr(attr.get_splat_value(), "value", None)
    return float(found) if isinstance(found, (int, float)) and not isinstance(found, bool) \
        else None


class DropIdentity(Pattern[ir.Operation, Identity, Identity]):
    """Removes every `x * 1`, `x / 1`, `x + 0`, `x - 0`."""

    def roots(self, ctx: Context) -> Iterable[ir.Operation]:
        """Every op of `_NEUTRAL` with an operand that may be a neutral splat, in walk
        order (definitions come before their uses): `match` checks which. Only a splat
        constant's attribute is read, and only the uses of the 0 and 1 splats (and of
        their broadcasts, reshapes and converts) are followed: most multiplies and adds of
        a model read activations and per-channel vectors."""
        walked = ctx.named_ops(_WALKED)
        pending = [op.result for name, op in walked
                   if name == "stablehlo.constant" and _splat_of(op) in (0.0, 1.0)]
        readers: set[int] = set()  # the ops of `_NEUTRAL` reading a neutral value
        while pending:
            for use in pending.pop().uses:
                user = as_operation(use.owner)
                if user is None:
                    continue
                name = user.name
                if name in _PASS_THROUGH and use.operand_number == 0:
                    pending.append(user.results[0])
                elif name in _NEUTRAL:
                    readers.add(op_id(user))
        if not readers:
            return []
        return [op for name, op in walked if name in _NEUTRAL and op_id(op) in readers]

    def match(self, ctx: Context, root: ir.Operation) -> Identity | None:
        neutral, positions = _NEUTRAL[root.name]
        operands = root.operands
        for index in positions:
            if _is_splat(operands[index], neutral):
                keep = operands[1 - index]
                if keep.type == root.results[0].type:  # always, for StableHLO's own types
                    return Identity(root, keep)
        return None

    def plan(self, ctx: Context, match: Identity) -> Identity:
        return match

    def apply(self, rewriter: Rewriter, plan: Identity) -> Identity:
        rewriter.replace_op(plan.op, [plan.keep])
        return plan

    def record(self, ctx: Context, plan: Identity, applied: Identity) -> None:
        ctx.ledger.add(Removed(ctx.ledger.location(plan.op), plan.op.name,
                               function_name(plan.op)))


PATTERN = DropIdentity()

"""cancel-negations (a toy pattern, in the tests only): the example of what a new pattern is.

It is one module -- the pattern, the options it adds and the records it reports -- plus
one registry line (tests/test_toy_pattern.py). Before:

    %n = stablehlo.negate %x : tensor<4xf32>
    %r = stablehlo.negate %n : tensor<4xf32>
    return %r : tensor<4xf32>

After (exact in every float type: negation only flips the sign bit):

    return %x : tensor<4xf32>

A pair whose inner negate has another live user is refused (both would stay).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from bnfold.driver import Context
from bnfold.graph import defining_op
from bnfold.ir import ir
from bnfold.patterns.base import Pattern
from bnfold.refusal import Code, Refusal
from bnfold.report import Part, Section, columns, missed
from bnfold.rewriter import Rewriter
from bnfold.schema import switch

OPTIONS = (switch("cancel_negations", "replace negate(negate(x)) by x"),)


@dataclass(frozen=True)
class Pair:
    outer: ir.Operation
    inner: ir.Operation


@dataclass
class Cancelled:
    """One pair of negations that cancelled."""

    outer: str  # locations
    inner: str

    def to_json(self) -> dict[str, Any]:
        return {"outer": self.outer, "inner": self.inner}


class CancelNegations(Pattern[ir.Operation, Pair, Pair]):
    def roots(self, ctx: Context) -> Iterable[ir.Operation]:
        found: list[ir.Operation] = []

        def visit(op: ir.Operation) -> ir.WalkResult:
            if op.operation.name == "stablehlo.negate":
                found.append(op.operation)
            return ir.WalkResult.ADVANCE

        for func in ctx.functions():
            func.walk(visit)
        return found

    def match(self, ctx: Context, root: ir.Operation) -> Pair | Refusal | None:
        inner = defining_op(root.operands[0])
        if inner is None or inner.name != "stablehlo.negate" or ctx.analysis.is_dead(root):
            return None
        users = len(ctx.analysis.live_users(inner.results[0]))
        if users != 1:
            return Refusal(Code.USERS, f"the inner negate has {users} users: both stay")
        return Pair(root, inner)

    def plan(self, ctx: Context, match: Pair) -> Pair:
        return match

    def apply(self, rewriter: Rewriter, plan: Pair) -> None:
        rewriter.replace_op(plan.outer, [plan.inner.operands[0]])

    def record(self, ctx: Context, plan: Pair, applied: None) -> None:
        ctx.ledger.add(Cancelled(ctx.ledger.location(plan.outer),
                                       ctx.ledger.location(plan.inner)))

    def refuse(self, ctx: Context, subject: ir.Operation | Pair, refusal: Refusal) -> None:
        ctx.ledger.add_refusal(subject if isinstance(subject, ir.Operation) else
                             subject.outer, refusal)


class CancelledNegations(Section):
    """`cancelled` and `not_cancelled`, when the pattern ran."""

    def attributes(self, part: Part) -> dict[str, Any]:
        return {"cancelled": part.records, "not_cancelled": part.refused}

    def to_json(self, part: Part) -> dict[str, Any]:
        return {"cancelled": [c.to_json() for c in part.records],
                "not_cancelled": [s.to_json() for s in part.refused]}

    def table(self, part: Part) -> list[str]:
        rows = [("cancelled", "outer", "inner")]
        rows += [(str(i), c.outer, c.inner) for i, c in enumerate(part.records, 1)]
        lines = columns(rows) if part.records else ["no negations cancelled"]
        return lines + missed("not cancelled", "op", part.refused)

    def summary(self, part: Part) -> str:
        return f", cancelled {len(part.records)} negation pair(s)"


RECORDS = CancelledNegations()
PATTERN = CancelNegations()

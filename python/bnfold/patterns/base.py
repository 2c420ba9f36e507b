"""The pattern interface every rewrite follows (MLIR's match/rewrite split, with the plan
as a value, as ONNX Runtime's SatisfyCondition/Apply):

    roots(ctx)          where to look, in program order (re-read as the IR changes)
    match(ctx, root)    pure: a Match, a Refusal (with a code), or None (not its business)
    plan(ctx, match)    pure, float64: a Plan (new constants, checked by the precision
                        contract), a Refusal, or None
    apply(rw, plan)     creates ops and replaces its root through the rewriter; returns
                        what `record` needs (nothing else changes the IR)
    record(ctx, p, a)   writes the pattern's own report record into the ledger
    refuse(ctx, s, r)   notes a refusal of subject `s` (a root or a match) for the report
    finish(ctx)         after the last root (e.g. drop helpers nothing calls any more)
    wants_inline(ctx, call)
                        whether the pattern needs to see through this call of a private
                        helper (inline-calls asks every enabled pattern before it runs)
    may_inline(ctx, callee)
                        a filter on the helper alone, asked once per helper and round:
                        False where no call of it can be one `wants_inline` accepts
    builds              the op names `apply` creates with builders (`stablehlo.AddOp(...)`);
                        None (the default): any op, so the driver walks the module again
                        before the next `Context.ops`. Copies made by `Rewriter.clone`
                        need no declaring: the rewriter notes them

`match` and `plan` read the IR and the analysis only; the driver's checking mode
(`bnfold.driver.CHECKING`, on in the test suite) fingerprints the IR around `roots`,
`match`, `plan` and `record` and fails on any change (tests/test_rules.py).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from bnfold.ir import ir
from bnfold.refusal import Refusal

if TYPE_CHECKING:
    from bnfold.driver import Context
    from bnfold.rewriter import Rewriter

Root = TypeVar("Root")
M = TypeVar("M")
P = TypeVar("P")


class Stage(enum.IntEnum):
    """When a pattern runs; every normalization gets its decision at the end of FOLD."""

    PREPARE = 0  # inline-calls
    FOLD = 1  # backward-affine, forward-affine
    LOWER = 2  # expand-batch-norm
    QUANTIZE = 3  # equalize, absorb-high-bias


class Pattern(Generic[Root, M, P]):
    """Base of every pattern: pure match and plan, apply through the rewriter. Its name,
    stage, options and report section are declared by its registry entry
    (`bnfold.patterns.Entry`), the one place that says them."""

    # What `apply` builds (see the module docstring): declared, the walk `Context.ops`
    # keeps serves later patterns that ask for other op names. The checking mode fails
    # an `apply` that creates an op outside it.
    builds: frozenset[str] | None = None

    def roots(self, ctx: Context) -> Iterable[Root]:
        raise NotImplementedError

    def match(self, ctx: Context, root: Root) -> M | Refusal | None:
        raise NotImplementedError

    def plan(self, ctx: Context, match: M) -> P | Refusal | None:
        raise NotImplementedError

    def apply(self, rewriter: Rewriter, plan: P) -> Any:
        raise NotImplementedError

    def record(self, ctx: Context, plan: P, applied: Any) -> None:
        """Writes what `apply` did to the ledger (nothing by default)."""

    def refuse(self, ctx: Context, subject: Root | M, refusal: Refusal) -> None:
        """Notes why `subject` was not rewritten (dropped by default: not its business)."""

    def finish(self, ctx: Context) -> None:
        """Runs after the last root."""

    def wants_inline(self, ctx: Context, call: ir.Operation, callee: ir.Operation) -> bool:
        """Whether this pattern needs to see through `call` (inline-calls asks)."""
        return False

    def may_inline(self, ctx: Context, callee: ir.Operation) -> bool:
        """Whether some call of `callee` may be one `wants_inline` accepts, judged on the
        helper alone (its ops, its arguments' uses): inline-calls asks once per helper and
        round, so the 150 calls of an activation helper cost a lookup each. It must hold
        wherever `wants_inline` does; the driver's checking mode asserts that."""
        return True

"""merge-bias: merge a forward fold's new bias with the affine steps after its producer.

A forward fold adds a bias after the producer; when the producer was already
followed by additive per-channel steps (a bias the backward fold could not
take because, before, they did not normalize on their own), the two would
stay separate and folding the output again would merge them. This folds
them now, backward, with the backward pattern's plan (any scale it finds
goes into the kernel, e.g. the -1 of `c - y`). Before:

    %y = stablehlo.dot_general %x, %w2 ...              // forward-folded producer
    %b = stablehlo.add %y, %bias_b                      // its new bias
    %r = stablehlo.reshape %b : ... -> tensor<2x1x2xf32>
    %o = stablehlo.add %r, %c_b                         // an existing bias after it

After:

    %y = stablehlo.dot_general %x, %w2 ...
    %b = stablehlo.add %y, %merged_b                    // bias + c, one add
    %o = stablehlo.reshape %b : ... -> tensor<2x1x2xf32>
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, NamedTuple

from bnfold import affine, chains
from bnfold.ir import ir
from bnfold.patterns.backward_affine import Applied, Plan, Source, build, plan_fold
from bnfold.patterns.base import Pattern
from bnfold.patterns.forward_affine import FORWARD_FOLDS
from bnfold.refusal import Refusal
from bnfold.report import Fold

if TYPE_CHECKING:
    from bnfold.driver import Context
    from bnfold.rewriter import Rewriter



class Match(NamedTuple):
    """A forward fold's producer and the affine chain after it (its new bias first)."""

    fold: Fold
    source: Source
    chain: chains.Chain


class Merge(NamedTuple):
    """The backward plan of the chain, and the forward fold it belongs to."""

    fold: Fold
    plan: Plan


class MergeBias(Pattern[tuple[Fold, ir.Operation], Match, Merge]):
    """Merges each forward fold's new bias with the affine steps after it."""


    def roots(self, ctx: Context) -> Iterable[tuple[Fold, ir.Operation]]:
        return [(fold, op) for fold, [op] in ctx.analysis.handed(FORWARD_FOLDS)]

    def match(self, ctx: Context, root: tuple[Fold, ir.Operation]) -> Match | None:
        fold, producer = root
        head = affine.extends(producer.results[0], ctx.analysis)
        if head is None:
            return None
        chain = chains.grow(head, ctx.analysis)
        if sum(1 for s in chain.steps if s.name not in affine.LAYOUT) < 2:
            return None  # the new bias alone: nothing to merge
        return Match(fold, Source(producer.results[0], (producer,)), chain)

    def plan(self, ctx: Context, match: Match) -> Merge | Refusal:
        found = plan_fold(match.source, match.chain, ctx.analysis, require_normalizing=False)
        return found if isinstance(found, Refusal) else Merge(match.fold, found)

    def apply(self, rewriter: Rewriter, plan: Merge) -> Applied:
        return build(rewriter, plan.plan)

    def record(self, ctx: Context, plan: Merge, applied: Applied) -> None:
        ctx.ledger.consume(plan.fold, [s.op for s in plan.plan.steps])
        for producer in applied.producers:
            ctx.ledger.fold_carried_by(plan.fold, producer)


PATTERN = MergeBias()

"""E[x] of a layer's input, from the folded batch norms before it (for bias correction).

A walk back from the value a layer reads, through each op by its mean law
(`bnfold.laws`), to the producers whose folded batch norm says what their
output looks like: a folded batch norm's pre-activation is N(beta, gamma^2 var
/ (var + eps)) per channel (`ledger.Statistics`: the mean as equalization and
high-bias absorption left it, the standard deviation its statistics imply), so
the producer's own result is N(mean - offset, deviation^2).
MobileNetV2's inverted residual, read backwards from the last convolution:

    %c1 = stablehlo.convolution(%x, %k1)       N(mean1 - offset1, dev1^2)     (statistics)
    %b1 = stablehlo.add %c1, %bias1_b          N(mean1, dev1^2)               (+ a constant)
    %r1 = stablehlo.clamp %zero, %b1, %six     E[clip(N, 0, 6)]               (clipped normal)
    %c2 = stablehlo.convolution(%r1, %k2)      <- E[x] of this layer: the clamp's mean
    %s  = stablehlo.add %c3b, %skip            E[a] + E[b]                    (a residual sum)

Unknown, with a reason: a function argument (the model's input), a producer
without statistics, an op without a law or whose law needs a distribution
the value no longer has (the mean of a max pool, an activation after a sum).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from bnfold import laws, producers
from bnfold.constants import Const
from bnfold.graph import defining_op
from bnfold.ir import format_location, ir
from bnfold.laws import Moments, Normal
from bnfold.refusal import Code, Refusal

if TYPE_CHECKING:
    from bnfold.driver import Context

# Values a run may visit (a residual stack reaches far back, every value once), and the
# longest chain of ops one walk may follow back (each is a Python call frame).
MAX_VALUES = 4096
MAX_DEPTH = 160


@dataclass
class Walk:
    """The moments of values, computed on demand and kept for the next layer of the run."""

    ctx: Context
    memo: dict[ir.Value, Moments | Refusal] = field(default_factory=dict)
    visited: int = 0
    depth: int = 0

    def moments(self, value: ir.Value) -> Moments | Refusal | None:
        """`laws.MeanEnv`: the moments of `value`, None for a constant."""
        if self.ctx.analysis.constant(value) is not None:
            return None
        found = self.memo.get(value)
        if found is None:
            self.visited += 1
            if self.visited > MAX_VALUES or self.depth >= MAX_DEPTH:
                return Refusal(Code.LIMIT, f"more than {MAX_DEPTH} ops (or {MAX_VALUES} values) "
                                           "back to the batch norms")
            self.depth += 1
            try:
                found = self._walk(value)
            finally:
                self.depth -= 1
            self.memo[value] = found
        return found

    def constant(self, value: ir.Value) -> Const | None:
        return self.ctx.analysis.constant(value)

    def _walk(self, value: ir.Value) -> Moments | Refusal:
        owner = defining_op(value)
        if owner is None:
            return Refusal(Code.NO_STATISTICS, "it reads a function argument (the model's input, "
                                               "or a value no batch norm describes)")
        if producers.is_producer(owner):
            return self._producer(owner)
        law = laws.law_of(owner)
        if isinstance(law, Refusal):
            if law.code is Code.NOT_HOMOGENEOUS:  # the scale law's words; a mean has its own
                return Refusal(Code.NO_LAW, f"{_where(owner)} has no mean law (the mean of "
                                            f"its output does not follow from its input's)")
            return law.wrap(_where(owner))
        if len(owner.results) != 1:
            return Refusal(Code.NO_LAW, f"{_where(owner)} has {len(owner.results)} results")
        found = law.mean(owner, self)  # it asks for the operands it reads (not a predicate)
        propagated = isinstance(found, Refusal) and any(
            found is self.memo.get(v) for v in owner.operands)
        return found.wrap(_where(owner)) if isinstance(found, Refusal) and not propagated \
            else found

    def _producer(self, op: ir.Operation) -> Moments | Refusal:
        stats = self.ctx.ledger.statistics(op)
        if stats is None and (why := self.ctx.ledger.no_statistics(op)) is not None:
            return Refusal(Code.NO_STATISTICS, f"{_where(op)}: {why}")
        if stats is None:
            return Refusal(Code.NO_STATISTICS, f"{_where(op)} has no batch-norm statistics (no "
                                               "folded batch norm describes its output)")
        at = stats.deviation_at_result()
        if at is None:
            return Refusal(Code.NO_STATISTICS, f"{_where(op)}: its mean varies over positions "
                                               "(high-bias absorption corrected its borders)")
        axis = producers.output_axis(op, self.ctx.analysis.evaluator)
        if axis is None or ir.RankedTensorType(op.results[0].type).shape[axis[0]] != at[0].size:
            return Refusal(Code.AXIS, f"{_where(op)}: its statistics do not match its channels")
        return Moments.of(axis[0], Normal.of(*at))


def _where(op: ir.Operation) -> str:
    where = format_location(op.location, None)
    return f"{op.name} at {'line ' + where[2:] if where.startswith('-:') else where}"

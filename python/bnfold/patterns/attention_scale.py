"""attention-scale: move a constant scalar scale of attention logits into the weight of Q.

`softmax(q k^T / sqrt(d))`: the scalar multiplies (or divides) the product of two
values computed at run time, or one of its operands before the product. A
dot_general is bilinear, `dot(q, k) * c == dot(q * c, k)`, and a scalar crosses
reshapes, transposes, widening converts and negation unchanged, and a bias add as
`(y + b) * c == y * c + b * c`. So the scale moves back along q to the first op
that can absorb it: a linear layer with a constant kernel (Wq times c, rounded
once), or a multiply by a constant (QK-norm's weight, a layer scale: that
constant times c), never into Wq past a normalization (a norm would undo it).
Before:

    %q = stablehlo.dot_general %x, %wq, contracting_dims = [2] x [0] ...
    %qh = stablehlo.reshape %q : (tensor<2x8x64xf32>) -> tensor<2x8x4x16xf32>
    %l = stablehlo.dot_general %qh, %kh, batching_dims = [0, 2] x [0, 2],
           contracting_dims = [3] x [3] ...
    %s = stablehlo.multiply %l, %c_0.25 ...

After:

    %wq2 = stablehlo.constant ...                  // wq * 0.25
    %q2 = stablehlo.dot_general %x, %wq2 ...
    %qh2 = stablehlo.reshape %q2 ...
    %l2 = stablehlo.dot_general %qh2, %kh ...      // replaces %s

Every value on the way must be read only by the next op on it (the scale would
otherwise reach another use). The laws are `bnfold.laws.SCALAR_LAWS`. Precision:
the kernel (or constant) is scaled in float64 and rounded once to its type: one
rounding of each weight in place of the original's rounding of each logit (exact
for a power of two: 1/sqrt(64), 1/sqrt(256)).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np

from bnfold import elements, laws, producers
from bnfold.analysis import Analysis
from bnfold.graph import defining_op, function_name
from bnfold.ir import format_location, ir
from bnfold.patterns.base import Pattern, Stage
from bnfold.patterns.rewrite import KernelRewrite, plan_kernel
from bnfold.refusal import Code, Refusal
from bnfold.report import Fold

if TYPE_CHECKING:
    from bnfold.driver import Context
    from bnfold.rewriter import Rewriter

NAME = "attention-scale"


@dataclass(frozen=True)
class Hop:
    """One op on the way back from the product to where the scale goes: `op`, the operand
    index the scaled value comes in at, and a constant operand it rescales (a bias)."""

    op: ir.Operation
    index: int
    bias: KernelRewrite | None = None


@dataclass(frozen=True)
class Match:
    scale_op: ir.Operation  # multiply / divide by the scalar
    factor: float  # what the value before scale_op is multiplied by
    product: ir.Operation | None  # the dot_general of q and k, when the scale follows it
    side: int  # the product's operand the scale moves into
    start: ir.Value  # where the walk starts (the product's operand, or scale_op's input)


@dataclass(frozen=True)
class Plan:
    match: Match
    end: ir.Operation  # the op that absorbs the scale
    end_constant: KernelRewrite  # its kernel or constant, times the factor
    hops: tuple[Hop, ...]  # from the end towards the product, in data-flow order


def _scalar(value: ir.Value, analysis: Analysis) -> float | None:
    const = analysis.constant(value)
    if const is None:
        return None
    array = np.asarray(const.array, dtype=np.float64)
    if array.size == 0 or not np.all(array == array.reshape(-1)[0]):
        return None
    scalar = float(array.reshape(-1)[0])
    return scalar if np.isfinite(scalar) and scalar != 0 else None


def _scale_of(op: ir.Operation, analysis: Analysis) -> tuple[ir.Value, float] | None:
    """(the scaled value, the factor) of a multiply / divide by a scalar constant."""
    if op.name == "stablehlo.multiply":
        for i in (0, 1):
            c = _scalar(op.operands[1 - i], analysis)
            if c is not None and analysis.constant(op.operands[i]) is None:
                return op.operands[i], c
    if op.name == "stablehlo.divide":
        c = _scalar(op.operands[1], analysis)
        if c is not None and analysis.constant(op.operands[0]) is None:
            return op.operands[0], 1.0 / c
    return None


def _runtime_product(op: ir.Operation | None, analysis: Analysis) -> bool:
    """A dot_general of two values computed at run time (attention's q k^T, or p v)."""
    return op is not None and op.name == "stablehlo.dot_general" and \
        not any(producers.is_constant(v, analysis.evaluator) for v in op.operands[:2])


def find(op: ir.Operation, analysis: Analysis) -> Match | None:
    """A scalar scale of an attention product (after it, or on an operand before it)."""
    found = _scale_of(op, analysis)
    if found is None or factor_is_trivial(found[1]):
        return None
    value, factor = found
    owner = defining_op(value)
    if _runtime_product(owner, analysis) and analysis.live_users(value) == [op]:
        assert owner is not None
        return Match(op, factor, owner, 0, owner.operands[0])
    user = analysis.sole_live_user(op.results[0])
    if _runtime_product(user, analysis):
        assert user is not None
        side = 0 if user.operands[0] == op.results[0] else 1
        return Match(op, factor, None, side, value)
    return None


def factor_is_trivial(factor: float) -> bool:
    return factor == 1.0


def _walk(m: Match, start: ir.Value, analysis: Analysis) -> Plan | Refusal:
    """From `start` back to the op that absorbs the factor, by `laws.SCALAR_LAWS`."""
    hops: list[Hop] = []
    value = start
    reader = m.product if m.product is not None else m.scale_op
    for _ in range(64):
        if analysis.live_users(value) != [reader]:
            return Refusal(Code.FAN_OUT, f"attention-scale: a value on the way back to the "
                                         f"layer that would absorb the scale has other uses "
                                         f"(at {_where(reader)})")
        op = defining_op(value)
        if op is None:
            return Refusal(Code.NO_PRODUCER, "attention-scale: the scaled value is a function "
                                             "argument")
        law = laws.scalar_law(op, analysis.constant)
        if isinstance(law, Refusal):
            return law.wrap("attention-scale")
        if law.ends:
            end = _end_constant(op, law.index, m.factor, analysis)
            if isinstance(end, Refusal):
                return end.wrap("attention-scale")
            hops.reverse()
            return Plan(m, op, end, tuple(hops))
        bias: KernelRewrite | None = None
        if law.bias is not None:
            scaled = _constant(op, law.bias, m.factor, analysis)
            if isinstance(scaled, Refusal):
                return scaled.wrap("attention-scale")
            bias = scaled
        hops.append(Hop(op, law.index, bias))
        reader, value = op, op.operands[law.index]
    return Refusal(Code.LIMIT, "attention-scale: more than 64 ops between the scale and a layer")


def _constant(op: ir.Operation, index: int, factor: float, analysis: Analysis
              ) -> KernelRewrite | Refusal:
    """Operand `index` of `op` (a constant) times `factor`, rounded once to its type."""
    value = op.operands[index]
    ty = elements.tensor_type(value)
    dtype = elements.numpy_dtype(ty.element_type) if ty is not None else None
    if dtype is None:
        return Refusal(Code.NOT_FLOAT, f"{value.type} is not a static float tensor")
    kernel = producers.kernel(value, dtype, analysis.evaluator, op.name.removeprefix("stablehlo."))
    if isinstance(kernel, Refusal):
        return kernel
    return plan_kernel(kernel, np.full((1,) * len(kernel.shape), factor), index)


def _end_constant(op: ir.Operation, index: int, factor: float, analysis: Analysis
                  ) -> KernelRewrite | Refusal:
    """The end's constant operand times the factor: a layer's kernel (in the type its
    product computes in) or a multiplied constant (divided, for a divide)."""
    if producers.is_producer(op):
        act = 1 - index
        compute = elements.numpy_dtype(ir.RankedTensorType(op.operands[act].type).element_type)
        if compute is None:
            return Refusal(Code.NOT_FLOAT, "the layer's input is not a float tensor")
        kernel = producers.kernel(op.operands[index], compute, analysis.evaluator,
                                  op.name.removeprefix("stablehlo."))
        if isinstance(kernel, Refusal):
            return kernel
        return plan_kernel(kernel, np.full((1,) * len(kernel.shape), factor), index)
    if op.name == "stablehlo.divide":
        return _constant(op, index, 1.0 / factor, analysis)
    return _constant(op, index, factor, analysis)


def plan(m: Match, analysis: Analysis) -> Plan | Refusal:
    """Along q (the product's first operand) or, failing that, along k."""
    first = _walk(m, m.start, analysis)
    if not isinstance(first, Refusal) or m.product is None:
        return first
    other = replace(m, side=1, start=m.product.operands[1])
    second = _walk(other, other.start, analysis)
    return first if isinstance(second, Refusal) else second


def _where(op: ir.Operation) -> str:
    return format_location(op.location)


@dataclass(frozen=True)
class Applied:
    end: ir.Operation


def build(rewriter: Rewriter, p: Plan) -> Applied:
    """The end with its scaled constant, the hops replayed on it, then the product."""
    end = p.end
    with ir.InsertionPoint(end):
        constant = p.end_constant.build(end.location)
        new_end = rewriter.clone(end, {p.end_constant.operand: constant})
    value = new_end.results[0]
    for hop in p.hops:
        operands = {hop.index: value}
        if hop.bias is not None:
            with ir.InsertionPoint(hop.op):
                operands[hop.bias.operand] = hop.bias.build(hop.op.location)
        value = rewriter.clone(hop.op, operands).results[0]
    m = p.match
    if m.product is not None:
        product = rewriter.clone(m.product, {m.side: value})
        rewriter.replace_op(m.scale_op, [product.results[0]], successor=product)
    else:
        rewriter.replace_op(m.scale_op, [value])
    return Applied(new_end)


class AttentionScale(Pattern[ir.Operation, Match, Plan]):
    """Moves a scalar scale of an attention product into Wq (or the q-norm's weight)."""

    NAME = NAME
    STAGE = Stage.FOLD

    def roots(self, ctx: Context) -> Iterable[ir.Operation]:
        found: list[ir.Operation] = []

        def visit(op: ir.Operation) -> ir.WalkResult:
            op = op.operation
            if op.name in ("stablehlo.multiply", "stablehlo.divide"):
                found.append(op)
            return ir.WalkResult.ADVANCE

        for func in ctx.functions():
            func.walk(visit)
        for op in found:
            if not ctx.analysis.is_dead(op):
                yield op

    def match(self, ctx: Context, root: ir.Operation) -> Match | None:
        return find(root, ctx.analysis)

    def plan(self, ctx: Context, match: Match) -> Plan | Refusal:
        return plan(match, ctx.analysis)

    def refuse(self, ctx: Context, subject: ir.Operation | Match, refusal: Refusal) -> None:
        if isinstance(subject, Match):
            ctx.ledger.refuse(subject.scale_op, refusal)

    def apply(self, rewriter: Rewriter, plan: Plan) -> Applied:
        return build(rewriter, plan)

    def record(self, ctx: Context, plan: Plan, applied: Applied) -> None:
        m, ledger = plan.match, ctx.ledger
        end = applied.end
        what = "kernel" if producers.is_producer(end) else "constant"
        fold = Fold(
            id="", producer=ledger.location(end), producer_op=end.name,
            norm=ledger.location(m.scale_op), norm_op=m.scale_op.name, form="scale",
            direction="backward", channels=1, ops=[], function=function_name(end),
            params={"scale": np.array([m.factor])},
            kernel_rounding=plan.end_constant.worst_relative_rounding, kind="affine",
            note=f"attention scale {m.factor:.6g} moved into the {what} of the "
                 f"{end.name.removeprefix('stablehlo.')} at {ledger.location(end)}")
        ledger.fold(fold, [m.scale_op], producer=end if producers.is_producer(end) else None)


PATTERN = AttentionScale()

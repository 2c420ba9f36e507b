"""expand-batch-norm: rewrite batch_norm_inference as elementwise ops.

For back ends without a batch-norm op and for the StableHLO reference
interpreter, which aborts the process on batch_norm_inference. With constant
statistics the scale and shift are folded (float64, rounded once):

    %y = "stablehlo.batch_norm_inference"(%x, %g, %b, %m, %v)
           {epsilon = 1.0e-05 : f32, feature_index = 3 : i64} : (...) -> tensor<1x8x8x4xf32>
  ->
    %s = stablehlo.constant dense<[...]> : tensor<4xf32>        // g / sqrt(v + eps)
    %t = stablehlo.constant dense<[...]> : tensor<4xf32>        // b - m * s
    %y = stablehlo.add (stablehlo.multiply %x, bcast(%s)), bcast(%t)

Otherwise it emits the specification's decomposition with the operands as
they are: `(x - bcast(m)) / sqrt(bcast(v) + eps) * bcast(g) + bcast(b)`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from bnfold import elements
from bnfold.affine import Affine, Step, apply
from bnfold.ir import ir, stablehlo
from bnfold.patterns.base import Pattern
from bnfold.report import Part, Section

if TYPE_CHECKING:
    from bnfold.driver import Context
    from bnfold.rewriter import Rewriter



class Plan(NamedTuple):
    """A batch norm to expand: with its folded scale and shift, or (None) as the spec spells it."""

    op: ir.Operation
    fit: Affine | None


class ExpandBatchNorm(Pattern[ir.Operation, ir.Operation, Plan]):
    """Expands every static float batch_norm_inference that is still there."""


    def roots(self, ctx: Context) -> Iterable[ir.Operation]:
        found: list[ir.Operation] = []

        def visit(op: ir.Operation) -> ir.WalkResult:
            if op.operation.name == "stablehlo.batch_norm_inference":
                found.append(op.operation)
            return ir.WalkResult.ADVANCE

        for func in ctx.functions():
            func.walk(visit)
        return found

    def match(self, ctx: Context, root: ir.Operation) -> ir.Operation | None:
        ty = elements.tensor_type(root.results[0])
        if ty is None or not elements.is_float(ty.element_type) or ctx.analysis.is_dead(root):
            return None
        return root

    def plan(self, ctx: Context, match: ir.Operation) -> Plan:
        ty = ir.RankedTensorType(match.results[0].type)
        feature = ir.IntegerAttr(match.attributes["feature_index"]).value
        fit = apply(Affine.identity(tuple(ty.shape), feature), Step(match, 0), ctx.analysis.evaluator)
        return Plan(match, fit if isinstance(fit, Affine) else None)

    def apply(self, rewriter: Rewriter, plan: Plan) -> None:
        op = plan.op
        with ir.InsertionPoint(op), op.location:
            value = _folded(op, plan.fit) if plan.fit is not None else _spec_decomposition(op)
        rewriter.replace_op(op, [value])

    def record(self, ctx: Context, plan: Plan, applied: None) -> None:
        ctx.ledger.add(ctx.ledger.location(plan.op))


def _folded(op: ir.Operation, fit: Affine) -> ir.Value:
    ty = ir.RankedTensorType(op.results[0].type)
    x = op.operands[0]
    scale = _vector(fit.scale, ty, fit.axis)
    shift = _vector(fit.shift, ty, fit.axis)
    return stablehlo.AddOp(stablehlo.MulOp(x, scale).result, shift).result


def _vector(values: np.ndarray, ty: ir.RankedTensorType, axis: int) -> ir.Value:
    const = stablehlo.ConstantOp(elements.dense_attr(values, ty.element_type))
    return stablehlo.BroadcastInDimOp(ty, const.result, [axis]).result


def _spec_decomposition(op: ir.Operation) -> ir.Value:
    ty = ir.RankedTensorType(op.results[0].type)
    feature = ir.IntegerAttr(op.attributes["feature_index"]).value
    x, gamma, beta, mean, var = list(op.operands)
    eps = ir.FloatAttr(op.attributes["epsilon"]).value
    eps_const = stablehlo.ConstantOp(
        ir.DenseElementsAttr.get_splat(ty, ir.FloatAttr.get(ty.element_type, eps)))

    def bcast(v: ir.Value) -> ir.Value:
        return stablehlo.BroadcastInDimOp(ty, v, [feature]).result

    centered = stablehlo.SubtractOp(x, bcast(mean)).result
    stddev = stablehlo.SqrtOp(stablehlo.AddOp(bcast(var), eps_const.result).result).result
    normalized = stablehlo.DivOp(centered, stddev).result
    return stablehlo.AddOp(stablehlo.MulOp(normalized, bcast(gamma)).result, bcast(beta)).result


class Expanded(Section):
    """How many batch norms were expanded: `"expanded": n` in every report."""

    order = 10
    always = True

    def attributes(self, part: Part) -> dict[str, Any]:
        return {"expanded": len(part.records)}

    def to_json(self, part: Part) -> dict[str, Any]:
        return {"expanded": len(part.records)}

    def summary(self, part: Part) -> str:
        return f", expanded {len(part.records)} batch_norm_inference" if part.records else ""


RECORDS = Expanded()
PATTERN = ExpandBatchNorm()

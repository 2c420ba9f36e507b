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

from typing import Any

import numpy as np

from bnfold import elements
from bnfold.affine import Affine, Step, apply
from bnfold.constants import Evaluator
from bnfold.graph import function_name
from bnfold.ir import ir, rewrite, stablehlo

NAME = "expand-batch-norm"
DESCRIPTION = ("rewrite each batch_norm_inference that did not fold into multiply + add "
               "(opt-in: --expand-batch-norm)")


def run(functions: list[ir.Operation], evaluator: Evaluator) -> tuple[set[str], int]:
    """Expands every static float batch_norm_inference.

    Returns the functions that changed and the number of expanded ops.

    A root-only rewrite (the batch norm is replaced, nothing else touched),
    so it runs under jaxlib's walk driver.
    """
    changed: set[str] = set()
    count = [0]
    errors: list[BaseException] = []

    def match_and_rewrite(op: Any, rewriter: Any) -> bool:
        op = op.operation
        ty = elements.tensor_type(op.results[0])
        if errors or ty is None or not elements.is_float(ty.element_type):
            return no_match()
        try:
            # Everything about `op` is read before replace_op erases it.
            changed.add(function_name(op))
            rewriter.replace_op(op, [expand(op, evaluator)])
            count[0] += 1
        except Exception as e:  # noqa: BLE001 - the driver cannot carry it; re-raised below
            errors.append(e)
            return no_match()
        return matched()

    patterns = rewrite.RewritePatternSet()
    patterns.add("stablehlo.batch_norm_inference", match_and_rewrite, 1)
    frozen = patterns.freeze()
    for func in functions:
        rewrite.walk_and_apply_patterns(func, frozen)
        if errors:
            raise errors[0]
    return changed, count[0]


def no_match() -> bool:
    """jaxlib's Python patterns signal "no match" with a truthy value."""
    return True


def matched() -> bool:
    return False


def expand(op: ir.Operation, evaluator: Evaluator) -> ir.Value:
    """Builds the expansion of `op` before it and returns its result."""
    ty = ir.RankedTensorType(op.results[0].type)
    feature = ir.IntegerAttr(op.attributes["feature_index"]).value
    x = op.operands[0]
    with ir.InsertionPoint(op), op.location:
        fit = apply(Affine.identity(tuple(ty.shape), feature), Step(op, 0), evaluator)
        if isinstance(fit, Affine):
            scale = _vector(fit.scale, ty, feature)
            shift = _vector(fit.shift, ty, feature)
            return stablehlo.AddOp(stablehlo.MulOp(x, scale).result, shift).result
        return _spec_decomposition(op, ty, feature)


def _vector(values: np.ndarray, ty: ir.RankedTensorType, axis: int) -> ir.Value:
    const = stablehlo.ConstantOp(elements.dense_attr(values, ty.element_type))
    return stablehlo.BroadcastInDimOp(ty, const.result, [axis]).result


def _spec_decomposition(op: ir.Operation, ty: ir.RankedTensorType, feature: int) -> ir.Value:
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

"""forward-affine: fold a per-channel affine chain into the producer after it.

Rooted at a convolution / dot_general whose activation operand is the end of
an affine chain (see `bnfold.affine`). Before:

    %n = stablehlo.multiply %x, %scale_b : tensor<1x8x8x4xf32>
    %a = stablehlo.add %n, %shift_b : tensor<1x8x8x4xf32>
    %y = stablehlo.convolution(%a, %k) dim_numbers = [b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f],
           window = {pad = [[0, 0], [0, 0]]} ...

After:

    %k2 = stablehlo.constant dense<...>            // K * s along the kernel's input axis
    %y = stablehlo.convolution(%x, %k2) ...
    %b = stablehlo.constant dense<[...]> : tensor<8xf32>   // sum over window and inputs of K * t
    %bb = stablehlo.broadcast_in_dim %b, dims = [3] ...
    %r = stablehlo.add %y, %bb

The scale always folds (zero padding and lhs dilation insert zeros, and
0 * s = 0). The shift folds only when every window position sees real data:
no positive padding and no lhs_dilation. Otherwise a chain with a non-zero
shift is left alone (recorded in the report), as AIMET and TFLite do. For a
dot_general the shift becomes a bias only when the constant operand has one
free dimension and no batching dimensions.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from bnfold import affine, elements, producers
from bnfold.affine import Affine, Composed, Step
from bnfold.constants import map_axis_through_reshape, per_channel
from bnfold.ir import ir, stablehlo
from bnfold.patterns.base import MATCHED, NO_MATCH, FoldState, Pattern, defining_op


class ForwardAffine(Pattern):
    name = "forward-affine"
    roots = producers.NAMES
    description = ("fold a per-channel affine chain into the convolution/dot_general after it "
                   "(shift only without padding)")

    def match_and_rewrite(self, op: ir.Operation, rewriter: Any, state: FoldState) -> bool:
        act_index = _activation_operand(op, state)
        if act_index is None:
            return NO_MATCH
        steps = _collect(op.operands[act_index], op, state)
        if not steps:
            return NO_MATCH
        end_type = elements.tensor_type(steps[-1].result)
        if end_type is None or not elements.is_float(end_type.element_type):
            return NO_MATCH
        axis_at_end = _input_axis(op, act_index)
        if axis_at_end is None:
            return NO_MATCH
        start_axis = _axis_at_start(steps, axis_at_end)
        if start_axis is None:
            return NO_MATCH
        first = steps[0]
        start_shape = tuple(ir.RankedTensorType(first.op.operands[first.x_index].type).shape)
        composed = affine.compose(steps, Affine.identity(start_shape, start_axis), state.evaluator)
        if composed.stop_reason is not None:
            # Forward folding needs the whole chain up to the producer.
            _skip(steps, composed.stop_reason, state)
            return NO_MATCH
        if not composed.normalizes:
            return NO_MATCH
        mapping = producers.input_scale_map(op, act_index, axis_at_end)
        if isinstance(mapping, str):
            _skip(steps, mapping, state)
            return NO_MATCH
        kernel = producers.kernel_values(op.operands[mapping.operand], state.evaluator)
        if isinstance(kernel, str):
            _skip(steps, kernel, state)
            return NO_MATCH
        fit = composed.affine
        if not (np.all(np.isfinite(fit.scale)) and np.all(np.isfinite(fit.shift))):
            _skip(steps, "folded scale or shift is not finite", state)
            return NO_MATCH
        bias = None
        if np.any(fit.shift != 0):
            bias = _shift_bias(op, mapping, kernel, fit.shift)
            if isinstance(bias, str):
                _skip(steps, bias, state)
                return NO_MATCH
        _rewrite(op, act_index, steps, composed, mapping, kernel, bias, rewriter, state)
        return MATCHED


def _activation_operand(op: ir.Operation, state: FoldState) -> int | None:
    """The non-constant operand: lhs for convolution, either side for dot_general."""
    if op.name == "stablehlo.convolution":
        return 0
    lhs_const = producers.is_constant(op.operands[0], state.evaluator)
    rhs_const = producers.is_constant(op.operands[1], state.evaluator)
    if lhs_const == rhs_const:
        return None
    return 1 if lhs_const else 0


def _collect(value: ir.Value, producer: ir.Operation, state: FoldState) -> list[Step]:
    """The single-use chain of steps ending in `value`, first step first."""
    steps: list[Step] = []
    while affine.single_use(value):
        owner = defining_op(value)
        if owner is None or owner.block != producer.block:
            break
        step = affine.as_step(owner, state.evaluator)
        if step is None:
            break
        steps.append(step)
        value = owner.operands[step.x_index]
    return _drop_leading_reshapes(steps[::-1])


def _drop_leading_reshapes(steps: list[Step]) -> list[Step]:
    start = 0
    while start < len(steps) and steps[start].name in affine.LAYOUT:
        start += 1
    return steps[start:]


def _input_axis(op: ir.Operation, act_index: int) -> int | None:
    if op.name == "stablehlo.convolution":
        return producers.conv_dims(op).input_feature_dimension
    dims = producers.dot_dims(op)
    contracting = dims.lhs_contracting_dimensions if act_index == 0 else dims.rhs_contracting_dimensions
    return contracting[0] if len(contracting) == 1 else None


def _axis_at_start(steps: list[Step], axis: int) -> int | None:
    """Maps the producer-input axis back through the chain's layout steps."""
    for step in reversed(steps):
        if step.name == "stablehlo.transpose":
            axis = list(ir.DenseI64ArrayAttr(step.op.attributes["permutation"]))[axis]
            continue
        if step.name != "stablehlo.reshape":
            continue
        after = tuple(ir.RankedTensorType(step.result.type).shape)
        before = tuple(ir.RankedTensorType(step.op.operands[0].type).shape)
        mapped = map_axis_through_reshape(after, before, axis)
        if mapped is None:
            return None
        axis = mapped
    return axis


def _shift_bias(op: ir.Operation, mapping: producers.InputScaleMap, kernel: np.ndarray,
                shift: np.ndarray) -> tuple[np.ndarray, int] | str:
    """The output bias a per-input-channel shift produces, and the output axis it varies on."""
    t = mapping.expand(shift, kernel.shape)
    if op.name == "stablehlo.convolution":
        attrs = op.attributes
        if "padding" in attrs and np.any(np.asarray(ir.DenseIntElementsAttr(attrs["padding"])) > 0):
            return "the shift cannot fold forward through zero padding"
        if "lhs_dilation" in attrs and any(d != 1 for d in ir.DenseI64ArrayAttr(attrs["lhs_dilation"])):
            return "the shift cannot fold forward through lhs_dilation (transposed convolution)"
        dims = producers.conv_dims(op)
        out_kernel = dims.kernel_output_feature_dimension
        axes = tuple(d for d in range(kernel.ndim) if d != out_kernel)
        bias = np.sum(kernel.astype(np.float64) * t, axis=axes)
        return bias, dims.output_feature_dimension
    dims = producers.dot_dims(op)
    const_index = mapping.operand
    batching = dims.rhs_batching_dimensions if const_index == 1 else dims.lhs_batching_dimensions
    contracting = dims.rhs_contracting_dimensions if const_index == 1 else dims.lhs_contracting_dimensions
    free = [d for d in range(kernel.ndim) if d not in batching and d not in contracting]
    if batching or len(free) != 1:
        return "the shift of a dot_general input folds only into a weight with one free dimension"
    axes = tuple(d for d in range(kernel.ndim) if d != free[0])
    bias = np.sum(kernel.astype(np.float64) * t, axis=axes)
    # No batching dims here, so the result is (lhs free..., rhs free...) and the
    # weight's single free dim is the last axis (weight on the right) or the first.
    out_axis = ir.RankedTensorType(op.results[0].type).rank - 1 if const_index == 1 else 0
    return bias, out_axis


def _add_bias(op: ir.Operation, values: np.ndarray, out_axis: int, loc: ir.Location,
              state: FoldState) -> None:
    """Adds `values` along `out_axis` to the producer's result.

    Merged into the producer's existing bias add when it has one, so the
    output keeps the canonical single add (and folding again changes nothing).
    """
    result = op.results[0]
    result_type = ir.RankedTensorType(result.type)
    existing = _existing_bias(result, out_axis, state)
    if existing is not None:
        user, index, old = existing
        with ir.InsertionPoint(user), loc:
            const = stablehlo.ConstantOp(elements.dense_attr(old + values, result_type.element_type))
            bcast = stablehlo.BroadcastInDimOp(result_type, const.result, [out_axis])
        user.operands[index] = bcast.result
        state.evaluator.forget(user.results[0])
        return
    with ir.InsertionPoint(op), loc:
        const = stablehlo.ConstantOp(elements.dense_attr(values, result_type.element_type))
        bcast = stablehlo.BroadcastInDimOp(result_type, const.result, [out_axis])
        add = stablehlo.AddOp(result, bcast.result)
    # Canonical order after the producer: constant, broadcast, add.
    const.operation.move_after(op)
    bcast.operation.move_after(const.operation)
    add.operation.move_after(bcast.operation)
    result.replace_all_uses_except(add.result, add.operation)


def _existing_bias(result: ir.Value, out_axis: int, state: FoldState
                   ) -> tuple[ir.Operation, int, np.ndarray] | None:
    """The producer's sole user if it is `add(result, per-channel constant)`."""
    user = affine.sole_user(result)
    if user is None or user.name != "stablehlo.add":
        return None
    step = affine.as_step(user, state.evaluator)
    if step is None or user.operands[step.x_index] != result:
        return None
    const = state.evaluator.constant(user.operands[1 - step.x_index])
    if const is None:
        return None
    vector = per_channel(const, out_axis)
    if isinstance(vector, str):
        return None
    return user, 1 - step.x_index, vector


def _skip(steps: list[Step], reason: str, state: FoldState) -> None:
    for s in steps:
        if s.name in affine.SCALING:
            state.record_skip(s.op, f"forward: {reason}")
            return


def _rewrite(op: ir.Operation, act_index: int, steps: list[Step], composed: Composed,
             mapping: producers.InputScaleMap, kernel: np.ndarray,
             bias: tuple[np.ndarray, int] | None, rewriter: Any, state: FoldState) -> None:
    fit = composed.affine
    kernel_value = op.operands[mapping.operand]
    kernel_type = ir.RankedTensorType(kernel_value.type)
    kernel_owner = defining_op(kernel_value)
    kernel_loc = kernel_owner.location if kernel_owner is not None else op.location
    norm = next((s.op for s in steps if s.name in affine.SCALING), steps[-1].op)
    first = steps[0]
    start = first.op.operands[first.x_index]

    new_kernel = producers.scale_by(kernel, mapping.expand(fit.scale, kernel.shape),
                                    elements.numpy_dtype(kernel_type.element_type))
    with ir.InsertionPoint(op):
        k = stablehlo.ConstantOp(elements.dense_attr(new_kernel, kernel_type.element_type),
                                 loc=kernel_loc)
    op.operands[mapping.operand] = k.result
    with ir.InsertionPoint(op), op.location:
        start = affine.replay_layout(start, steps)
    op.operands[act_index] = start
    if bias is not None:
        _add_bias(op, *bias, norm.location, state)

    params: dict[str, np.ndarray] = {"scale": fit.scale.copy(), "shift": fit.shift.copy()}
    if len(fit.gamma_beta) == 1:
        params.update(fit.gamma_beta[0])
    state.record_fold(producer=op, norm=norm,
                      form="batch_norm_inference" if fit.gamma_beta else "decomposed",
                      direction="forward", channels=fit.channels, ops=[s.op for s in steps],
                      params=params)
    for s in steps:
        state.evaluator.forget(s.result)
    for s in reversed(steps):
        rewriter.erase_op(s.op)

"""Linear producers: `stablehlo.convolution` and `stablehlo.dot_general`.

A producer is linear in its activation operand for a fixed kernel, so a
per-channel scale of its output equals the same scale applied to the kernel
slice that produces that channel:

    conv(x, K)[..., o] * s[o]  ==  conv(x, K * s along kernel_output_feature)[..., o]

This holds for every layout, stride, padding, dilation (lhs_dilation is a
transposed convolution), window reversal, feature_group_count and
batch_group_count, because output feature `o` is computed from kernel slice
`o` only. For dot_general the output axis must come from exactly one
non-contracting, non-batching dimension of the constant operand.

Forward folding uses the dual facts along the kernel's *input* axis; see
`input_scale_map`.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from bnfold import elements, precision
from bnfold.attributes import conv_dims, dot_dims, feature_groups
from bnfold.constants import Evaluator, NotConst, argument_refusal, loop_refusal, parameter_argument
from bnfold.graph import defining_op
from bnfold.ir import ir
from bnfold.refusal import Code, Refusal

NAMES = ("stablehlo.convolution", "stablehlo.dot_general")


class KernelAxis(NamedTuple):
    """The constant operand of a producer and the kernel axis of one result axis."""

    operand: int  # operand index of the kernel (1 = rhs for convolution)
    axis: int  # kernel axis that carries the result axis


def is_producer(op: ir.Operation) -> bool:
    return op.name in NAMES


def _free_dims(rank: int, *used: list[int]) -> list[int]:
    taken = {d for dims in used for d in dims}
    return [d for d in range(rank) if d not in taken]


def candidate_output_axes(op: ir.Operation) -> list[int]:
    """Result axes that a per-channel affine could be folded along."""
    if op.name == "stablehlo.convolution":
        return [conv_dims(op).output_feature_dimension]
    dims = dot_dims(op)
    lhs_rank = ir.RankedTensorType(op.operands[0].type).rank
    rhs_rank = ir.RankedTensorType(op.operands[1].type).rank
    n_batch = len(dims.lhs_batching_dimensions)
    n_lhs_free = len(_free_dims(lhs_rank, dims.lhs_batching_dimensions, dims.lhs_contracting_dimensions))
    n_rhs_free = len(_free_dims(rhs_rank, dims.rhs_batching_dimensions, dims.rhs_contracting_dimensions))
    # rhs free axes first: that is where Dense/Linear features live.
    rhs_axes = list(range(n_batch + n_lhs_free, n_batch + n_lhs_free + n_rhs_free))
    lhs_axes = list(range(n_batch, n_batch + n_lhs_free))
    return rhs_axes + lhs_axes


def output_kernel_axis(op: ir.Operation, result_axis: int) -> KernelAxis | Refusal:
    """Which kernel axis produces `result_axis`, or why there is none."""
    if op.name == "stablehlo.convolution":
        dims = conv_dims(op)
        if result_axis != dims.output_feature_dimension:
            return Refusal(Code.AXIS, f"normalized axis {result_axis} is not the convolution's "
                                      f"output feature dimension {dims.output_feature_dimension}")
        return KernelAxis(1, dims.kernel_output_feature_dimension)
    dot = dot_dims(op)
    lhs_rank = ir.RankedTensorType(op.operands[0].type).rank
    rhs_rank = ir.RankedTensorType(op.operands[1].type).rank
    n_batch = len(dot.lhs_batching_dimensions)
    lhs_free = _free_dims(lhs_rank, dot.lhs_batching_dimensions, dot.lhs_contracting_dimensions)
    rhs_free = _free_dims(rhs_rank, dot.rhs_batching_dimensions, dot.rhs_contracting_dimensions)
    if result_axis < n_batch:
        return Refusal(Code.AXIS, f"normalized axis {result_axis} is a dot_general batching "
                                  f"dimension")
    if result_axis < n_batch + len(lhs_free):
        return KernelAxis(0, lhs_free[result_axis - n_batch])
    return KernelAxis(1, rhs_free[result_axis - n_batch - len(lhs_free)])


class Kernel(NamedTuple):
    """A producer's constant operand, as the fold will rewrite it.

    `values` is the compact array (see `bnfold.constants`) of the constant
    that gets replaced: the kernel itself, or, when the kernel is
    `convert(wide constant)` and the computation is wider than the kernel,
    that wide source (`convert` is then the op to re-create). `storage` is
    the dtype of the replaced constant, `effective` the producer's operand
    dtype.
    """

    value: ir.Value
    values: np.ndarray
    shape: tuple[int, ...]
    storage: np.dtype
    effective: np.dtype
    convert: ir.Operation | None
    anchor: ir.Operation | None  # the constant op replaced (location, attributes)


def is_dequantized(value: ir.Value) -> bool:
    """`convert(q) * scale` with integers q, or that product converted (to the weight's
    type), as quantize-weights writes a weight."""
    owner = defining_op(value)
    if owner is not None and owner.name == "stablehlo.convert":
        owner = defining_op(owner.operands[0])
    if owner is None or owner.name != "stablehlo.multiply":
        return False
    for operand in owner.operands:
        convert = defining_op(operand)
        if convert is not None and convert.name == "stablehlo.convert":
            source = elements.ranked_type(convert.operands[0])
            if source is not None and isinstance(source.element_type, ir.IntegerType):
                return True
    return False


def is_constant(value: ir.Value, evaluator: Evaluator) -> bool:
    """Cheap for plain constants (no evaluation, no copy)."""
    owner = defining_op(value)
    if owner is not None and owner.name == "stablehlo.constant":
        return True
    return evaluator.constant(value) is not None


def kernel(value: ir.Value, compute: np.dtype, evaluator: Evaluator, producer: str
           ) -> Kernel | Refusal:
    """The kernel behind `value` that can absorb a scale computed in `compute`, or why none.

    A plain constant is read zero-copy; a kernel computed from constants
    (a reshape, a transpose, `call @_flip`) is evaluated in float64.
    """
    ty = elements.tensor_type(value)
    if ty is None or not elements.is_float(ty.element_type):
        return Refusal(Code.NOT_FLOAT, f"kernel type {value.type} is not a static float tensor")
    effective = elements.numpy_dtype(ty.element_type)
    assert effective is not None
    source, convert = value, None
    owner = defining_op(value)
    # Scale the wide constant behind `convert` when there is one, so the kernel
    # is rounded once, where the original rounded it (Flax's param_dtype=f32,
    # dtype=bf16); a kernel narrower than the computation needs one.
    wide = _wide_source(owner, max(effective, compute, key=precision.significand_bits))
    if wide is not None and evaluator.constant(wide) is not None:
        source, convert = wide, owner
        owner = defining_op(source)
    elif precision.is_narrower(effective, compute):
        return precision.narrow_kernel_reason(effective, compute, producer)
    storage = elements.numpy_dtype(elements.tensor_type(source).element_type)  # type: ignore[union-attr]
    assert storage is not None
    shape = tuple(ty.shape)
    if owner is not None and owner.name == "stablehlo.constant":
        try:
            values = elements.read_native(owner.attributes["value"], compact=True)
        except ValueError as e:
            return Refusal(Code.NOT_CONSTANT, f"kernel constant cannot be read: {e}")
        return Kernel(value, values, shape, storage, effective, convert, owner)
    result = evaluator.evaluate(source)
    if isinstance(result, NotConst):
        return Refusal(Code.NOT_CONSTANT, f"kernel is not constant ({result.reason})")
    return Kernel(value, result.array, shape, storage, effective, convert, None)


def _wide_source(owner: ir.Operation | None, compute: np.dtype) -> ir.Value | None:
    """The operand of `convert(x)` when x is a float type at least as precise as `compute`."""
    if owner is None or owner.name != "stablehlo.convert":
        return None
    dtype = elements.float_dtype(owner.operands[0])
    if dtype is None or precision.is_narrower(dtype, compute):
        return None
    return owner.operands[0]


def axis_factor(scale: np.ndarray, axis: int, rank: int) -> np.ndarray:
    """`scale` laid along `axis` of a rank-`rank` array (broadcastable)."""
    shape = [1] * rank
    shape[axis] = scale.shape[0]
    return scale.reshape(shape)


# --- forward folding -----------------------------------------------------------


class InputScaleMap(NamedTuple):
    """How a per-channel scale of the activation maps onto the kernel.

    `in_axis` is the kernel axis that reads activation channels and `out_axis`
    the kernel axis of output features (None for dot_general). With feature
    groups, kernel element [k (in_axis), o (out_axis)] reads activation
    channel `(o // (out_size // groups)) * in_size + k`.
    """

    operand: int
    in_axis: int
    out_axis: int | None
    groups: int

    def expand(self, vector: np.ndarray, kernel_shape: tuple[int, ...]) -> np.ndarray:
        """The activation-channel vector as a kernel-broadcastable array."""
        rank = len(kernel_shape)
        in_size = kernel_shape[self.in_axis]
        if self.groups == 1 or self.out_axis is None:
            shape = [1] * rank
            shape[self.in_axis] = in_size
            return vector.reshape(shape)
        out_size = kernel_shape[self.out_axis]
        per_group = out_size // self.groups
        k = np.arange(in_size)[:, None]
        o = np.arange(out_size)[None, :]
        table = vector[(o // per_group) * in_size + k]  # [in_size, out_size]
        if self.in_axis > self.out_axis:
            table = table.T
        shape = [1] * rank
        shape[self.in_axis] = in_size
        shape[self.out_axis] = out_size
        return table.reshape(shape)


def input_scale_map(op: ir.Operation, operand: int, axis: int) -> InputScaleMap | Refusal:
    """How to fold a scale of operand `operand`'s axis `axis` into the other operand."""
    if op.name == "stablehlo.convolution":
        if operand != 0:
            return Refusal(Code.NOT_LINEAR, "the normalized value is the convolution's kernel, "
                                            "not its input")
        dims = conv_dims(op)
        if axis != dims.input_feature_dimension:
            return Refusal(Code.AXIS, f"normalized axis {axis} is not the convolution's input "
                                      f"feature dimension {dims.input_feature_dimension}")
        return InputScaleMap(1, dims.kernel_input_feature_dimension,
                             dims.kernel_output_feature_dimension, feature_groups(op))
    dot = dot_dims(op)
    mine, theirs = ((dot.lhs_contracting_dimensions, dot.rhs_contracting_dimensions)
                    if operand == 0 else
                    (dot.rhs_contracting_dimensions, dot.lhs_contracting_dimensions))
    if axis not in mine:
        return Refusal(Code.AXIS, f"normalized axis {axis} is not a contracting dimension of "
                                  f"the dot_general")
    return InputScaleMap(1 - operand, theirs[list(mine).index(axis)], None, 1)


def output_axis(op: ir.Operation, evaluator: Evaluator
                ) -> tuple[int, KernelAxis | Refusal] | None:
    """The result axis of a producer's output channels and the constant kernel's axis behind
    it (or why the kernel is not constant); None for a result that is not float."""
    result = elements.ranked_type(op.results[0])
    if result is None or not elements.is_float(result.element_type):
        return None
    for axis in candidate_output_axes(op):
        kernel_axis = output_kernel_axis(op, axis)
        if isinstance(kernel_axis, Refusal):
            continue
        if is_constant(op.operands[kernel_axis.operand], evaluator):
            return axis, kernel_axis
    axis = candidate_output_axes(op)[0]
    kernel_axis = output_kernel_axis(op, axis)
    if not isinstance(kernel_axis, Refusal):
        argument = parameter_argument(op.operands[kernel_axis.operand], evaluator)
        if argument is not None:
            return axis, argument_refusal(argument, "the kernel", Code.KERNEL_ARGUMENT)
        looped = loop_refusal(op.operands[kernel_axis.operand], "the kernel", evaluator)
        if looped is not None:
            return axis, looped
    return axis, Refusal(Code.KERNEL_ARGUMENT, "kernel is not constant (bind parameters first: "
                                               "--bind-params)")

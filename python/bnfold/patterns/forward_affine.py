"""forward-affine: fold a per-channel affine chain into the producer after it.

Rooted at a convolution / dot_general whose activation operand is the end of
an affine chain (see `bnfold.affine`). Before:

    %n = stablehlo.multiply %x, %scale_b : tensor<1x8x8x4xf32>
    %a = stablehlo.add %n, %shift_b : tensor<1x8x8x4xf32>
    %y = stablehlo.convolution(%a, %k) dim_numbers = [b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f],
           window = {pad = [[0, 0], [0, 0]]} ...

After:

    %k2 = stablehlo.constant dense<...>            // K * s along the kernel's input axis
    %y2 = stablehlo.convolution(%x, %k2) ...
    %b = stablehlo.constant dense<[...]> : tensor<8xf32>   // sum over window and inputs of K * t
    %bb = stablehlo.broadcast_in_dim %b, dims = [3] ...
    %r = stablehlo.add %y2, %bb

The scale always folds (zero padding and lhs dilation insert zeros, and
0 * s = 0). The shift becomes a per-feature bias when every window position
sees real data. Through zero padding or lhs_dilation its contribution varies
near the borders; it folds exactly as a constant correction of the output
(see `bnfold.border`), built from a table no larger than the kernel plus a
margin. An explicit zero `stablehlo.pad` right before the convolution (Keras
`ZeroPadding2D` before a VALID `Conv2D`) becomes the convolution's padding:

    %a = stablehlo.add %n, %shift_b
    %p = stablehlo.pad %a, %zero, low = [0, 0, 1, 1], high = [0, 0, 1, 1], interior = [0, 0, 0, 0]
    %y = stablehlo.convolution(%p, %k) ... window = {pad = [[0, 0], [0, 0]]}
  ->
    %y2 = stablehlo.convolution(%x, %k2) ... window = {pad = [[1, 1], [1, 1]]}
    %r = stablehlo.add %y2, %correction

When the correction is refused (too large, dynamic spatial size) the scale
still folds and `t / s` stays as one add before the producer. For a
dot_general the shift becomes a bias only when the constant operand has one
free dimension and no batching dimensions.

The root is the producer (or its existing bias add, which the new bias
merges into): `apply` creates the folded producer and redirects the root's
uses; the old producer and the chain are left to the cleanup.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from bnfold import affine, elements, precision, producers
from bnfold.affine import Affine, Analysis, Step
from bnfold.constants import map_axis_through_reshape, per_channel
from bnfold.graph import carry_attributes, defining_op, live_users, sole_live_user
from bnfold.ir import ir, stablehlo
from bnfold.patterns.rewrite import KernelRewrite, bias_add, constant_add, plan_kernel

if TYPE_CHECKING:
    from bnfold import border

NAME = "forward-affine"
DESCRIPTION = ("fold a per-channel affine chain into the convolution/dot_general after it "
               "(through zero padding with an exact border correction)")


@dataclass(frozen=True)
class Match:
    """A chain that ends at a producer's activation operand."""

    producer: ir.Operation
    act_index: int
    steps: tuple[Step, ...]  # first step first; ends at the producer's activation
    pad: ir.Operation | None = None  # an explicit zero pad between the chain and a convolution


@dataclass(frozen=True)
class Plan:
    """A forward fold, computed and checked: what `apply` writes."""

    match: Match
    affine: Affine
    kernel: KernelRewrite
    bias: np.ndarray | None
    out_axis: int
    merge_into: ir.Operation | None  # the producer's existing bias add, if any
    # When the shift cannot fold (zero padding, lhs_dilation): the shift over the
    # scale, t / s, kept as one add before the producer, and why.
    kept_shift: np.ndarray | None = None
    kept_reason: str | None = None
    in_axis: int = 0  # the producer input's feature axis (where kept_shift varies)
    # A uniform shift through zero padding: the padding moves into an explicit
    # stablehlo.pad of the unshifted input with this value (-t/s), low, high.
    pad: tuple[float, list[int], list[int]] | None = None
    # The folded convolution's padding, when it changes (an absorbed or explicit pad).
    padding: np.ndarray | None = None
    # The shift's output through zero padding: varies near the borders.
    correction: border.Correction | None = None


def match(producer: ir.Operation, analysis: Analysis) -> Match | None:
    """The single-use chain of steps that ends at the producer's activation operand."""
    act_index = _activation_operand(producer, analysis)
    if act_index is None:
        return None
    steps: list[Step] = []
    value = producer.operands[act_index]
    pad = _zero_pad(producer, value, analysis)
    if pad is not None:
        value = pad.operands[0]
    while len(live_users(value)) == 1:
        owner = defining_op(value)
        if owner is None or owner.block != producer.block:
            break
        step = analysis.step(owner)
        if step is None:
            break
        steps.append(step)
        value = step.x
    # What follows a step with a parameter operand can still fold. When nothing
    # does, the whole chain stays, so that the plan tells to bind parameters.
    first_parameter = next((i for i, s in enumerate(steps) if s.parameter is not None), None)
    if first_parameter:
        steps = steps[:first_parameter]
    steps.reverse()
    while steps and steps[0].name in affine.LAYOUT:
        steps.pop(0)
    if not steps:
        return None
    return Match(producer, act_index, tuple(steps), pad)


def _zero_pad(producer: ir.Operation, value: ir.Value, analysis: Analysis) -> ir.Operation | None:
    """An explicit zero pad feeding only this convolution, that its padding can take over.

    Edge padding of spatial axes only, no interior padding, none negative (a
    crop before the convolution's own padding does not add up), and a
    convolution without lhs_dilation (which would dilate the pad's zeros too)."""
    owner = defining_op(value)
    if producer.name != "stablehlo.convolution" or owner is None or \
            owner.name != "stablehlo.pad" or owner.block != producer.block or \
            len(live_users(value)) != 1 or _lhs_dilated(producer):
        return None
    zero = analysis.constant(owner.operands[1])
    if zero is None or np.any(zero.array != 0):
        return None
    attrs = owner.attributes
    low, high, interior = (list(ir.DenseI64ArrayAttr(attrs[name]))
                           for name in ("edge_padding_low", "edge_padding_high", "interior_padding"))
    spatial = set(producers.conv_dims(producer).input_spatial_dimensions)
    if any(interior) or min(low + high) < 0 or \
            any(low[d] or high[d] for d in range(len(low)) if d not in spatial):
        return None
    return owner


def _lhs_dilated(op: ir.Operation) -> bool:
    attrs = op.attributes
    return "lhs_dilation" in attrs and any(d != 1 for d in ir.DenseI64ArrayAttr(attrs["lhs_dilation"]))


def _padding(m: Match) -> np.ndarray | None:
    """The convolution's padding [spatial, 2], including an absorbed explicit pad."""
    op = m.producer
    if op.name != "stablehlo.convolution":
        return None
    dims = producers.conv_dims(op)
    n = len(dims.input_spatial_dimensions)
    attrs = op.attributes
    padding = (np.asarray(ir.DenseIntElementsAttr(attrs["padding"])).astype(np.int64)
               if "padding" in attrs else np.zeros((n, 2), dtype=np.int64))
    if m.pad is not None:
        low = list(ir.DenseI64ArrayAttr(m.pad.attributes["edge_padding_low"]))
        high = list(ir.DenseI64ArrayAttr(m.pad.attributes["edge_padding_high"]))
        for k, d in enumerate(dims.input_spatial_dimensions):
            padding[k] += (low[d], high[d])
    return padding


def plan(m: Match, analysis: Analysis, *, pad_uniform_shift: bool = False) -> Plan | str | None:
    """The fold of `m`, or why it cannot fold (None: nothing worth folding)."""
    op, steps = m.producer, list(m.steps)
    end_type = elements.ranked_type(steps[-1].result)
    if end_type is None or not elements.is_float(end_type.element_type):
        return None
    axis_at_end = _input_axis(op, m.act_index)
    if axis_at_end is None:
        return "forward: the dot_general contracts more than one dimension"
    start_axis = _axis_at_start(steps, axis_at_end)
    if start_axis is None:
        return "forward: a reshape merges or splits the feature axis"
    first = steps[0]
    start_shape = tuple(ir.RankedTensorType(first.x.type).shape)
    composed = affine.compose(steps, Affine.identity(start_shape, start_axis), analysis.evaluator)
    if composed.stop_reason is not None:
        # Forward folding needs the whole chain up to the producer.
        return f"forward: {composed.stop_reason}"
    if not composed.normalizes:
        return None
    mapping = producers.input_scale_map(op, m.act_index, axis_at_end)
    if isinstance(mapping, str):
        return f"forward: {mapping}"
    fit = composed.affine
    if not (np.all(np.isfinite(fit.scale)) and np.all(np.isfinite(fit.shift))):
        return "forward: folded scale or shift is not finite"
    compute = elements.numpy_dtype(end_type.element_type)
    assert compute is not None
    kernel = producers.kernel(op.operands[mapping.operand], compute, analysis.evaluator,
                              op.name.removeprefix("stablehlo."))
    if isinstance(kernel, str):
        return f"forward: {kernel}"
    rewrite = plan_kernel(kernel, mapping.expand(fit.scale, kernel.shape), mapping.operand)
    if isinstance(rewrite, str):
        return f"forward: {rewrite}"
    result_type = ir.RankedTensorType(op.results[0].type)
    out_dtype = elements.numpy_dtype(result_type.element_type)
    bias: np.ndarray | None = None
    out_axis = 0
    merge_into = None
    padding = _padding(m)
    absorbed = padding if m.pad is not None else None
    if np.any(fit.shift != 0):
        if padding is not None and (np.any(padding > 0) or _lhs_dilated(op)):
            if pad_uniform_shift:
                padded = _uniform_shift_through_padding(m, fit, rewrite, end_type, analysis, padding)
                if padded is not None:
                    return padded
            corrected = _border_shift(m, mapping, kernel, fit, rewrite, padding, analysis)
            if not isinstance(corrected, str):
                return corrected
            return _scale_only(m, fit, rewrite, corrected, axis_at_end, end_type, absorbed)
        shifted = _shift_bias(op, mapping, kernel, fit.shift)
        if isinstance(shifted, str):
            return _scale_only(m, fit, rewrite, shifted, axis_at_end, end_type, absorbed)
        bias, out_axis = shifted
        existing = _existing_bias(op.results[0], out_axis, analysis)
        if existing is not None:
            merge_into, old = existing
            bias = bias + old
        if out_dtype is not None and (problem := precision.check_bias(bias, out_dtype)):
            return f"forward: {problem}"
    return Plan(m, fit, rewrite, bias, out_axis, merge_into, padding=absorbed)


def _border_shift(m: Match, mapping: producers.InputScaleMap, kernel: producers.Kernel,
                  fit: Affine, rewrite: KernelRewrite, padding: np.ndarray, analysis: Analysis
                  ) -> Plan | str:
    """The shift through zero padding as an exact constant correction of the output."""
    from bnfold import border  # only folds through padding need it (start-up time)

    op = m.producer
    unpadded = ir.RankedTensorType(m.pad.operands[0].type) if m.pad is not None else None
    win = border.window(op, padding, unpadded)
    if isinstance(win, str):
        return f"the shift cannot fold forward through zero padding: {win}"
    values = _kernel_f64(kernel)
    if isinstance(values, str):
        return values
    weighted = values * mapping.expand(fit.shift, kernel.shape)
    limit = int(np.prod(kernel.shape)) + border.MARGIN_ELEMENTS
    corr = border.correction(op, win, weighted, limit)
    if isinstance(corr, str):
        return f"the shift cannot fold forward through zero padding: {corr}"
    dims = producers.conv_dims(op)
    existing = _existing_bias(op.results[0], dims.output_feature_dimension, analysis)
    merge_into = None
    if existing is not None:
        merge_into, old = existing
        corr = corr.add_bias(old)
    out_dtype = elements.numpy_dtype(ir.RankedTensorType(op.results[0].type).element_type)
    if out_dtype is not None and (problem := precision.check_bias(corr.table, out_dtype)):
        return problem
    padding_out = padding if m.pad is not None else None
    if corr.is_uniform:  # padding that every output position sees the same way
        bias = corr.table.reshape(-1)
        return Plan(m, fit, rewrite, bias, dims.output_feature_dimension, merge_into,
                    padding=padding_out)
    return Plan(m, fit, rewrite, None, dims.output_feature_dimension, merge_into,
                padding=padding_out, correction=corr)


def _kernel_f64(kernel: producers.Kernel) -> np.ndarray | str:
    """The kernel as the program computes with it (after any convert), in float64."""
    if kernel.values.shape != kernel.shape and \
            int(np.prod(kernel.shape)) > precision.MAX_EXPANDED_ELEMENTS:
        return "the kernel is a huge splat constant; refused to expand it for the shift"
    values = np.broadcast_to(kernel.values, kernel.shape).astype(np.float64)
    if kernel.convert is not None:
        values = values.astype(kernel.effective).astype(np.float64)
    return values


def _uniform_shift_through_padding(m: Match, fit: Affine, rewrite: KernelRewrite,
                                   end_type: ir.RankedTensorType, analysis: Analysis,
                                   padding: np.ndarray) -> Plan | None:
    """The exact fold of a uniform shift (the same t/s on every channel, e.g. Keras
    `Rescaling(1/127.5, offset=-1)`) through a convolution's zero padding.

        conv(pad0(x * s + t), K) == conv(pad(x, value=-u), K * s) + u * sum(K * s),   u = t / s

    since pad0(x + u) == pad(x, -u) + u everywhere. The padding moves into an
    explicit `stablehlo.pad`; the convolution becomes VALID. None when it does
    not apply (not a convolution, lhs_dilation, negative padding, a zero or a
    per-channel scale-to-shift ratio)."""
    op = m.producer
    if op.name != "stablehlo.convolution" or np.any(fit.scale == 0):
        return None
    if _lhs_dilated(op) or np.any(padding < 0):
        return None
    ratio = fit.shift / fit.scale
    if not np.all(ratio == ratio[0]):
        return None
    dtype = elements.numpy_dtype(end_type.element_type)
    if dtype is None or precision.significand_bits(dtype) < precision.significand_bits(
            np.dtype(np.float32)):
        return None  # as for the kept shift: extra narrow roundings (see _scale_only)
    value = float(np.asarray(-ratio[0]).astype(dtype))  # the pad value, as the program holds it
    if not np.isfinite(value):
        return None
    dims = producers.conv_dims(op)
    low, high = [0] * end_type.rank, [0] * end_type.rank
    for k, d in enumerate(dims.input_spatial_dimensions):
        low[d], high[d] = int(padding[k][0]), int(padding[k][1])
    kernel = rewrite.rounded.values.astype(rewrite.kernel.effective).astype(np.float64)
    kernel = np.broadcast_to(kernel, rewrite.kernel.shape)
    out_kernel = dims.kernel_output_feature_dimension
    axes = tuple(d for d in range(kernel.ndim) if d != out_kernel)
    bias = -value * np.sum(kernel, axis=axes)
    out_axis = dims.output_feature_dimension
    merge_into = None
    existing = _existing_bias(op.results[0], out_axis, analysis)
    if existing is not None:
        merge_into, old = existing
        bias = bias + old
    out_dtype = elements.numpy_dtype(ir.RankedTensorType(op.results[0].type).element_type)
    if out_dtype is not None and precision.check_bias(bias, out_dtype):
        return None
    return Plan(m, fit, rewrite, bias, out_axis, merge_into, pad=(value, low, high),
                padding=np.zeros_like(padding))


def _scale_only(m: Match, fit: Affine, rewrite: KernelRewrite, reason: str, axis: int,
                end_type: ir.RankedTensorType, padding: np.ndarray | None) -> Plan | str:
    """Folds the scale only: x * s + t == (x + t / s) * s, and the zero padding
    the producer adds sees zeros either way; t / s stays as one add before it."""
    if np.any(fit.scale == 0):
        return f"forward: {reason} (and a zero scale keeps the shift from staying alone)"
    dtype = elements.numpy_dtype(end_type.element_type)
    if dtype is None or precision.significand_bits(dtype) < precision.significand_bits(
            np.dtype(np.float32)):
        # In f16/bf16 the kept form rounds t/s and x + t/s in the narrow type on top
        # of the scaled kernel; the thorough property suite found ill-conditioned
        # cases where that is measurably worse than the original.
        return f"forward: {reason} (in {precision.type_name(dtype) if dtype else 'this type'} " \
               f"the shift is not kept apart: it would add roundings the original never made)"
    kept = fit.shift / fit.scale
    if dtype is not None and (problem := precision.check_bias(kept, dtype)):
        return f"forward: {reason}; {problem}"
    return Plan(m, fit, rewrite, None, 0, None, kept, reason, axis, padding=padding)


def _activation_operand(op: ir.Operation, analysis: Analysis) -> int | None:
    """The non-constant operand: lhs for convolution, either side for dot_general."""
    if op.name == "stablehlo.convolution":
        return 0
    lhs_const = producers.is_constant(op.operands[0], analysis.evaluator)
    rhs_const = producers.is_constant(op.operands[1], analysis.evaluator)
    if lhs_const == rhs_const:
        return None
    return 1 if lhs_const else 0


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


def _shift_bias(op: ir.Operation, mapping: producers.InputScaleMap, kernel: producers.Kernel,
                shift: np.ndarray) -> tuple[np.ndarray, int] | str:
    """The output bias a per-input-channel shift produces, and the output axis it varies on."""
    values = _kernel_f64(kernel)
    if isinstance(values, str):
        return values
    t = mapping.expand(shift, kernel.shape)
    if op.name == "stablehlo.convolution":
        dims = producers.conv_dims(op)
        out_kernel = dims.kernel_output_feature_dimension
        axes = tuple(d for d in range(len(kernel.shape)) if d != out_kernel)
        return np.sum(values * t, axis=axes), dims.output_feature_dimension
    dot = producers.dot_dims(op)
    const_index = mapping.operand
    batching = dot.rhs_batching_dimensions if const_index == 1 else dot.lhs_batching_dimensions
    contracting = dot.rhs_contracting_dimensions if const_index == 1 else dot.lhs_contracting_dimensions
    free = [d for d in range(len(kernel.shape)) if d not in batching and d not in contracting]
    if batching or len(free) != 1:
        return "the shift of a dot_general input folds only into a weight with one free dimension"
    axes = tuple(d for d in range(len(kernel.shape)) if d != free[0])
    bias = np.sum(values * t, axis=axes)
    # No batching dims here, so the result is (lhs free..., rhs free...) and the
    # weight's single free dim is the last axis (weight on the right) or the first.
    out_axis = ir.RankedTensorType(op.results[0].type).rank - 1 if const_index == 1 else 0
    return bias, out_axis


def _existing_bias(result: ir.Value, out_axis: int, analysis: Analysis
                   ) -> tuple[ir.Operation, np.ndarray] | None:
    """The producer's sole user and its bias if it is `add(result, per-channel constant)`."""
    user = sole_live_user(result)
    if user is None or user.name != "stablehlo.add":
        return None
    step = analysis.step(user)
    if step is None or step.x != result or step.parameter is not None:
        return None
    const = analysis.constant(user.operands[1 - step.x_index])
    if const is None:
        return None
    vector = per_channel(const, out_axis)
    if isinstance(vector, str):
        return None
    return user, vector


def _explicit_pad(value: ir.Value, pad_value: float, low: list[int], high: list[int],
                  loc: ir.Location) -> ir.Value:
    ty = ir.RankedTensorType(value.type)
    with loc:
        scalar = ir.RankedTensorType.get([], ty.element_type)
        const = stablehlo.ConstantOp(ir.DenseElementsAttr.get_splat(
            scalar, ir.FloatAttr.get(ty.element_type, pad_value)))
        return stablehlo.PadOp(value, const.result, low, high, [0] * ty.rank).result


def apply(p: Plan) -> tuple[ir.Operation, ir.Operation]:
    """Builds the folded producer (and merged bias); redirects the root's uses.

    Returns the op that names the normalization and the folded producer.
    """
    op, steps = p.match.producer, list(p.match.steps)
    norm = affine.norm_op(steps)
    with ir.InsertionPoint(op):
        kernel_value = p.kernel.build(op.location)
        with op.location:
            start = affine.replay_layout(steps[0].x, steps)
        if p.kept_shift is not None:
            start = bias_add(start, p.kept_shift, p.in_axis, norm.location)
        if p.pad is not None:
            start = _explicit_pad(start, *p.pad, norm.location)
        folded = op.clone(ip=ir.InsertionPoint(op)).operation
    if p.padding is not None:  # an absorbed pad, or one moved into an explicit pad
        folded.attributes["padding"] = ir.DenseIntElementsAttr.get(
            cast(Any, np.ascontiguousarray(p.padding, dtype=np.int64)))
    folded.operands[p.kernel.operand] = kernel_value
    folded.operands[p.match.act_index] = start
    root = p.merge_into or op
    if p.bias is None and p.correction is None:
        op.results[0].replace_all_uses_with(folded.results[0])
        return norm, folded
    at = ir.InsertionPoint(p.merge_into) if p.merge_into is not None else ir.InsertionPoint.after(op)
    loc = root.location if p.merge_into is not None else norm.location
    with at:
        if (corr := p.correction) is not None:
            dims = producers.conv_dims(op)
            replacement = constant_add(folded.results[0], corr.table,
                                       [*dims.output_spatial_dimensions, p.out_axis], loc,
                                       corr.expand)
        else:
            assert p.bias is not None
            replacement = bias_add(folded.results[0], p.bias, p.out_axis, loc)
    owner = defining_op(replacement)
    if owner is not None and p.merge_into is not None:
        carry_attributes(p.merge_into, owner)
    root.results[0].replace_all_uses_with(replacement)
    return norm, folded

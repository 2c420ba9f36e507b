"""Builders shared by the patterns: the new kernel, the bias add, the fold record.

The IR builders only create ops (with the location and discardable
attributes of the ops they stand in for); none changes an existing op.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from bnfold import elements, precision, producers
from bnfold.affine import LAYOUT
from bnfold.elements import all_true, any_true
from bnfold.graph import carry_attributes, defining_op, function_name
from bnfold.ir import ir, stablehlo
from bnfold.producers import Kernel
from bnfold.refusal import Code, Refusal
from bnfold.report import Fold
from bnfold.statistics import has_variance

if TYPE_CHECKING:
    from bnfold.affine import Affine, Step
    from bnfold.analysis import Analysis
    from bnfold.ledger import Ledger

# The op names these builders create (`KernelRewrite.build`, `constant_add`,
# `broadcast_constant` with its symbolic shape) and `bnfold.affine.replay_layout`: a
# pattern whose apply builds with nothing else declares them as its `Pattern.builds`.
BUILDS = frozenset(f"stablehlo.{name}" for name in (
    "constant", "convert", "add", "broadcast_in_dim", "dynamic_broadcast_in_dim",
    "get_dimension_size", "reshape", "concatenate", "transpose"))


class KernelRewrite(NamedTuple):
    """A kernel scaled in float64 and rounded once, and where it goes."""

    kernel: Kernel
    rounded: precision.Rounded
    operand: int  # the producer operand it replaces

    @property
    def worst_relative_rounding(self) -> float:
        return self.rounded.worst_relative_rounding

    def build(self, fallback: ir.Location) -> ir.Value:
        """Creates the new kernel constant (and its convert) at the insertion point."""
        kernel = self.kernel
        source_type = (kernel.convert.operands[0].type if kernel.convert is not None
                       else kernel.value.type)
        ty = ir.RankedTensorType(source_type)
        anchor = kernel.anchor
        loc = anchor.location if anchor is not None else fallback
        const = stablehlo.ConstantOp(self._attr(ty), loc=loc)
        if anchor is not None:
            carry_attributes(anchor, const.operation)
        if kernel.convert is None:
            return const.result
        convert = stablehlo.ConvertOp(kernel.value.type, const.result,
                                      loc=kernel.convert.location)
        carry_attributes(kernel.convert, convert.operation)
        return convert.result

    def _attr(self, ty: ir.RankedTensorType) -> ir.Attribute:
        values = self.rounded.values
        if self.rounded.splat:
            scalar = ir.FloatAttr.get(ty.element_type, float(values.item()))
            return ir.DenseElementsAttr.get_splat(ty, scalar)
        return elements.dense_attr(values, ty.element_type)


def plan_kernel(kernel: Kernel, factor: np.ndarray, operand: int, *,
                arena: precision.Arena | None = None) -> KernelRewrite | Refusal:
    """`kernel * factor` rounded under the precision contract, or why not
    (into `arena`'s memory when given: see `precision.Arena`). A kernel that is integers
    times a scale (quantize-weights' output) is refused: scaling it would write floats."""
    if producers.is_dequantized(kernel.value):
        return Refusal(Code.QUANTIZED,
                       "the kernel is quantized (an integer constant times a scale, "
                       "--quantize-weights): scaling it would turn its integers back into "
                       "floats; fold and equalize before quantizing (one run: bnfold-opt "
                       "--equalize --quantize-weights ..., or bnfold-quantize-weights last in "
                       "a pipeline)")
    rounded = precision.round_scaled(kernel.values, kernel.shape, factor, kernel.storage,
                                     kernel.effective, arena=arena)
    if isinstance(rounded, Refusal):
        return rounded
    return KernelRewrite(kernel, rounded, operand)


def bias_add(result: ir.Value, bias: np.ndarray, axis: int, loc: ir.Location) -> ir.Value:
    """`add(result, broadcast_in_dim(bias, dims=[axis]))` at the insertion point."""
    return constant_add(result, bias, [axis], loc)


def constant_add(result: ir.Value, array: np.ndarray, dims: list[int], loc: ir.Location,
                 expand: Callable[[ir.Value], ir.Value] | None = None) -> ir.Value:
    """`add(result, broadcast_in_dim(expand(constant(array)), dims))` at the insertion point."""
    with loc:
        return stablehlo.AddOp(result, broadcast_constant(array, result, dims, loc, expand)).result


def broadcast_constant(array: np.ndarray, like: ir.Value, dims: list[int], loc: ir.Location,
                       expand: Callable[[ir.Value], ir.Value] | None = None) -> ir.Value:
    """`broadcast_in_dim(expand(constant(array)), dims)` to the type of `like`.

    `array` is rounded once to `like`'s element type. With symbolic dimensions
    (a shape-polymorphic batch) the broadcast is a `dynamic_broadcast_in_dim`
    to the shape of `like` itself, read with `get_dimension_size`, so the
    module verifies and refines for any size.
    """
    ty = ir.RankedTensorType(like.type)
    with loc:
        value: ir.Value = stablehlo.ConstantOp(elements.dense_attr(array, ty.element_type)).result
        if expand is not None:
            value = expand(value)
        if ty.has_static_shape:
            return stablehlo.BroadcastInDimOp(ty, value, dims).result
        return stablehlo.DynamicBroadcastInDimOp(ty, value, _shape_of(like), dims).result


def _shape_of(value: ir.Value) -> ir.Value:
    """`tensor<rank x i32>` holding the runtime shape of `value`."""
    ty = ir.RankedTensorType(value.type)
    i32 = ir.IntegerType.get_signless(32)
    one = ir.RankedTensorType.get([1], i32)
    parts: list[ir.Value] = []
    sizes: dict[int, ir.Value] = {}  # one constant per static size
    for d in range(ty.rank):
        if ty.is_dynamic_dim(d):
            size = stablehlo.GetDimensionSizeOp(value, d).result
            parts.append(stablehlo.ReshapeOp(one, size).result)
        else:
            if ty.shape[d] not in sizes:
                attr = ir.DenseElementsAttr.get_splat(one, ir.IntegerAttr.get(i32, ty.shape[d]))
                sizes[ty.shape[d]] = stablehlo.ConstantOp(attr).result
            parts.append(sizes[ty.shape[d]])
    return stablehlo.ConcatenateOp(parts, 0).result


def fold_record(ledger: Ledger, producer: ir.Operation, norm: ir.Operation, fit: Affine,
                direction: str, kernel_rounding: float, steps: list[Step]) -> Fold:
    """The report record of one fold (the ledger gives it its id)."""
    params = {"scale": fit.scale.copy(), "shift": fit.shift.copy()}
    if len(fit.gamma_beta) == 1:
        params.update(fit.gamma_beta[0])
    found = kind(steps, fit)
    scalar = direction == "backward" and found == "affine" and constant_scale(steps, fit)
    return Fold(
        id="", producer=ledger.location(producer), producer_op=producer.name,
        norm=ledger.location(norm), norm_op=norm.name,
        form="scale" if scalar else "batch_norm_inference" if fit.gamma_beta else "decomposed",
        direction=direction, channels=fit.channels, ops=[], function=function_name(producer),
        params=params, kernel_rounding=kernel_rounding, kind="scale" if scalar else found,
        note=(f"a constant scale {float(fit.scale[0]):.6g} ({_names(steps)} by a constant "
              f"scalar), into the kernel of the {producer.name.removeprefix('stablehlo.')} "
              f"before it" if scalar else ""),
    )


def constant_scale(steps: list[Step], fit: Affine) -> bool:
    """Whether the chain is a constant scalar scale (`y * 0.1`, `logits / cap`: every
    channel scaled by the same constant, no shift), what fold-scale calls a constant
    scale: the report says so (kind "scale") whichever pattern folds it."""
    scales = [s for s in steps if s.name not in LAYOUT]  # a transpose before it is no step
    return bool(scales) and all(s.name in ("stablehlo.multiply", "stablehlo.divide")
                                for s in scales) and \
        all_true(fit.shift == 0) and all_true(fit.scale == fit.scale[0]) and \
        abs(float(fit.scale[0])) != 1


def _names(steps: list[Step]) -> str:
    return " and ".join(dict.fromkeys(s.name.removeprefix("stablehlo.") for s in steps))


def kind(steps: list[Step], fit: Affine) -> str:
    """"normalization" for a chain that normalizes: a batch norm op, a variance under
    rsqrt/sqrt among its constants (the statistics that made it), or a shift with a scale
    that is not +-1 (`(x - mean) / std`); "affine" for the rest (a bias and a negate,
    a mean pool's divide)."""
    if any(s.name == "stablehlo.batch_norm_inference" for s in steps):
        return "normalization"
    if any_true(fit.shift != 0) and any_true(np.abs(fit.scale) != 1):
        return "normalization"  # checked before the walk of the constants: cheaper
    return "normalization" if has_variance(steps) else "affine"


class Copy(NamedTuple):
    """A fold's new kernel that does not replace its weight: the weight (an embedding table
    tied to the LM head) is also read elsewhere, so the module keeps it and the new kernel
    adds `bytes` (the size of its constant)."""

    bytes: int
    readers: tuple[str, ...]  # the other readers' op names (`stablehlo.gather`, `func.call`)

    def note(self) -> str:
        return (f"the weight is shared (also read by {', '.join(self.readers)}): the folded "
                f"kernel is a copy, +{self.bytes} bytes")


def copy_cost(rewrite: KernelRewrite, producers: Sequence[ir.Operation], analysis: Analysis
              ) -> Copy | None:
    """What folding into `rewrite`'s kernel copies: None when the constants behind the old
    kernel serve only `producers` (the new kernel replaces them), else the new kernel's size
    and the other readers, which keep the old constants alive."""
    kernel = rewrite.kernel
    others = kept_readers(kernel.value, producers, analysis)
    if not others:
        return None
    ty = ir.RankedTensorType((kernel.convert.operands[0] if kernel.convert is not None
                              else kernel.value).type)
    count = 1 if rewrite.rounded.splat else math.prod(ty.shape)
    return Copy(count * kernel.storage.itemsize, tuple(dict.fromkeys(others)))


def kept_readers(value: ir.Value, readers: Sequence[ir.Operation], analysis: Analysis
                 ) -> list[str]:
    """The ops (by name) other than `readers` that keep the constants `value` is computed
    from alive: live users of any value on the way (a tied table's gather, the other
    result of a call), and what keeps a helper on the way (`Analysis.keepers`)."""
    # ops compare by pointer but hash by wrapper: lists, not sets (a kernel's ops are few)
    path: list[ir.Operation] = []
    stack = [value]
    while stack:
        owner = defining_op(stack.pop())
        if owner is None or owner in path:
            continue
        path.append(owner)
        stack.extend(owner.operands)
    others: list[str] = []
    for op in path:
        for result in op.results:
            others += [u.name for u in analysis.live_users(result)
                       if u not in path and u not in list(readers)]
        if op.name == "func.call":  # a helper's weight: what keeps the helper keeps it
            others += analysis.keepers(op, path)
    return others


def record_copy(fold: Fold, copy: Copy | None) -> None:
    """Says in `fold`'s record that its kernel is a copy of a shared weight, and its cost."""
    if copy is None:
        return
    fold.copied_bytes += copy.bytes
    fold.shared_with = list(dict.fromkeys([*fold.shared_with, *copy.readers]))
    fold.note = f"{fold.note}; {copy.note()}" if fold.note else copy.note()

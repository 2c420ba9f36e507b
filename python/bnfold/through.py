"""A per-channel shift (or mean) of a producer's input, as it reaches the output.

`producer(x + t) - producer(x)` for a per-input-channel `t` is what forward
folding adds as a bias, what high-bias absorption moves into layer 2, and, with
`t` the mean of the input, what bias correction reads: without zero padding it
is one value per output channel, `sum(K * t)`; through zero padding or
`lhs_dilation` it varies near the borders (`bnfold.border`'s exact correction),
and its average over the output positions is the border share of each tap.

    %y = stablehlo.convolution(%x, %k) ...          // x + t in, y + Through(t) out
    %b = stablehlo.add %y, %bias_b                  // BiasAdds: the adds right after
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from bnfold import attributes, precision, producers
from bnfold.analysis import Analysis
from bnfold.constants import per_channel
from bnfold.ir import ir
from bnfold.refusal import Code, Refusal

if TYPE_CHECKING:  # imported where a shift meets zero padding (start-up time)
    from bnfold import border


class Through(NamedTuple):
    """A per-input-channel shift of a producer's activation, as it reaches the output: one
    value per output channel, or a correction that varies near the borders."""

    out_axis: int
    bias: np.ndarray | None = None
    correction: border.Correction | None = None

    @property
    def values(self) -> np.ndarray:
        return self.correction.table if self.correction is not None else self.bias  # type: ignore[return-value]

    def plus(self, bias: np.ndarray) -> Through:
        if self.correction is not None:
            return Through(self.out_axis, None, self.correction.add_bias(bias))
        assert self.bias is not None
        return Through(self.out_axis, self.bias + bias)


def shift_through(op: ir.Operation, mapping: producers.InputScaleMap, kernel: producers.Kernel,
                  shift: np.ndarray, padding: np.ndarray | None = None,
                  unpadded: ir.RankedTensorType | None = None) -> Through | Refusal:
    """`producer(x + t) - producer(x)` for a per-channel `t` of the activation, exactly.

    Without zero padding or lhs_dilation holes it is a bias, `sum(K * t)` per
    output channel; with them, output positions near a border see zeros for
    some taps and it is `bnfold.border`'s correction (one value per channel
    again when every position sees the same taps). `padding` replaces the
    convolution's own (an absorbed explicit pad, whose input type is `unpadded`)."""
    values = kernel_f64(kernel)
    if isinstance(values, Refusal):
        return values
    if op.name == "stablehlo.convolution":
        if attributes.reads_inserted_zeros(op, padding):
            padding = attributes.padding(op) if padding is None else padding
            return _border_shift(op, mapping, values, shift, padding, unpadded)
    found = shift_bias(op, mapping, values, shift)
    if isinstance(found, Refusal):
        return found
    bias, out_axis = found
    return Through(out_axis, bias)


def _border_shift(op: ir.Operation, mapping: producers.InputScaleMap, values: np.ndarray,
                  shift: np.ndarray, padding: np.ndarray,
                  unpadded: ir.RankedTensorType | None) -> Through | Refusal:
    """The shift through zero padding as an exact constant correction of the output."""
    from bnfold import border

    win = border.window(op, padding, unpadded)
    if isinstance(win, Refusal):
        return win.wrap("the shift cannot fold forward through zero padding")
    weighted = values * mapping.expand(shift, values.shape)
    limit = int(np.prod(values.shape)) + border.MARGIN_ELEMENTS
    corr = border.correction(op, win, weighted, limit)
    if isinstance(corr, Refusal):
        return corr.wrap("the shift cannot fold forward through zero padding")
    out_axis = producers.conv_dims(op).output_feature_dimension
    if corr.is_uniform:  # padding that every output position sees the same way
        return Through(out_axis, corr.table.reshape(-1))
    return Through(out_axis, None, corr)


def kernel_f64(kernel: producers.Kernel) -> np.ndarray | Refusal:
    """The kernel as the program computes with it (after any convert), in float64."""
    if kernel.values.shape != kernel.shape and \
            int(np.prod(kernel.shape)) > precision.MAX_EXPANDED_ELEMENTS:
        return Refusal(Code.LIMIT, "the kernel is a huge splat constant; refused to expand it "
                                   "for the shift")
    values = np.broadcast_to(kernel.values, kernel.shape).astype(np.float64)
    if kernel.convert is not None:
        values = values.astype(kernel.effective).astype(np.float64)
    return values


class BiasAdds(NamedTuple):
    """The bias adds right after the producer that the new bias merges into."""

    ops: tuple[ir.Operation, ...]
    bias: np.ndarray

    @property
    def root(self) -> ir.Operation:
        return self.ops[-1]


def shift_bias(op: ir.Operation, mapping: producers.InputScaleMap, values: np.ndarray,
                shift: np.ndarray) -> tuple[np.ndarray, int] | Refusal:
    """The output bias a per-input-channel shift produces (no padding), and its output axis."""
    t = mapping.expand(shift, values.shape)
    if op.name == "stablehlo.convolution":
        dims = producers.conv_dims(op)
        out_kernel = dims.kernel_output_feature_dimension
        axes = tuple(d for d in range(values.ndim) if d != out_kernel)
        return np.sum(values * t, axis=axes), dims.output_feature_dimension
    dot = producers.dot_dims(op)
    const_index = mapping.operand
    batching = dot.rhs_batching_dimensions if const_index == 1 else dot.lhs_batching_dimensions
    contracting = dot.rhs_contracting_dimensions if const_index == 1 else dot.lhs_contracting_dimensions
    free = [d for d in range(values.ndim) if d not in batching and d not in contracting]
    if batching or len(free) != 1:
        return Refusal(Code.AXIS, "the shift of a dot_general input folds only into a weight "
                                  "with one free dimension")
    axes = tuple(d for d in range(values.ndim) if d != free[0])
    bias = np.sum(values * t, axis=axes)
    # No batching dims here, so the result is (lhs free..., rhs free...) and the
    # weight's single free dim is the last axis (weight on the right) or the first.
    out_axis = ir.RankedTensorType(op.results[0].type).rank - 1 if const_index == 1 else 0
    return bias, out_axis


def bias_adds(result: ir.Value, out_axis: int, analysis: Analysis) -> BiasAdds | None:
    """The run of per-channel bias adds (and subtracts) right after the producer."""
    ops: list[ir.Operation] = []
    total: np.ndarray | None = None
    value = result
    while (user := analysis.sole_live_user(value)) is not None and \
            user.name in ("stablehlo.add", "stablehlo.subtract"):
        step = analysis.step(user)
        if step is None or step.x != value or step.parameter is not None or \
                (user.name == "stablehlo.subtract" and step.x_index != 0):
            break
        const = analysis.constant(user.operands[1 - step.x_index])
        vector = per_channel(const, out_axis) if const is not None else None
        if vector is None or isinstance(vector, Refusal):
            break
        vector = -vector if user.name == "stablehlo.subtract" else vector
        total = vector if total is None else total + vector
        ops.append(user)
        value = user.results[0]
    return BiasAdds(tuple(ops), total) if total is not None else None


def mean_through(op: ir.Operation, mapping: producers.InputScaleMap, values: np.ndarray,
                 mean: np.ndarray, padding: np.ndarray | None = None,
                 unpadded: ir.RankedTensorType | None = None) -> tuple[np.ndarray, int] | Refusal:
    """E[producer(x)] per output channel, averaged over the output positions, for an input
    whose channels have mean `mean` (zero padding, lhs_dilation holes: their border share),
    with `values` the kernel in float64; and the output axis. Linear: E[K x] = K E[x]."""
    if op.name == "stablehlo.convolution":
        from bnfold import border

        win = border.window(op, padding, unpadded)
        if isinstance(win, Refusal):
            return win
        weighted = values * mapping.expand(mean, values.shape)
        return border.mean_output(op, win, weighted), producers.conv_dims(op).output_feature_dimension
    return shift_bias(op, mapping, values, mean)

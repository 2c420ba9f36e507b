"""The exact output of a convolution whose input is a per-channel constant.

A forward fold moves `x * s + t` past a convolution: `conv(pad0(x * s + t), K)
== conv(pad0(x), K * s) + conv(pad0(T), K)`, where `T` holds `t[c]` at every
position of channel `c`. Without padding the second term is the usual bias,
`sum(K * t)`. With zero padding (or `lhs_dilation`) output positions near a
border see zeros for some taps, so the term varies along the spatial axes.

It is separable: output position `o` of spatial axis `d` sees tap `k` on real
data or on padding, `M_d[o, k]`, and

    C[o_1, .., o_n, f] = sum_k  W[k_1, .., k_n, f] * M_1[o_1, k_1] * .. * M_n[o_n, k_n]
    W[k, f]            = sum_c  K[k, c, f] * t[c]

Each `M_d` has few distinct rows (a few border rows and one interior row), so
`C` is stored as a small table over (row class of every axis, feature) and
rebuilt along each axis by slices, broadcasts and one concatenate, all exact:

    %c = stablehlo.constant dense<...> : tensor<3x3x8xf32>   // row classes x features
    %r0 = stablehlo.slice %c [0:1, 0:3, 0:8]                  // top border row
    %r1 = stablehlo.slice %c [1:2, 0:3, 0:8]                  // interior rows ...
    %b1 = stablehlo.broadcast_in_dim %r1, dims = [0, 1, 2] : (..) -> tensor<14x3x8xf32>
    %e = stablehlo.concatenate %r0, %b1, %r2, dim = 0 : tensor<16x3x8xf32>
    ...                                                       // then axis 1, then
    %C = stablehlo.broadcast_in_dim %e2, dims = [1, 2, 3]     // the batch axis

All sums run in float64 on the kernel as the program computes with it; the
caller rounds the table once.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from bnfold import attributes, producers
from bnfold.ir import ir, stablehlo
from bnfold.refusal import Code, Refusal

# The table may exceed the kernel's size by this many elements; above that the
# correction is refused (the shift then stays as an add before the convolution).
MARGIN_ELEMENTS = 4096
# Pieces per axis (runs of equal rows) built from slices; beyond that (a
# transposed convolution's periodic rows) the table holds the axis in full.
MAX_RUNS = 8


@dataclass(frozen=True)
class Window:
    """A convolution's window, per spatial axis, with StableHLO's defaults filled in."""

    input_sizes: tuple[int, ...]
    output_sizes: tuple[int, ...]
    kernel_sizes: tuple[int, ...]
    strides: tuple[int, ...]
    padding: tuple[tuple[int, int], ...]
    lhs_dilation: tuple[int, ...]
    rhs_dilation: tuple[int, ...]
    reversal: tuple[bool, ...]

    def taps(self, d: int) -> np.ndarray:
        """`M_d`: for output position o and tap k, whether the tap reads real input."""
        o = np.arange(self.output_sizes[d])[:, None]
        k = np.arange(self.kernel_sizes[d])[None, :]
        q = o * self.strides[d] + k * self.rhs_dilation[d] - self.padding[d][0]
        dil = self.lhs_dilation[d]
        return (q >= 0) & (q % dil == 0) & (q // dil < self.input_sizes[d])


def window(op: ir.Operation, padding: np.ndarray | None = None,
           lhs: ir.RankedTensorType | None = None) -> Window | Refusal:
    """The window of convolution `op`; `padding` and `lhs` (the input's type) replace
    its own when an explicit pad before it becomes its padding."""
    dims = producers.conv_dims(op)
    lhs = lhs or ir.RankedTensorType(op.operands[0].type)
    rhs = ir.RankedTensorType(op.operands[1].type)
    out = ir.RankedTensorType(op.results[0].type)
    spatial_in = list(dims.input_spatial_dimensions)
    spatial_out = list(dims.output_spatial_dimensions)
    spatial_k = list(dims.kernel_spatial_dimensions)
    if any(lhs.is_dynamic_dim(d) for d in spatial_in) or \
            any(out.is_dynamic_dim(d) for d in spatial_out):
        return Refusal(Code.SYMBOLIC, "the convolution's spatial size is not static")
    n = len(spatial_in)
    if padding is None:
        padding = attributes.padding(op)
    return Window(tuple(lhs.shape[d] for d in spatial_in), tuple(out.shape[d] for d in spatial_out),
                  tuple(rhs.shape[d] for d in spatial_k),
                  attributes.ints(op, "window_strides", default=1, rank=n),
                  tuple((int(lo), int(hi)) for lo, hi in padding),
                  attributes.ints(op, "lhs_dilation", default=1, rank=n),
                  attributes.ints(op, "rhs_dilation", default=1, rank=n),
                  attributes.bools(op, "window_reversal", rank=n))


@dataclass(frozen=True)
class Correction:
    """`C` as a table over row classes.

    `table` is [classes of spatial axis 1, .., classes of axis n, features] in
    float64; `runs[d]` lists (class, length) along output spatial axis d, or is
    empty when the table holds that axis in full.
    """

    table: np.ndarray
    runs: tuple[tuple[tuple[int, int], ...], ...]

    @property
    def is_uniform(self) -> bool:
        """Every output position sees the same taps: `C` is one value per feature (the
        kernel's sum when no tap reads padding)."""
        return all(len(r) == 1 for r in self.runs)

    def add_bias(self, bias: np.ndarray) -> Correction:
        return Correction(self.table + bias, self.runs)

    def expand(self, table: ir.Value) -> ir.Value:
        """The [spatial.., feature] tensor of `C` from its table, at the insertion point."""
        value = table
        for d, runs in enumerate(self.runs):
            if len(runs) <= 1:
                continue  # in full already, or one class (size 1: the final broadcast expands it)
            rows: dict[int, ir.Value] = {}  # one slice per class, however many runs use it
            pieces = []
            for cls, length in runs:
                if cls not in rows:
                    rows[cls] = _row(value, d, cls)
                pieces.append(_repeat(rows[cls], d, length))
            value = stablehlo.ConcatenateOp(pieces, d).result
        return value


def correction(op: ir.Operation, win: Window, weighted: np.ndarray,
               limit: int) -> Correction | Refusal:
    """`C` for `weighted` = K * t (float64, the kernel's shape), or why it is too large.

    `limit` bounds the table's elements."""
    dims = producers.conv_dims(op)
    spatial = list(dims.kernel_spatial_dimensions)
    order = spatial + [dims.kernel_input_feature_dimension, dims.kernel_output_feature_dimension]
    w = np.transpose(weighted, order).sum(axis=len(spatial))  # [k_1, .., k_n, f]
    flips = tuple(i for i, rev in enumerate(win.reversal) if rev)
    if flips:  # a reversed window applies tap k to kernel element size - 1 - k
        w = np.flip(w, axis=flips)
    tables: list[np.ndarray] = []
    runs: list[tuple[tuple[int, int], ...]] = []
    for d in range(len(spatial)):
        rows, inverse = np.unique(win.taps(d), axis=0, return_inverse=True)
        tables.append(rows.astype(np.float64))
        runs.append(_runs(inverse.reshape(-1)))
    table = w
    for d, rows in enumerate(tables):  # contract tap axis d with its row classes
        table = np.moveaxis(np.tensordot(rows, table, axes=([1], [d])), 0, d)
    for d, r in enumerate(runs):
        if len(r) > MAX_RUNS or len(r) == win.output_sizes[d]:
            # Rows vary too often to build from pieces: store the axis in full.
            index = np.concatenate([np.full(length, cls) for cls, length in r])
            table = np.take(table, index, axis=d)
            runs[d] = ()
    if table.size > limit:
        varies = " along the whole output" if any(not r for r in runs) else ""
        return Refusal(Code.PADDING, f"the border correction varies{varies} ({table.size} "
                                     f"constants, more than the kernel's size + {MARGIN_ELEMENTS})")
    return Correction(table, tuple(runs))


def mean_output(op: ir.Operation, win: Window, weighted: np.ndarray) -> np.ndarray:
    """`C` averaged over the output positions, per feature: each tap weighted by the share
    of positions at which it reads real input (its border share), exactly, without the
    table: the mean of a product of per-axis factors is the product of their means."""
    dims = producers.conv_dims(op)
    spatial = list(dims.kernel_spatial_dimensions)
    order = spatial + [dims.kernel_input_feature_dimension, dims.kernel_output_feature_dimension]
    w = np.transpose(weighted, order).sum(axis=len(spatial))  # [k_1, .., k_n, f]
    flips = tuple(i for i, rev in enumerate(win.reversal) if rev)
    if flips:
        w = np.flip(w, axis=flips)
    for d in range(len(spatial)):
        share = win.taps(d).mean(axis=0)  # per tap: the fraction of positions on real data
        w = np.tensordot(share, w, axes=([0], [0]))  # contracts the leading tap axis
    return np.asarray(w, dtype=np.float64).reshape(-1)


def _runs(classes: np.ndarray) -> tuple[tuple[int, int], ...]:
    """Run-length encoding of a row-class sequence."""
    starts = np.flatnonzero(np.r_[True, classes[1:] != classes[:-1]])
    lengths = np.diff(np.r_[starts, len(classes)])
    return tuple((int(classes[s]), int(n)) for s, n in zip(starts, lengths, strict=True))


def _row(value: ir.Value, axis: int, cls: int) -> ir.Value:
    shape = list(ir.RankedTensorType(value.type).shape)
    start, limit = [0] * len(shape), list(shape)
    start[axis], limit[axis] = cls, cls + 1
    return stablehlo.SliceOp(value, start, limit, [1] * len(shape)).result


def _repeat(row: ir.Value, axis: int, length: int) -> ir.Value:
    if length == 1:
        return row
    ty = ir.RankedTensorType(row.type)
    shape = list(ty.shape)
    shape[axis] = length
    out = ir.RankedTensorType.get(shape, ty.element_type)
    return stablehlo.BroadcastInDimOp(out, row, list(range(len(shape)))).result
